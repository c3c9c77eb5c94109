"""Training shapes-lm: the language model of the demo zoo (its tasks, phases and loop)."""
from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from analysis.framework.progress import Progress
from analysis.world import shapes_world as sw
from analysis.zoo.train.common import (
    LMConfig, collate, lm_tokenizer, lr_schedule, needle_training_example, shifted_loss,
)

# ---------------------------------------------------------------------------------------------
# shapes-lm


class LMTasks:
    """The seeded training stream of shapes-lm, with the needle curriculum state."""

    def __init__(self, cfg: LMConfig, seed_offset: int = 0):
        self.cfg = cfg
        self.fraction = 0.0  # of the current phase, set by the training loop
        self.rng = random.Random(cfg.seed + seed_offset)
        self.stage = 0
        self.recent: list[float] = []
        self.scene_seeds = iter(sw.split_seeds("train", sw.SPLIT_SIZE))

    def needle_setting(self) -> tuple[int, int]:
        stages = self.cfg.needle_stages
        if self.stage < len(stages):
            return stages[self.stage]
        lo, hi = self.cfg.needle_final_lengths
        return self.rng.randint(1, 4), self.rng.randint(lo, hi)

    def report_needle(self, acc: float) -> None:
        self.recent = (self.recent + [acc])[-10:]
        if self.stage < len(self.cfg.needle_stages) and len(self.recent) == 10 and sum(self.recent) / 10 > 0.9:
            self.stage += 1
            self.recent = []

    def batch(self, task: str) -> list[tuple[str, str]]:
        cfg, rng = self.cfg, self.rng
        if task == "max":
            return [sw.max_retrieval_example(rng, rng.randint(2, cfg.max_n)) for _ in range(cfg.batch)]
        if task == "needle":
            n, length = self.needle_setting()
            return [needle_training_example(rng, length, n) for _ in range(cfg.needle_batch)]
        scenes = [sw.generate_scene(next(self.scene_seeds)) for _ in range(cfg.text_batch)]
        if task == "decompose":
            out = []
            for s in scenes:  # half the captions carry hallucinated objects, as captioners' do
                if rng.random() < 0.5:
                    s = sw.hallucinate(s, rng)
                out.append(sw.decompose_example(s))
            return out
        return [sw.rewrite_example(s, rng) for s in scenes]


def build_lm(cfg: LMConfig, tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=cfg.max_positions, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False,
        attn_implementation="eager",
    )
    return LlamaForCausalLM(config)


LM_TASKS = ("max", "needle", "decompose", "rewrite", "decompose", "rewrite")  # one cycle of steps


@dataclass
class LMPhase2:
    """Second phase: the needle curriculum of phase 1 advances too slowly alongside the text tasks,
    so this phase walks needle lengths up on a fixed schedule (1-4 needles each), keeping the other
    tasks in the mix so they are not forgotten."""

    steps: int = 1200
    lr: float = 1e-3
    warmup: int = 20
    cycle: tuple = ("needle", "needle", "max", "decompose", "rewrite", "needle")
    lengths: tuple = ((0.0, 64), (0.15, 128), (0.3, 256))  # (from fraction of steps, length)
    final_from: float = 0.45  # afterwards lengths are drawn from LMConfig.needle_final_lengths
    seed: int = 2


# Later phases, in order. The third spends its steps on the two long-output text tasks. The fourth to
# ninth (added later, each run on the previous phase's saved weights, which is what `build` does in
# memory) weight rewrite and needle retrieval, the tasks furthest below their bars. Held-out effect
# after phases 3 / 4 / 5 / 6 / 7 / 8 / 9: rewrite exact 58.0 / 70.5 / 80.5 / 86.5 / 88.0 / 89.5 / 90.5 %;
# needle recall at 256 tokens 75 / 79 / 95 / 95 / 96 / 97 / 96 %; decomposition 90.5 / 91.5 / 99.5 / 100
# (from phase 6 on) %; max retrieval at n = 4 94.0 / 96.0 / 97.5 / 99.0 / 98.5 / 99.0 / 99.5 %.
LM_PHASES = (
    LMPhase2(),
    LMPhase2(steps=1500, lr=8e-4, cycle=("decompose", "rewrite", "needle", "decompose", "rewrite", "max"),
             lengths=((0.0, 256),), final_from=0.0, seed=3),
    LMPhase2(steps=1500, lr=5e-4, cycle=("rewrite", "needle", "rewrite", "decompose", "rewrite", "max"),
             lengths=((0.0, 256),), final_from=0.0, seed=4),
    LMPhase2(steps=3000, lr=4e-4, cycle=("rewrite", "needle", "rewrite", "needle", "decompose", "max"),
             lengths=((0.0, 256),), final_from=0.0, seed=5),
    LMPhase2(steps=3000, lr=3e-4, cycle=("rewrite", "rewrite", "needle", "rewrite", "decompose", "max"),
             lengths=((0.0, 256),), final_from=0.0, seed=6),
    LMPhase2(steps=3000, lr=3e-4, cycle=("rewrite", "rewrite", "rewrite", "needle", "decompose", "max"),
             lengths=((0.0, 256),), final_from=0.0, seed=7),
    LMPhase2(steps=3000, lr=2e-4, cycle=("rewrite", "rewrite", "rewrite", "needle", "rewrite", "decompose", "max"),
             lengths=((0.0, 256),), final_from=0.0, seed=8),
    LMPhase2(steps=3000, lr=1.5e-4, cycle=("rewrite", "rewrite", "rewrite", "needle", "rewrite", "decompose", "max"),
             lengths=((0.0, 256),), final_from=0.0, seed=9),
)
SMOKE_LM_PHASES = (LMPhase2(steps=4),)


class ScheduledNeedles(LMTasks):
    def __init__(self, cfg: LMConfig, phase: LMPhase2):
        super().__init__(cfg, seed_offset=phase.seed)
        self.phase = phase
        self.fraction = 0.0
        self.stage = len(cfg.needle_stages)
        # scenes continue after phase 1's (phase 1 uses at most steps * text_batch of them)
        first = cfg.steps * cfg.text_batch + (phase.seed - 2) * 1_000_000
        self.scene_seeds = iter(sw.split_seeds("train", sw.SPLIT_SIZE)[first:])

    def needle_setting(self) -> tuple[int, int]:
        n = self.rng.randint(1, 4)
        if self.fraction >= self.phase.final_from:
            return n, self.rng.randint(*self.cfg.needle_final_lengths)
        length = [length for start, length in self.phase.lengths if self.fraction >= start][-1]
        return n, length


def _run_lm_phase(model, tok, tasks: LMTasks, cycle: tuple, steps: int, lr: float, warmup: int,
                  label: str, progress: Progress | None) -> float:
    model.config._attn_implementation = "sdpa"  # training speed; the saved config says eager
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    acc = dict.fromkeys(cycle, 0.0)
    start = time.time()
    for step in range(steps):
        task = cycle[step % len(cycle)]
        tasks.fraction = step / steps
        ids, mask, labels = collate(tok, tasks.batch(task))
        for g in opt.param_groups:
            g["lr"] = lr * lr_schedule(step, steps, warmup)
        logits = model(input_ids=ids, attention_mask=mask).logits
        loss, exact = shifted_loss(logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc[task] = 0.9 * acc[task] + 0.1 * exact.mean().item()
        if task == "needle":
            tasks.report_needle(exact.mean().item())
        if progress and (step % 50 == 0 or step == steps - 1):
            progress((step + 1) / steps,
                     f"shapes-lm {label} step {step + 1}/{steps} loss {loss.item():.3f} "
                     + " ".join(f"{k} {v:.2f}" for k, v in acc.items())
                     + f" needle stage {tasks.stage} {time.time() - start:.0f}s")
    model.config._attn_implementation = "eager"
    model.eval()
    return time.time() - start


def train_lm(cfg: LMConfig, out: Path, progress: Progress | None = None,
             phases: tuple = LM_PHASES) -> dict:
    tok = lm_tokenizer()
    model = build_lm(cfg, tok)
    tasks = LMTasks(cfg)
    torch.set_num_threads(lm_threads(cfg, 1))
    seconds = _run_lm_phase(model, tok, tasks, LM_TASKS, cfg.steps, cfg.lr, cfg.warmup, "phase 1", progress)
    log = {"steps": cfg.steps, "seconds": round(seconds, 1), "needle_stage_after_phase1": tasks.stage,
           "config": dataclasses.asdict(cfg)}
    for i, phase in enumerate(phases, start=2):
        torch.set_num_threads(lm_threads(cfg, i))
        threads = torch.get_num_threads()
        label = f"phase {i}" + (f" ({threads} threads)" if threads > 1 else "")
        log[f"phase{i}"] = continue_lm(model, tok, cfg, phase, progress, label=label)
        log[f"phase{i}"]["threads"] = threads
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return log


def lm_threads(cfg: LMConfig, phase: int) -> int:
    """CPU threads of LM training phase `phase` (1-based): part of the recipe, see LMConfig.late_phase."""
    return cfg.late_threads if phase >= cfg.late_phase else 1


def continue_lm(model, tok, cfg: LMConfig, phase: LMPhase2, progress: Progress | None = None,
                label: str = "phase 2") -> dict:
    tasks = ScheduledNeedles(cfg, phase)
    seconds = _run_lm_phase(model, tok, tasks, phase.cycle, phase.steps, phase.lr, phase.warmup, label, progress)
    return {"steps": phase.steps, "seconds": round(seconds, 1), "config": dataclasses.asdict(phase)}

"""Train the demo zoo from scratch: `shapes-lm`, `shapes-vlm` and the weak captioner `shapes-vlm-weak`.

Everything is seeded (Python `random` per task, `torch.manual_seed` per model), so a rebuild on the
same machine reproduces the committed weights up to floating-point summation order. The configs at
the top are the recipe; `SMOKE` shrinks them to a run of a few seconds for the test suite.
"""
from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from analysis.tiny_models import make_word_tokenizer
from analysis.zoo import shapes_world as sw

Progress = Callable[[float, str], None]
IMAGE_TOKEN = "<image>"


@dataclass
class LMConfig:
    layers: int = 4
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    max_positions: int = 1024
    steps: int = 4000
    lr: float = 2.5e-3
    warmup: int = 50
    batch: int = 32
    text_batch: int = 16  # decomposition / rewrite rows per step
    needle_batch: int = 16
    max_n: int = 16  # max retrieval trained on n <= max_n only
    # needle curriculum: (needles, length) stages, advance when the running accuracy passes 0.9
    needle_stages: tuple = ((1, 32), (2, 64), (4, 64), (4, 128), (4, 256))
    needle_final_lengths: tuple = (128, 384)
    seed: int = 0


@dataclass
class VLMConfig:
    image_size: int = 64
    patch: int = 8
    vision_hidden: int = 128
    vision_layers: int = 3
    hidden: int = 128
    layers: int = 3
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    vision_steps: int = 400  # patch-attribute pretraining of the vision tower (see pretrain_vision)
    vision_batch: int = 64
    vision_lr_scale: float = 0.3  # the pretrained tower then trains slower than the rest
    steps: int = 2000
    weak_step: int = 300  # the checkpoint saved as shapes-vlm-weak (captions still hallucinate)
    lr: float = 2e-3
    warmup: int = 50
    batch_captions: int = 8
    batch_questions: int = 8  # rows (images) of questions
    questions_per_image: int = 6
    seed: int = 0


SMOKE_LM = LMConfig(layers=1, hidden=32, intermediate=64, steps=6, batch=4, text_batch=2, needle_batch=2,
                    needle_stages=((1, 32),), needle_final_lengths=(32, 48), max_positions=256)
SMOKE_VLM = VLMConfig(vision_hidden=32, hidden=32, layers=1, vision_layers=1, intermediate=64, steps=4,
                      weak_step=2, batch_captions=2, batch_questions=2, questions_per_image=2,
                      vision_steps=2, vision_batch=2)


def lm_tokenizer():
    return make_word_tokenizer(list(sw.VOCAB))


def vlm_tokenizer():
    return make_word_tokenizer(list(sw.VOCAB), extra_special=[IMAGE_TOKEN])


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _schedule(step: int, steps: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def collate(tok, pairs: list, eos: bool = True):
    """Examples -> right-padded input_ids, attention_mask, labels (loss on answer tokens only).

    An example is (prompt, answer) or a list of (text, is_answer) segments; "</s>" ends the last answer.
    """
    rows, labels = [], []
    for example in pairs:
        segments = [(example[0], False), (example[1], True)] if isinstance(example, tuple) else example
        row: list[int] = []
        lab: list[int] = []
        for text, is_answer in segments:
            ids = encode(tok, text)
            row += ids
            lab += ids if is_answer else [-100] * len(ids)
        if eos:
            row.append(tok.eos_token_id)
            lab.append(tok.eos_token_id)
        rows.append(row)
        labels.append(lab)
    width = max(map(len, rows))
    pad = tok.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return ids, mask, lab


def needle_training_example(rng: random.Random, length: int, n_needles: int) -> list[tuple[str, bool]]:
    """A needle prompt whose needles are then all asked in turn: "... query k2 = 57 query k0 = 9"."""
    prompt, answer, _ = sw.needle_example(rng, length, n_needles)
    words = prompt.split()
    body = words[:-3]
    values = {w: body[i + 1] for i, w in enumerate(body[:-1]) if w in sw.KEYS}
    order = [k for k in values if k != words[-2]]
    rng.shuffle(order)
    segments = [(prompt, False), (answer, True)]
    for key in order:
        segments += [(f"query {key} =", False), (values[key], True)]
    return segments


def shifted_loss(logits, labels):
    """Next-token loss and per-row 'every answer token right' (teacher forcing == greedy exact match)."""
    logits, labels = logits[:, :-1], labels[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    with torch.no_grad():
        right = (logits.argmax(-1) == labels) | (labels == -100)
        exact = right.all(dim=1).float()
    return loss, exact


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


# Later phases, in order. The third spends its steps on the two long-output text tasks.
LM_PHASES = (
    LMPhase2(),
    LMPhase2(steps=1500, lr=8e-4, cycle=("decompose", "rewrite", "needle", "decompose", "rewrite", "max"),
             lengths=((0.0, 256),), final_from=0.0, seed=3),
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
            g["lr"] = lr * _schedule(step, steps, warmup)
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
    seconds = _run_lm_phase(model, tok, tasks, LM_TASKS, cfg.steps, cfg.lr, cfg.warmup, "phase 1", progress)
    log = {"steps": cfg.steps, "seconds": round(seconds, 1), "needle_stage_after_phase1": tasks.stage,
           "config": dataclasses.asdict(cfg)}
    for i, phase in enumerate(phases, start=2):
        log[f"phase{i}"] = continue_lm(model, tok, cfg, phase, progress, label=f"phase {i}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return log


def continue_lm(model, tok, cfg: LMConfig, phase: LMPhase2, progress: Progress | None = None,
                label: str = "phase 2") -> dict:
    tasks = ScheduledNeedles(cfg, phase)
    seconds = _run_lm_phase(model, tok, tasks, phase.cycle, phase.steps, phase.lr, phase.warmup, label, progress)
    return {"steps": phase.steps, "seconds": round(seconds, 1), "config": dataclasses.asdict(phase)}


# ---------------------------------------------------------------------------------------------
# shapes-vlm


def build_vlm(cfg: VLMConfig, tok):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(cfg.seed)
    vision = CLIPVisionConfig(
        image_size=cfg.image_size, patch_size=cfg.patch, hidden_size=cfg.vision_hidden,
        intermediate_size=cfg.vision_hidden * 2, num_hidden_layers=cfg.vision_layers, num_attention_heads=4,
        projection_dim=cfg.vision_hidden,
    )
    text = LlamaConfig(
        vocab_size=len(tok), hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=512, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, tie_word_embeddings=False,
    )
    config = LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="default", vision_feature_layer=-1, attn_implementation="eager",
    )
    return LlavaForConditionalGeneration(config)


def make_processor(cfg: VLMConfig, tok):
    from transformers import CLIPImageProcessor, LlavaProcessor

    image_processor = CLIPImageProcessor(
        size={"shortest_edge": cfg.image_size}, crop_size={"height": cfg.image_size, "width": cfg.image_size},
    )
    return LlavaProcessor(
        image_processor=image_processor, tokenizer=tok, patch_size=cfg.patch,
        vision_feature_select_strategy="default", num_additional_image_tokens=1, image_token=IMAGE_TOKEN,
    )


def pixel_tensor(images, processor) -> torch.Tensor:
    """Same normalisation as the CLIP image processor (images are already image_size square)."""
    import numpy as np

    ip = processor.image_processor
    arr = torch.from_numpy(np.stack([np.asarray(im, dtype=np.float32) for im in images])) / 255.0
    mean, std = torch.tensor(ip.image_mean), torch.tensor(ip.image_std)
    return ((arr - mean) / std).permute(0, 3, 1, 2).contiguous()


def vlm_ids(tok, prompt: str, n_image_tokens: int) -> list[int]:
    ids = encode(tok, prompt)
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    out: list[int] = []
    for i in ids:
        out += [image_id] * n_image_tokens if i == image_id else [i]
    return out


def vlm_collate(tok, n_image_tokens: int, examples: list):
    """Like `collate`, with "<image>" expanded to the image tokens."""
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    ids, mask, labels = collate(tok, examples)
    rows = []
    for r in range(ids.shape[0]):
        row, lab = [], []
        for i, l in zip(ids[r].tolist(), labels[r].tolist()):
            n = n_image_tokens if i == image_id else 1
            row += [i] * n
            lab += [l] * n
        rows.append((row, lab, int(mask[r].sum()) + (n_image_tokens - 1) * row.count(image_id) // n_image_tokens))
    width = max(len(r) for r, _, _ in rows)
    out_ids = torch.full((len(rows), width), tok.pad_token_id)
    out_mask = torch.zeros((len(rows), width), dtype=torch.long)
    out_lab = torch.full((len(rows), width), -100)
    for k, (row, lab, length) in enumerate(rows):
        out_ids[k, :len(row)] = torch.tensor(row)
        out_lab[k, :len(lab)] = torch.tensor(lab)
        out_mask[k, :length] = 1
    return out_ids, out_mask, out_lab


def question_row(scene: sw.Scene, rng: random.Random, k: int) -> list[tuple[str, bool]]:
    """k balanced yes/no questions about one image in one row; the first uses the exact inference
    prompt, the rest follow as " question : ... answer :" (more supervision per image forward)."""
    segments: list[tuple[str, bool]] = []
    for i, claim in enumerate(sw.question_set(scene, rng, k)):
        prompt = sw.vlm_question_prompt(claim.text) if i == 0 else f"question : {sw.question(claim.text)} answer :"
        segments += [(prompt, False), (sw.vlm_answer(claim.truth), True)]
    return segments


def vlm_batch(cfg: VLMConfig, rng: random.Random, seeds, processor, n_image_tokens: int):
    """Caption rows for some scenes, rows of balanced yes/no questions for others."""
    tok = processor.tokenizer
    images, examples = [], []
    for _ in range(cfg.batch_captions):
        scene = sw.generate_scene(next(seeds))
        images.append(sw.render(scene, cfg.image_size))
        examples.append((sw.VLM_CAPTION_PROMPT, sw.caption(scene)))
    for _ in range(cfg.batch_questions):
        scene = sw.generate_scene(next(seeds))
        images.append(sw.render(scene, cfg.image_size))
        examples.append(question_row(scene, rng, cfg.questions_per_image))
    ids, mask, labels = vlm_collate(tok, n_image_tokens, examples)
    return pixel_tensor(images, processor), ids, mask, labels


def patch_labels(scene: sw.Scene, image_size: int, patch: int) -> torch.Tensor:
    """(patches, 4) targets per patch, row-major: colour, shape, size, cell (0 = no object there).

    A patch belongs to the object covering most of its pixels, if that is at least 6 pixels.
    """
    mask = sw.object_mask(scene, image_size)
    grid = image_size // patch
    out = torch.zeros(grid * grid, 4, dtype=torch.long)
    for k in range(grid * grid):
        r, c = divmod(k, grid)
        block = mask[r * patch:(r + 1) * patch, c * patch:(c + 1) * patch].ravel()
        counts = [(block == i + 1).sum() for i in range(len(scene.objects))]
        if counts and max(counts) >= 6:
            o = scene.objects[max(range(len(counts)), key=counts.__getitem__)]
            out[k] = torch.tensor([1 + sw.COLOURS.index(o.colour), 1 + sw.SHAPES.index(o.shape),
                                   1 + sw.SIZES.index(o.size), 1 + o.cell])
    return out


def pretrain_vision(model, cfg: VLMConfig, processor, progress: Progress | None = None) -> dict:
    """Teach the vision tower what is in each patch (colour, shape, size, cell) with linear probes on
    the features LLaVA reads (last hidden state). Trained from scratch inside LLaVA only, the tower
    stayed unused for 1,300+ steps on CPU (the LM settled on caption priors); pretrained this way,
    as CLIP towers are pretrained before LLaVA training, grounding starts at once. The probes are
    thrown away; only the tower's weights remain."""
    tower = model.model.vision_tower
    sizes = (1 + len(sw.COLOURS), 1 + len(sw.SHAPES), 1 + len(sw.SIZES), 10)
    heads = torch.nn.Linear(cfg.vision_hidden, sum(sizes))
    params = list(tower.parameters()) + list(heads.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    seeds = iter(sw.split_seeds("train", sw.SPLIT_SIZE)[8_000_000:])
    acc = 0.0
    start = time.time()
    for step in range(cfg.vision_steps):
        scenes = [sw.generate_scene(next(seeds)) for _ in range(cfg.vision_batch)]
        pixels = pixel_tensor([sw.render(s, cfg.image_size) for s in scenes], processor)
        labels = torch.stack([patch_labels(s, cfg.image_size, cfg.patch) for s in scenes])
        for g in opt.param_groups:
            g["lr"] = cfg.lr * _schedule(step, cfg.vision_steps, 20)
        feats = tower(pixels, output_hidden_states=True).hidden_states[cfg_feature_layer(model)][:, 1:]
        logits = heads(feats).split(sizes, dim=-1)
        loss = sum(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), labels[..., i].reshape(-1))
                   for i, lg in enumerate(logits))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            right = torch.stack([lg.argmax(-1) == labels[..., i] for i, lg in enumerate(logits)], -1).all(-1)
            acc = 0.9 * acc + 0.1 * right.float().mean().item()
        if progress and (step % 25 == 0 or step == cfg.vision_steps - 1):
            progress((step + 1) / cfg.vision_steps, f"shapes-vlm vision pretraining step {step + 1}/"
                     f"{cfg.vision_steps} loss {loss.item():.3f} patch accuracy {acc:.3f} {time.time() - start:.0f}s")
    return {"steps": cfg.vision_steps, "patch_accuracy": round(acc, 4), "seconds": round(time.time() - start, 1)}


def cfg_feature_layer(model) -> int:
    return int(model.config.vision_feature_layer)


@dataclass
class VLMPhase2:
    """Single-question rows. In phase 1 the later questions of a row can be answered from the
    earlier ones ("is the red circle small ? no" gives away "is the red circle large ?"), and the
    model learned that shortcut instead of looking; here every row is one question, as at inference."""

    steps: int = 400
    lr: float = 1e-3
    warmup: int = 20
    batch_captions: int = 8
    batch_questions: int = 24
    seed: int = 3


# Later phases, in order; the third is a longer push on single questions.
VLM_PHASES = (VLMPhase2(), VLMPhase2(steps=900, lr=2e-3, batch_captions=4, batch_questions=28, seed=4))
SMOKE_VLM_PHASES = (VLMPhase2(steps=2, batch_captions=1, batch_questions=2),)


def _vlm_steps(model, processor, cfg: VLMConfig, steps: int, lr: float, warmup: int, rng, seeds,
               label: str, progress: Progress | None, on_step: Callable[[int], None] | None = None) -> float:
    tok = processor.tokenizer
    n_image_tokens = (cfg.image_size // cfg.patch) ** 2
    tower = set(id(p) for p in model.model.vision_tower.parameters())
    groups = [{"params": [p for p in model.parameters() if id(p) in tower], "scale": cfg.vision_lr_scale},
              {"params": [p for p in model.parameters() if id(p) not in tower], "scale": 1.0}]
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    acc_cap = acc_q = 0.0
    start = time.time()
    for step in range(steps):
        pixels, ids, mask, labels = vlm_batch(cfg, rng, seeds, processor, n_image_tokens)
        for g in opt.param_groups:
            g["lr"] = lr * g["scale"] * _schedule(step, steps, warmup)
        logits = model(input_ids=ids, attention_mask=mask, pixel_values=pixels).logits
        loss, exact = shifted_loss(logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc_cap = 0.9 * acc_cap + 0.1 * exact[: cfg.batch_captions].mean().item()
        with torch.no_grad():
            lab = labels[cfg.batch_captions:, 1:]
            answer = (lab != -100) & (lab != tok.eos_token_id)
            pred = logits[cfg.batch_captions:, :-1].argmax(-1)
            acc_q = 0.9 * acc_q + 0.1 * ((pred == lab) & answer).sum().item() / max(1, answer.sum().item())
        if on_step is not None:
            on_step(step + 1)
        if progress and (step % 25 == 0 or step == steps - 1):
            progress((step + 1) / steps,
                     f"shapes-vlm {label} step {step + 1}/{steps} loss {loss.item():.3f} caption exact "
                     f"{acc_cap:.2f} yes/no {acc_q:.2f} {time.time() - start:.0f}s")
    return time.time() - start


def train_vlm(cfg: VLMConfig, out: Path, weak_out: Path | None, progress: Progress | None = None,
              phases: tuple = VLM_PHASES) -> dict:
    tok = vlm_tokenizer()
    processor = make_processor(cfg, tok)
    model = build_vlm(cfg, tok)
    _set_attention(model, "sdpa")  # training speed; the saved config says eager
    model.train()
    vision_log = pretrain_vision(model, cfg, processor, progress)
    rng = random.Random(cfg.seed + 1)
    seeds = iter(sw.split_seeds("train", sw.SPLIT_SIZE)[5_000_000:])  # disjoint from the LM's scenes

    def save_weak(step: int) -> None:
        if weak_out is not None and step == cfg.weak_step:
            _save_vlm(model, processor, weak_out)

    seconds = _vlm_steps(model, processor, cfg, cfg.steps, cfg.lr, cfg.warmup, rng, seeds, "phase 1",
                         progress, save_weak)
    log = {"steps": cfg.steps, "weak_step": cfg.weak_step, "seconds": round(seconds, 1),
           "vision_pretraining": vision_log, "config": dataclasses.asdict(cfg)}
    for i, phase in enumerate(phases, start=2):
        log[f"phase{i}"] = continue_vlm(model, processor, cfg, phase, progress, label=f"phase {i}")
    _save_vlm(model, processor, out)
    return log


def continue_vlm(model, processor, cfg: VLMConfig, phase: VLMPhase2, progress: Progress | None = None,
                 label: str = "phase 2") -> dict:
    _set_attention(model, "sdpa")
    model.train()
    rows = dataclasses.replace(cfg, batch_captions=phase.batch_captions, batch_questions=phase.batch_questions,
                               questions_per_image=1)
    rng = random.Random(phase.seed)
    seeds = iter(sw.split_seeds("train", sw.SPLIT_SIZE)[7_000_000 + (phase.seed - 3) * 500_000:])
    seconds = _vlm_steps(model, processor, rows, phase.steps, phase.lr, phase.warmup, rng, seeds, label, progress)
    return {"steps": phase.steps, "seconds": round(seconds, 1), "config": dataclasses.asdict(phase)}


def _set_attention(model, name: str) -> None:
    for cfg in (model.config, model.config.text_config, model.config.vision_config):
        cfg._attn_implementation = name


def _save_vlm(model, processor, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    _set_attention(model, "eager")
    model.save_pretrained(out)
    processor.save_pretrained(out)
    _set_attention(model, "sdpa")
    model.train(was_training)

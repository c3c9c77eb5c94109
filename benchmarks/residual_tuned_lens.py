"""The shipped tuned lenses against an independent re-implementation of the tuned-lens repository's recipe.

    OMP_NUM_THREADS=1 python benchmarks/residual_tuned_lens.py [--models shapes-lm smollm2-135m-instruct]

For each zoo model with a shipped lens (analysis/zoo/lenses/NAME, trained by analysis/zoo/train/tuned_lens.py),
the recipe is run again here, written from the repository (AlignmentResearch/tuned-lens, scripts/train_loop.py,
scripts/ingredients.py, nn/lenses.py) and not from our trainer: a zero-initialised `torch.nn.Linear(d, d)` per
state added to the state, HF's own `hidden_states` and `logits` (output_hidden_states=True) for the states and the
final distribution, the model's `norm` and `lm_head` for the readout, KL(final || lens) averaged over tokens and
back-propagated state by state, `clip_grad_norm_(1.0)`, `torch.optim.SGD(nesterov=True, momentum=0.9,
weight_decay=1e-3)`, the step decaying linearly to zero. Same training tokens, same number of steps and tokens per
step, the shipped lens's own step size (its per-model choice); its own draws of the tokens of each step.

Both are measured here, by this file's readout, on the same held-out text: per state, the mean KL of the logit
lens, the reference lens and the shipped lens, and the shipped lens's ratio to the reference (goal: <= 1.3 at
every state). Writes benchmarks/results/residual_tuned_lens.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS, ROOT  # noqa: E402  (every project path comes from analysis/framework/paths.py)

from analysis.model_access.models import ModelSpec, load_model  # noqa: E402
from analysis.residual.translators import META, folder_for, load  # noqa: E402
from analysis.zoo.train import tuned_lens as T  # noqa: E402

GOAL = 1.3


def hidden_and_final(lm, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's hidden states 0..L-1 of every token (L, N, D) and the model's own log-probabilities (N, V)."""
    hs, finals = [], []
    with torch.no_grad():
        for ids in sequences:
            out = lm(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
            hs.append(torch.stack(out.hidden_states[:-1])[:, 0].float())
            finals.append(torch.log_softmax(out.logits[0].float(), -1))
    return torch.cat(hs, 1), torch.cat(finals, 0)


def lens_logp(lm, h: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(lm.lm_head(lm.model.norm(h)).float(), -1)


def reference_lens(lm, hidden: torch.Tensor, final: torch.Tensor, steps: int, batch: int, lr: float,
                   seed: int = 1234) -> torch.nn.ModuleList:
    n_states, n, d = hidden.shape
    translators = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(n_states))
    for t in translators:
        torch.nn.init.zeros_(t.weight)
        torch.nn.init.zeros_(t.bias)
    opt = torch.optim.SGD(translators.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: max(0.0, (steps - k) / steps))
    gen = torch.Generator().manual_seed(seed)
    for p in lm.parameters():
        p.requires_grad_(False)
    for _ in range(steps):
        pick = torch.randint(0, n, (batch,), generator=gen)
        target = final[pick]
        for i, t in enumerate(translators):
            h = hidden[i, pick]
            kl = (target.exp() * (target - lens_logp(lm, h + t(h)))).sum(-1).mean()
            kl.backward()
        torch.nn.utils.clip_grad_norm_(translators.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        sched.step()
    return translators


def mean_kl(lm, hidden: torch.Tensor, final: torch.Tensor, translate) -> list[float]:
    out = []
    with torch.no_grad():
        for i in range(hidden.shape[0]):
            logp = lens_logp(lm, translate(i, hidden[i]))
            out.append(float((final.exp() * (final - logp)).sum(-1).mean()))
    return out + [0.0]  # state L: every lens reads the model's own output


def corpora(handle, name: str) -> tuple[list[list[int]], dict[str, list[list[int]]]]:
    """The shipped lens's training tokens and held-out sets (analysis/zoo/train/tuned_lens.py's)."""
    if name == "shapes-lm":
        return (T.shapes_corpus(handle.tokenizer, "train", 400, seed=0),
                {"Shapes World test split": T.shapes_corpus(handle.tokenizer, "test", 100, seed=1)})
    train, held = T.cached_corpus(handle, name)
    return train, {"model samples, held-out openers": held[:8],
                   "Python stdlib docstrings (human-written)": T.windows(handle.tokenizer, T.stdlib_text(), 64, 8)}


def reference_for(lm, name: str, train_seq, steps: int, batch: int, lr: float) -> tuple[torch.nn.ModuleList, float]:
    """The reference lens and its training's CPU seconds, kept under .model_inspector/ (it only depends on these
    settings: `--reference-only` trains it while the shipped lens is still training)."""
    path = ROOT / ".model_inspector" / f"tuned_lens_reference_{name}_{steps}x{batch}_lr{lr:g}.pt"
    if path.is_file():
        saved = torch.load(path)
        d = saved["state"]["0.weight"].shape[0]
        ref = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(len(saved["state"]) // 2))
        ref.load_state_dict(saved["state"])
        return ref, saved["cpu"]
    hidden, final = hidden_and_final(lm, train_seq)
    t0 = time.process_time()
    ref = reference_lens(lm, hidden, final, steps, batch, lr)
    cpu = time.process_time() - t0
    path.parent.mkdir(exist_ok=True)
    torch.save({"state": ref.state_dict(), "cpu": cpu}, path)
    return ref, cpu


def compare(name: str, lr: float | None = None, steps: int | None = None, batch: int | None = None) -> dict | None:
    """The comparison (None with `lr` given: only the reference is trained)."""
    handle = load_model(ModelSpec.parse(f"zoo:{name}"))
    lm = handle.language_model
    train_seq, held_sets = corpora(handle, name)
    if lr is not None:
        reference_for(lm, name, train_seq, steps, batch, lr)
        return None
    folder = folder_for(name)
    meta = json.loads((folder / META).read_text())
    shipped = load(folder)
    recipe = meta["recipe"]
    ref, cpu = reference_for(lm, name, train_seq, recipe["steps"], recipe["batch_tokens"], recipe["lr"])
    out = {"steps": recipe["steps"], "batch_tokens": recipe["batch_tokens"], "lr": recipe["lr"],
           "reference_cpu_seconds": round(cpu, 1), "held_out": {}}
    for label, seqs in held_sets.items():
        h, f = hidden_and_final(lm, seqs)
        logit = mean_kl(lm, h, f, lambda i, x: x)
        reference = mean_kl(lm, h, f, lambda i, x: x + ref[i](x))
        ours = mean_kl(lm, h, f, shipped.apply)
        ratio = [o / r if r > 1e-9 else 1.0 for o, r in zip(ours[:-1], reference[:-1])]
        out["held_out"][label] = {"tokens": h.shape[1], "logit": logit, "reference": reference, "shipped": ours,
                                  "shipped_over_reference": ratio, "worst_ratio": max(ratio),
                                  "states_above_goal": [i for i, r in enumerate(ratio) if r > GOAL]}
        print(f"{name} / {label} ({h.shape[1]} tokens): worst shipped/reference {max(ratio):.2f}")
        print("  state: logit / reference / shipped  " + "  ".join(
            f"{i}: {a:.2f}/{b:.2f}/{c:.2f}" for i, (a, b, c) in enumerate(zip(logit, reference, ours))))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["shapes-lm", T.REAL])
    ap.add_argument("--reference-only", nargs=3, metavar=("LR", "STEPS", "BATCH"), type=float, default=None,
                    help="only train (and keep) the reference lens with these settings")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.reference_only:
        lr, steps, batch = args.reference_only
        for name in args.models:
            compare(name, lr, int(steps), int(batch))
        return 0
    path = RESULTS / "residual_tuned_lens.json"
    result = json.loads(path.read_text()) if path.is_file() else {}
    result = {k: v for k, v in result.items() if k in ("models",)}
    result.setdefault("models", {})
    for name in args.models:
        result["models"][name] = compare(name)
    result |= {"goal": f"shipped lens within {GOAL}x the reference's mean KL at every state", "threads": 1,
               "torch": torch.__version__, "machine": "shared 2-core CPU, busy (8 developers)"}
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

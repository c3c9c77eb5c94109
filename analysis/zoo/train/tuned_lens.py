"""Train a tuned lens (Belrose et al. 2023) for a zoo model and store it beside the zoo's other artefacts.

    python -m analysis.zoo.train.tuned_lens --model zoo:shapes-lm
    python -m analysis.zoo.train.tuned_lens --model zoo:smollm2-135m-instruct

One affine translator per layer, h -> h + W h + b, trained so that the model's own final norm and
unembedding applied to the translated state of layer l match the model's final distribution: the loss is
KL(final || lens), summed over layers (the paper's objective). The last layer's state needs none.

The recipe is the tuned-lens repository's (analysis/residual/lens_training.py: zero start, SGD with Nesterov
momentum 0.9, weight decay 1e-3, gradient clipping at 1.0, linear decay), with a per-model step: each of lr 0.1,
0.03, 0.01 first trains a tenth of the steps and the one that ends lowest on a check set trains the lens.
What differs from the repository, and why:
- Corpus. Nothing can be downloaded here, so no Pile. shapes-lm: its own training formats (Shapes World
  decompositions, rewrites, max retrieval, needles) from the train split, checked on the val split, held out on
  the test split. A real model: its own samples (temperature 1, from 48 varied English openers), which is what
  the lens must imitate (the final distribution on text like the model's); checked on samples from 4 other
  openers, held out on samples from 8 more and on human-written English it never trained on: the docstrings
  of a fixed list of Python standard-library modules (the same on every machine with this Python).
- Size: `RECIPES` (tokens per step and steps), far below the repository's 2^18 tokens x 250 steps.
- Storage. Full-rank translators of a 30-layer, d = 576 model are 20 MB in float16; each file stays under
  8 MB, so a large model's translators are stored as W ~ u v^T truncated by SVD at rank `--rank` in float16
  (the held-out KL of the stored lens is what is reported, measured after truncation, beside the full rank's).
"""
from __future__ import annotations

import argparse
import inspect as pyinspect
import json
import random
import sys
import time
from pathlib import Path

import torch

from analysis.framework import paths
from analysis.residual.hooks import trace
from analysis.residual.lenses import readout
from analysis.residual import lens_training as LT
from analysis.residual.translators import LENS_ROOT, Translators, probe, weights_hash

MAX_FILE_BYTES = 8_000_000
TRAIN_OPENERS, HELD_OPENERS = LT.TRAIN_OPENERS, LT.HELD_OPENERS
STDLIB = ["textwrap", "argparse", "json", "csv", "logging", "unittest", "heapq", "bisect", "fractions", "decimal",
          "statistics", "difflib", "collections", "functools", "itertools", "contextlib", "dataclasses", "pathlib",
          "shutil", "tempfile", "calendar", "random", "string", "threading", "queue", "sqlite3", "zipfile", "email"]


# ---------------------------------------------------------------------------------------------
# Corpora (lists of token-id sequences)


def shapes_corpus(tokenizer, split: str, n: int, seed: int) -> list[list[int]]:
    """Shapes World examples in shapes-lm's training formats (prompt and answer), from one split's scenes."""
    from analysis.world import shapes_world as sw

    rng = random.Random(seed)
    seeds = iter(sw.split_seeds(split, sw.SPLIT_SIZE))
    texts = []
    for k in range(n):
        kind = k % 4
        if kind == 0:
            prompt, answer = sw.decompose_example(sw.generate_scene(next(seeds)))
        elif kind == 1:
            prompt, answer = sw.rewrite_example(sw.generate_scene(next(seeds)), rng)
        elif kind == 2:
            prompt, answer = sw.max_retrieval_example(rng, rng.randint(2, 16))
        else:
            prompt, answer, _ = sw.needle_example(rng, rng.randint(16, 64), rng.randint(1, 4))
        texts.append(f"{prompt} {answer} </s>")
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def samples(handle, openers: list[str], per_opener: int, new_tokens: int, seed: int) -> list[list[int]]:
    """The model's own continuations of each opener (temperature 1, no top-k / top-p), in one left-padded batch;
    each returned without its padding."""
    tok, lm = handle.tokenizer, handle.language_model
    rows = [tok(o)["input_ids"] for o in openers for _ in range(per_opener)]
    width = max(map(len, rows))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    torch.manual_seed(seed)
    with torch.no_grad():
        gen = lm.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                          max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad)
    return [r[width - len(row):] for r, row in zip(gen.tolist(), rows)]


def stdlib_text(modules: list[str] = STDLIB) -> list[str]:
    """Prose paragraphs from the docstrings of Python standard-library modules and their public members."""
    import importlib

    paragraphs = []
    for name in modules:
        module = importlib.import_module(name)
        docs = [pyinspect.getdoc(module) or ""]
        docs += [pyinspect.getdoc(getattr(module, a)) or "" for a in sorted(dir(module))
                 if not a.startswith("_") and (pyinspect.isfunction(getattr(module, a)) or pyinspect.isclass(getattr(module, a)))
                 and getattr(getattr(module, a), "__module__", "") == name]
        for doc in docs:
            for para in doc.split("\n\n"):
                text = " ".join(para.split())
                letters = sum(c.isalpha() or c == " " for c in text)
                if len(text) > 120 and letters / len(text) > 0.9 and not text.startswith((">>>", "-")):
                    paragraphs.append(text)
    return list(dict.fromkeys(paragraphs))


def cached_corpus(handle, name: str) -> tuple[list[list[int]], list[list[int]]]:
    """The model's training and held-out samples, kept under .model_inspector/ (sampling is seeded: a rerun
    draws the same tokens, this only saves the minutes it takes on a CPU)."""
    path = paths.ROOT / ".model_inspector" / f"tuned_lens_corpus_{name}.json"
    if path.is_file():
        data = json.loads(path.read_text())
        return data["train"], data["held"]
    train_seq = samples(handle, TRAIN_OPENERS, 2, 64, seed=0)
    held = samples(handle, HELD_OPENERS, 1, 64, seed=1)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"train": train_seq, "held": held}))
    return train_seq, held


def windows(tokenizer, texts: list[str], length: int, limit: int) -> list[list[int]]:
    out = []
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        out += [ids[i:i + length] for i in range(0, len(ids) - length // 2, length)]
    return [w for w in out if len(w) >= 8][:limit]


# ---------------------------------------------------------------------------------------------
# States, training, measuring


def states_of(handle, sequences: list[list[int]]) -> torch.Tensor:
    """The residual states (L + 1, N, D) of every token of every sequence (one forward per sequence)."""
    rows = []
    for ids in sequences:
        tr = trace(handle, torch.tensor([ids]), want=("resid",), keep=1)
        rows.append(torch.stack([tr.acts["resid"][i][0] for i in sorted(tr.acts["resid"])]))
    return torch.cat(rows, dim=1).float()


def kl_per_layer(lm, trans: Translators | None, states: torch.Tensor, chunk: int = 256) -> list[float]:
    """Mean KL(final || lens) in nats per state, the logit lens when `trans` is None."""
    n_states, n = states.shape[0], states.shape[1]
    totals = torch.zeros(n_states, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, n, chunk):
            part = states[:, start:start + chunk]
            final = torch.log_softmax(readout(lm, part[-1]).float(), -1)
            for layer in range(n_states):
                x = part[layer] if trans is None else trans.apply(layer, part[layer])
                logp = torch.log_softmax(readout(lm, x).float(), -1)
                totals[layer] += float((final.exp() * (final - logp)).sum())
    return (totals / n).tolist()


def low_rank(trans: Translators, rank: int) -> Translators:
    """Each W truncated to rank `rank` by SVD, stored as (u s, v)."""
    weights = {}
    for layer, (w,) in trans.weights.items():
        u, s, vh = torch.linalg.svd(w.double(), full_matrices=False)
        weights[layer] = ((u[:, :rank] * s[:rank]).float(), vh[:rank].T.float())
    return Translators(trans.layers, weights, dict(trans.biases), dict(trans.meta))


def stored_bytes(trans: Translators) -> int:
    return sum(t.numel() * 2 for t in trans.state_dict().values())  # float16


# ---------------------------------------------------------------------------------------------


REAL = "smollm2-135m-instruct"
RECIPES = {  # model -> (corpus kind, steps, tokens per step, rank or None)
    "shapes-lm": ("shapes", 400, 256, None),
    REAL: ("samples", 40, 24, 96),  # 40 steps: about 30 s each on the shared, busy 2-core machine
}


def recipe_for(name: str, steps: int | None = None) -> LT.LensRecipe:
    _, default_steps, batch, _ = RECIPES[name]
    steps = default_steps if steps is None else steps
    return LT.LensRecipe(steps=steps, batch=batch, check_steps=max(1, steps // 10))


def build(model: str, *, steps: int | None = None, rank: int | None = None, out: Path | None = None,
          log=print) -> dict:
    from analysis.model_access.models import ModelSpec, load_model

    spec = ModelSpec.parse(model)
    name = spec.name
    if spec.source != "zoo" or name not in RECIPES:
        raise SystemExit(f"error: no tuned-lens recipe for {model} (recipes: {', '.join('zoo:' + k for k in RECIPES)}).")
    kind, _, _, default_rank = RECIPES[name]
    recipe = recipe_for(name, steps)
    rank = default_rank if rank is None else (rank or None)
    handle = load_model(spec)
    lm = handle.language_model
    torch.manual_seed(0)
    t0 = time.perf_counter()
    log(f"{model}: building the corpora")
    if kind == "shapes":
        train_seq = shapes_corpus(handle.tokenizer, "train", 400, seed=0)
        check_seq = shapes_corpus(handle.tokenizer, "val", 40, seed=2)
        held = {"Shapes World test split": shapes_corpus(handle.tokenizer, "test", 100, seed=1)}
        corpus = ("shapes-lm's own training formats (decompose, rewrite, max, needle) on 400 train-split "
                  "examples; check set: 40 val-split examples; held out: 100 test-split examples")
    else:
        train_seq, held_samples = cached_corpus(handle, name)
        check_seq = held_samples[8:12]
        held = {"model samples, held-out openers": held_samples[:8],
                "Python stdlib docstrings (human-written)": windows(handle.tokenizer, stdlib_text(), 64, 8)}
        corpus = ("the model's own samples: 2 per opener x 48 English openers, 64 new tokens each, temperature 1; "
                  "check set: 1 sample per opener x 4 other openers; held out: 1 sample per opener x 8 more, and 8 windows of 64 tokens from the "
                  f"docstrings of {len(STDLIB)} Python standard-library modules")
    log(f"  {sum(map(len, train_seq))} training tokens; held out: "
        + ", ".join(f"{k}: {sum(map(len, v))}" for k, v in held.items()))
    train_states = states_of(handle, train_seq)
    fitted = LT.fit(lm, train_states, states_of(handle, check_seq), None, recipe, progress=_printer(log))
    log(f"  per-model step: lr {fitted.lr:g} (check-set KL after {recipe.check_steps} steps: "
        + ", ".join(f"{k:g}: {v:.2f}" for k, v in fitted.check.items()) + ")")
    trans = LT.rounded(fitted.translators)
    full = trans
    if rank is not None:
        trans = low_rank(trans, rank)
    metrics = {}
    for label, seqs in held.items():
        st = states_of(handle, seqs)
        report = LT.HeldOut.measure(lm, trans, st)
        metrics[label] = {"tokens": report.tokens, "logit": report.logit, "tuned": report.tuned,
                          "tuned_closer_share": report.closer}
        if rank is not None:
            metrics[label]["tuned_full_rank"] = kl_per_layer(lm, full, st)
    trans.meta = {
        "model": spec.label, "weights_sha256": weights_hash(lm), "probe": probe(lm), "paper": "Belrose et al. "
        "2023, Eliciting Latent Predictions from Transformers with the Tuned Lens",
        "translator": "h + W h + b" + (f", W stored at rank {rank}" if rank else ""),
        "recipe": LT.recipe_meta(recipe, fitted.lr, fitted.check) | {"threads": 1},
        "corpus": corpus, "held_out_kl_nats": metrics, "train_seconds": round(time.perf_counter() - t0, 1),
        "script": "python -m analysis.zoo.train.tuned_lens --model " + spec.label,
    }
    if stored_bytes(trans) > MAX_FILE_BYTES:
        raise SystemExit(f"error: the translators take {stored_bytes(trans) / 1e6:.1f} MB (> 8 MB); lower --rank.")
    folder = trans.save(out or LENS_ROOT / name)
    log(f"stored {paths.relative(folder)} ({stored_bytes(trans) / 1e6:.2f} MB) in {time.perf_counter() - t0:.0f} s")
    return trans.meta


def _printer(log):
    last = [-1]

    def progress(fraction: float, message: str = "") -> None:
        tenth = int(fraction * 10)
        if tenth != last[0]:
            last[0] = tenth
            log(f"  {fraction:.0%} {message}")
    return progress


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.zoo.train.tuned_lens", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="zoo:shapes-lm or zoo:smollm2-135m-instruct")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: the model's recipe)")
    ap.add_argument("--rank", type=int, default=None, help="store W at this rank (0: full rank)")
    ap.add_argument("--out", default=None, help="folder to store the lens in (default: analysis/zoo/lenses/NAME)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # part of the recipe: the float sums, so the translators, depend on it
    meta = build(args.model, steps=args.steps, rank=args.rank, out=Path(args.out) if args.out else None)
    for label, m in meta["held_out_kl_nats"].items():
        print(f"\n{label} ({m['tokens']} tokens): KL(final || lens) per state, logit -> tuned")
        print(" ".join(f"{i}:{a:.2f}->{b:.2f}" for i, (a, b) in enumerate(zip(m["logit"], m["tuned"]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

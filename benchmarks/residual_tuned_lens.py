"""The tuned lens against the logit lens, per layer, on held-out text: the paper's claim, measured.

    OMP_NUM_THREADS=1 python benchmarks/residual_tuned_lens.py [--steps 400]

Reads the held-out measurements stored with each trained lens (analysis/zoo/lenses/*/tuned_lens.json, written
by analysis/zoo/train/tuned_lens.py) and, on shapes-lm (cheap enough to retrain here), compares training
recipes on the same tokens: the tuned-lens repository's (zero start, SGD with Nesterov momentum, lr 0.1),
the same with a smaller step, and the stored recipe
(zero start, Adam), and a least-squares start with and without Adam after it; with --real-steps N, the
repository's step against the stored recipe's on SmolLM2 (N steps each). Writes benchmarks/results/residual_tuned_lens.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402  (every project path comes from analysis/framework/paths.py)

from analysis.model_access.models import ModelSpec, load_model  # noqa: E402
from analysis.residual.translators import LENS_ROOT, META, available  # noqa: E402
from analysis.zoo.train import tuned_lens as T  # noqa: E402

RECIPES = {  # name -> (start, optimizer, lr, steps share)
    "repo: zero start, SGD lr 0.1": ("zero", "sgd", 0.1, 1.0),
    "zero start, SGD lr 0.01": ("zero", "sgd", 0.01, 1.0),
    "stored: zero start, Adam lr 1e-3": ("zero", "adam", 1e-3, 1.0),
    "least squares only": ("lstsq", "adam", 0.0, 0.0),
    "least squares, then Adam lr 1e-3": ("lstsq", "adam", 1e-3, 1.0),
}


def ablation(steps: int) -> dict:
    handle = load_model(ModelSpec.parse("zoo:shapes-lm"))
    lm = handle.language_model
    train = T.states_of(handle, T.shapes_corpus(handle.tokenizer, "train", 400, seed=0))
    held = T.states_of(handle, T.shapes_corpus(handle.tokenizer, "test", 100, seed=1))
    out = {"logit lens": T.kl_per_layer(lm, None, held)}
    for name, (start, optimizer, lr, share) in RECIPES.items():
        trans = T.train(lm, train, int(steps * share), 256, lr, seed=0, log=lambda *_: None, start=start,
                        optimizer=optimizer)
        out[name] = T.kl_per_layer(lm, trans, held)
        print(name, [round(v, 3) for v in out[name]])
    return {"model": "zoo:shapes-lm", "held_out_tokens": held.shape[1], "steps": steps, "kl_nats": out}


def real_ablation(steps: int) -> dict:
    """The repository's step against the stored recipe's on SmolLM2, `steps` steps each from zero, on the
    stored lens's training samples; measured on 8 held-out samples (the model's own, other openers)."""
    handle = load_model(ModelSpec.parse(f"zoo:{T.REAL}"))
    lm = handle.language_model
    train_seq, held_seq = T.cached_corpus(handle, T.REAL)
    train, held = T.states_of(handle, train_seq), T.states_of(handle, held_seq[:8])
    out = {"logit lens": T.kl_per_layer(lm, None, held)}
    for name, optimizer, lr in (("repo: zero start, SGD lr 0.1", "sgd", 0.1), ("stored: zero start, Adam lr 1e-3", "adam", 1e-3)):
        trans = T.train(lm, train, steps, 24, lr, seed=0, log=lambda *_: None, start="zero", optimizer=optimizer)
        out[name] = T.kl_per_layer(lm, trans, held)
        print(name, [round(v, 2) for v in out[name]])
    return {"model": f"zoo:{T.REAL}", "held_out_tokens": held.shape[1], "steps": steps, "kl_nats": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--real-steps", type=int, default=0, help="also compare the two steps on SmolLM2 (0: no)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    stored = {name: json.loads((LENS_ROOT / name / META).read_text()) for name in available()}
    claims = {}
    for name, meta in stored.items():
        for corpus, m in meta["held_out_kl_nats"].items():
            worse = [i for i, (a, b) in enumerate(zip(m["logit"][:-1], m["tuned"][:-1])) if b >= a]
            claims[f"{name} / {corpus}"] = {"tokens": m["tokens"], "logit": m["logit"], "tuned": m["tuned"],
                                            "layers where the tuned lens is not lower": worse}
            print(f"{name} / {corpus}: tuned lens not lower at layers {worse or 'none'}")
    result = {"stored": claims, "recipes": {n: meta["recipe"] for n, meta in stored.items()},
              "shapes_lm_recipes": ablation(args.steps), "threads": 1, "torch": torch.__version__}
    if args.real_steps:
        result["smollm2_steps"] = real_ablation(args.real_steps)
    out = RESULTS / "residual_tuned_lens.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

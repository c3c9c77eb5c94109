"""How well *could* SAE-V's s_i separate corrupted image-caption pairs on Shapes World? A ceiling from
ground-truth codes, next to the demo SAE.

    python benchmarks/sae_v_ceiling.py [--seeds 2,0,1] [--pairs 300] [--no-sae] [--out FILE]

s_i sums a feature's cross-modal weight omega over the features active on both the caption and the
image of a pair. Replace the SAE by a perfect dictionary whose features are Shapes World's own
concepts (`analysis.zoo.concepts`, the ground truth the SAE-V panel labels features with), each with
omega = 1 (its text and image tokens point the same way), and s_i becomes a count of what both sides
share. Two such dictionaries:

- per attribute: one feature per colour, shape, size and position (what the demo SAE learns);
- per object (binding): one feature per whole object (size + colour + shape + position).

Each is scored with the official sum and with the labelled `normalised` variant (shared / either
side, a Jaccard index), on the evaluation pools `python -m analysis sae --rank` uses (a third clean, a
third another scene's caption, a third swapped attributes; an SAE built with `--seed S` is ranked on
pool 2 S + 2, so pool 2 is the demo SAE's own). For
the per-attribute sum it also searches weights per attribute kind (colour, shape, size, position;
each in 0-4, tuned on the pool it is scored on, so an optimistic bound). With the demo SAE
(`analysis/zoo/sae/shapes-vlm/layer1`) it adds the measured AUCs of both rules on its own pool.

Prints a markdown table and writes benchmarks/results/sae_v_ceiling.json.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from analysis.sae_v.datasets import ShapesDataset  # noqa: E402
from analysis.sae_v.scores import roc_auc  # noqa: E402
from analysis.zoo import concepts  # noqa: E402
from analysis.zoo import shapes_world as sw  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "sae_v_ceiling.json"
KINDS = ("other_scene", "swapped")
ATTRIBUTE_KINDS = ("colour", "shape", "size", "position")
WEIGHT_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


def shared_sets(pairs, binding: bool) -> list[tuple[str, set, set]]:
    """(kind, concepts on both sides, concepts on either side) per pair, for one ground-truth code."""
    out = []
    for p in pairs:
        text, image = concepts.caption_code(p.caption, binding), concepts.scene_code(p.scene, binding)
        out.append((p.kind, text & image, text | image))
    return out


def aucs(scores: list[float], kinds: list[str]) -> dict:
    """ROC AUC of clean pairs over all corrupted ones, and over each corrupted kind alone."""
    clean = [s for s, k in zip(scores, kinds) if k == "clean"]
    out = {"all": roc_auc(clean, [s for s, k in zip(scores, kinds) if k != "clean"])}
    for kind in KINDS:
        out[kind] = roc_auc(clean, [s for s, k in zip(scores, kinds) if k == kind])
    return {k: None if v is None else round(v, 4) for k, v in out.items()}


def ceiling(pairs) -> dict:
    kinds = [p.kind for p in pairs]
    rows = {}
    for code, binding in (("per attribute", False), ("per object (binding)", True)):
        sets = shared_sets(pairs, binding)
        rows[f"{code}, official sum"] = aucs([len(both) for _, both, _ in sets], kinds)
        rows[f"{code}, normalised"] = aucs([len(both) / len(either) if either else 0.0 for _, both, either in sets],
                                           kinds)
    sets = shared_sets(pairs, False)
    best, best_weights = None, None
    for weights in itertools.product(WEIGHT_GRID, repeat=len(ATTRIBUTE_KINDS)):
        w = dict(zip(ATTRIBUTE_KINDS, weights))
        scores = [sum(w[c.split(":")[0]] for c in both) for _, both, _ in sets]
        result = aucs(scores, kinds)
        if best is None or result["all"] > best["all"]:
            best, best_weights = result, w
    rows["per attribute, official sum, best kind weights"] = {**best, "weights": best_weights}
    return rows


def demo_sae() -> dict:
    """The demo SAE's AUCs on its own evaluation pool, under the official and normalised rules."""
    from analysis.models import ModelSpec, load_model
    from analysis.sae_v import by_kind, load_sae, load_store, rank_dataset

    folder = ROOT / "analysis" / "zoo" / "sae" / "shapes-vlm" / "layer1"
    handle = load_model(ModelSpec.parse("zoo:shapes-vlm"))
    store = load_store(folder)
    sae, meta = load_sae(folder)
    out = {}
    for rule in ("official", "normalised"):
        ranking = rank_dataset(handle, sae, meta, store, store.pairs, rule=rule)
        per_kind = by_kind(ranking.rows)
        out[f"demo SAE, {rule}"] = {"all": round(ranking.roc_auc, 4),
                                    **{k: round(per_kind[k]["roc_auc_vs_clean"], 4) for k in KINDS}}
    out["pool_seed"] = store.pairs.seed
    return out


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise ValueError(f"--seeds takes non-negative integers separated by commas, got '{text}'")
    return seeds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="2,0,1", help="evaluation pools (2: the demo SAE's own)")
    ap.add_argument("--pairs", type=int, default=300, help="pairs per pool (a third of each kind)")
    ap.add_argument("--no-sae", action="store_true", help="ground-truth codes only (no model)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    try:
        seeds = _seeds(args.seeds)
        if args.pairs < 6:
            raise ValueError(f"--pairs must be at least 6, got {args.pairs}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    pools = {seed: ceiling(sw.corrupted_pairs(ShapesDataset.EVAL_BASE + seed, args.pairs)) for seed in seeds}
    record = {"benchmark": "SAE-V s_i ceiling from ground-truth codes", "pairs_per_pool": args.pairs,
              "pools": {str(seed): rows for seed, rows in pools.items()}}
    if not args.no_sae:
        record["demo_sae"] = demo_sae()
    record["seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")

    print(f"| code and s_i | {' | '.join(f'pool {s}: all / other scene / swapped' for s in seeds)} |")
    print("|---|" + "---|" * len(seeds))
    for name in pools[seeds[0]]:
        cells = [" / ".join(f"{pools[s][name][k]:.2f}" for k in ("all",) + KINDS) for s in seeds]
        print(f"| {name} | {' | '.join(cells)} |")
    demo = record.get("demo_sae", {})
    for name, row in demo.items():
        if isinstance(row, dict):
            cells = [" / ".join(f"{row[k]:.2f}" for k in ("all",) + KINDS) if s == demo["pool_seed"] else "–"
                     for s in seeds]
            print(f"| {name} (its own pool, {demo['pool_seed']}) | {' | '.join(cells)} |")
    print(f"({record['seconds']} s; written to {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""SAE-V benchmark: speed of each build stage and quality of each SAE architecture, with the data
score s_i under the official SAE-V rule and under our earlier variant (`all-shared`).

    python benchmarks/sae_bench.py [--model zoo:shapes-vlm] [--layer 1] [--steps 1500] [--out FILE]

Prints markdown tables and writes benchmarks/results/sae_bench.json. Ratios are against baselines
measured in the same run: activation collection that stops after layer L vs a full forward, and
each architecture's quality next to the others on the same activations.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402  (every project path comes from analysis/framework/paths.py)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from analysis import sae_v  # noqa: E402
from analysis.model_access.models import ModelSpec, load_model, zoo_models  # noqa: E402


def full_forward_collect(handle, pairs, layer):
    """Baseline: the same activations read from a full forward (output_hidden_states)."""
    with handle.session():
        for start in range(0, len(pairs.pairs), 32):
            batch = range(start, min(len(pairs.pairs), start + 32))
            enc = handle.processor(images=[sae_v.render_pair(pairs, i) for i in batch],
                                   text=[sae_v.pair_prompt(handle, pairs.pairs[i].text) for i in batch],
                                   return_tensors="pt", padding=True)
            handle.model(**enc, output_hidden_states=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="zoo:shapes-vlm" if "shapes-vlm" in zoo_models() else None)
    ap.add_argument("--layer", type=int, default=None)
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--out", type=Path, default=RESULTS / "sae_bench.json",
                    help="where to write the JSON (e.g. one file per layer)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.model is None:
        from analysis.model_access import tiny_models

        folder = tiny_models.save_tiny_llava(Path("/tmp/sae-bench-llava"), image_size=64, patch=8, layers=3,
                                             hidden=128)
        os.environ.setdefault("MODEL_INSPECTOR_ROOTS", str(folder.parent))
        args.model = f"local:{folder}"
    handle = load_model(ModelSpec.parse(args.model))
    layer = args.layer if args.layer is not None else handle.info.layers // 2
    dataset = sae_v.default_dataset(handle)
    train = sae_v.make_pairs(handle, dataset, args.pairs, seed=11)
    test = sae_v.make_pairs(handle, dataset, args.pairs // 2, seed=12, corrupted=0.5)

    timings = {}
    t = time.perf_counter()
    acts = sae_v.collect_activations(handle, train, layer)
    timings["collect (stop after layer)"] = time.perf_counter() - t
    t = time.perf_counter()
    full_forward_collect(handle, train, layer)
    timings["full forward (baseline)"] = time.perf_counter() - t
    test_acts = sae_v.collect_activations(handle, test, layer)

    scales = sae_v.modality_scales(acts)
    train_in, test_in = sae_v.scaled(acts, scales), sae_v.scaled(test_acts, scales)
    rows = []
    for arch in sae_v.ARCHITECTURES:
        params = sae_v.TrainParams(architecture=arch, d_sae=512, k=8, steps=args.steps)
        t = time.perf_counter()
        sae = sae_v.train_sae(train_in, params)
        seconds = time.perf_counter() - t
        fve, l0, dead = sae_v.reconstruction_metrics(sae, test_in)
        codes = sae_v.encode(sae, test_in)
        labels, _, _ = sae_v.modality_labels(codes, test_acts.modality)
        meta = sae_v.SaeMeta(model=args.model, layer=layer, d_in=acts.acts.shape[1], train=params, dataset=dataset,
                             n_pairs=len(train.pairs), n_tokens=len(acts), fve=fve, l0=l0, dead=dead, scales=scales)
        row = {"architecture": arch, "train s": round(seconds, 1), "steps/s": round(args.steps / seconds, 1),
               "FVE": round(fve, 4), "L0": round(l0, 2), "dead": dead, "cross-modal": labels.count("cross-modal")}
        for rule_name in sae_v.SCORE_RULES:  # the official rule first, then the labelled variant
            rule = sae_v.score_rule(rule_name)
            omega, has = rule.weights(test_acts.acts, codes, test_acts.modality)
            ranking = sae_v.rank_pairs(meta, omega, codes, test_acts, test, has_omega=has, rule=rule)
            row[f"ROC AUC s_i ({rule_name})"] = None if ranking.roc_auc is None else round(ranking.roc_auc, 4)
            row[f"pairs with s_i > 0 ({rule_name})"] = sum(r.score != 0 for r in ranking.rows)
        if arch == "topk":
            t = time.perf_counter()
            sae_v.build_feature_store(handle, sae, meta, test_acts, test)
            timings["feature store (512 features)"] = time.perf_counter() - t
        rows.append(row)

    print(f"## SAE-V on {args.model}, layer {layer}: {len(acts)} training tokens, {len(test_acts)} test tokens\n")
    base = timings["full forward (baseline)"]
    print("| stage | seconds | vs full forward |\n|---|---|---|")
    for name, sec in timings.items():
        print(f"| {name} | {sec:.2f} | {sec / base:.2f}x |")
    print()
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "layer": layer, "timings_s": timings, "architectures": rows,
                               "torch_threads": torch.get_num_threads()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

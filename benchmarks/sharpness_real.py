"""The sharpness panel's first view on a real model: time against the plain forwards it needs, and the
cost estimate against the time, in one run.

    python benchmarks/sharpness_real.py [--model zoo:smollm2-135m-instruct] [--repeats 3] [--threads 2]

The first view is `analysis.sharpness.default_params(handle)` (what the page opens with). Its floor is the
model's own forward (eager attention, as loaded) of exactly the token batches the sweep feeds: each rule's
chunks of equal-length prompts with their candidate trees, the same attention mask, position ids and kept
logits, with no temperature function, no recording and no statistics. Each repeat times the sweep and
then its floor back to back, so load on the shared machine hits both alike; the ratio is the median of
the per-repeat ratios. The estimate is `analysis.framework.cost.estimate` (calibrated on this machine first).
Prints a markdown table and writes benchmarks/results/sharpness_real.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402  (every project path comes from analysis/framework/paths.py)

from analysis.framework import cost  # noqa: E402
from analysis import sharpness as S  # noqa: E402
from analysis.model_access.models import ModelHandle, ModelSpec, load_model  # noqa: E402

OUT = RESULTS / "sharpness_real.json"


def floor_batches(handle: ModelHandle, params: S.SweepParams) -> list[S.Packed]:
    """The token batches the sweep feeds the model for one rule (the same for every rule)."""
    build = S.prompt_builder(handle.tokenizer)
    limit = handle.info.max_positions or 4096
    dtype = handle.language_model.get_input_embeddings().weight.dtype
    batches = []
    for n in sorted(set(params.ns)):
        prompts = S.prompts_for(build, n, params, limit)
        if prompts is not None:
            batches += [S.pack(chunk, dtype) for chunk in S.chunks(prompts, params.batch)]
    return batches


def plain_forwards(handle: ModelHandle, batches: list[S.Packed], rules: int) -> None:
    lm = handle.language_model
    with handle.session(), torch.no_grad():
        for _ in range(rules):
            for b in batches:
                extra = {} if b.attention_mask is None else {"attention_mask": b.attention_mask,
                                                             "position_ids": b.position_ids}
                lm(input_ids=b.input_ids, use_cache=False, logits_to_keep=len(b.nodes) + 1, **extra)


def measure(handle: ModelHandle, params: S.SweepParams, repeats: int) -> dict:
    batches = floor_batches(handle, params)
    rules = len(params.temperatures())
    t0 = time.perf_counter()
    estimate = cost.estimate(S.size_sweep, handle, params)  # calibrates on this machine first
    estimate_s = time.perf_counter() - t0
    S.size_sweep(handle, S.SweepParams(ns=params.ns[:1], samples=1, thetas=[]))  # warm-up: lazy imports, first calls
    sweep, floor = [], []
    result = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = S.size_sweep(handle, params)
        sweep.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        plain_forwards(handle, batches, rules)
        floor.append(time.perf_counter() - t0)
    ratios = [s / f for s, f in zip(sweep, floor)]
    tokens = sum(b.input_ids.numel() for b in batches) * rules
    return {
        "model": handle.spec.label, "parameters": handle.info.parameters, "ns": params.ns, "samples": params.samples,
        "rules": rules, "forwards": len(batches) * rules, "tokens": tokens, "repeats": repeats,
        "threads": torch.get_num_threads(), "sweep_s": sweep, "floor_s": floor,
        "ratio_median": statistics.median(ratios), "estimate_s": estimate.seconds,
        "estimate_over_measured": estimate.seconds / statistics.median(sweep), "calibration_s": estimate_s,
        "accuracy": {p.n: p.run("softmax").accuracy for p in result.points},
        "chance": {p.n: p.chance for p in result.points},
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="zoo:smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    handle = load_model(ModelSpec.parse(args.model))
    params = S.default_params(handle)
    row = measure(handle, params, args.repeats)
    print(f"Sharpness first view on {row['model']} ({row['parameters'] / 1e6:.0f} M parameters): n = "
          f"{','.join(map(str, row['ns']))}, {row['samples']} prompts per n, {row['rules']} rules = {row['forwards']} "
          f"forwards, {row['tokens']} tokens; torch threads {row['threads']}\n")
    print("| repeat | sweep (s) | plain forwards (s) | ratio |")
    print("|---|---|---|---|")
    for i, (s, f) in enumerate(zip(row["sweep_s"], row["floor_s"]), 1):
        print(f"| {i} | {s:.2f} | {f:.2f} | {s / f:.2f}x |")
    print(f"\nmedian ratio **{row['ratio_median']:.2f}x** (goal <= 1.5x); estimate {row['estimate_s']:.1f} s = "
          f"{row['estimate_over_measured']:.2f} x the median measured time (goal within 2x)")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Residual-stream patching against the plain forwards it needs, measured in the same run.

    OMP_NUM_THREADS=1 python benchmarks/residual_bench.py [--repeats 5] [--models zoo:shapes-lm,...]

Per model, on its first offered pair (shapes-lm: a needle pair; SmolLM2: "The capital of France is" /
"... Italy is"), each repeat times, interleaved so machine load hits all alike:

- exact residual patching (`patch_problem` with the residual component and the exact method: the clean run
  recording every state, the corrupted run, then L x T patched rows in batches of 32);
- its floor: the same L x T rows of the corrupted prompt as plain forwards (batches of 32, no hooks,
  last position's logits only), and, for reference, the same L x T as one-row forwards;
- attribution patching (the clean run recording every state, the corrupted run with its graph, one backward);
- its floor: one plain forward of the prompt (last position's logits only).

Ratios use medians from the same run, of this one-threaded process's CPU time (what the work costs, whatever
else the shared machine runs; wall-time ratios are kept beside them). Writes benchmarks/results/residual_bench.json.
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

from analysis.model_access.models import ModelLoadError, ModelSpec, load_model  # noqa: E402
from analysis.residual import ResidualParams, pairs_for  # noqa: E402
from analysis.residual.analysis import _problem, patch_problem  # noqa: E402

BATCH = 32


def bench(label: str, repeats: int) -> dict:
    handle = load_model(ModelSpec.parse(label))
    lm = handle.language_model
    pair = pairs_for(handle)[0]
    problem = _problem(handle, ResidualParams(), pair)
    layers, t = handle.info.layers, problem.clean.shape[1]
    rows = layers * t

    def plain(batch_rows: int) -> None:
        with handle.session():
            done = 0
            while done < rows:
                n = min(batch_rows, rows - done)
                lm(input_ids=problem.corrupt.expand(n, -1), use_cache=False, logits_to_keep=1)
                done += n

    def one_forward() -> None:
        with handle.session():
            lm(input_ids=problem.corrupt, use_cache=False, logits_to_keep=1)

    runs = {
        "exact patching": lambda: patch_problem(handle, problem, ["residual"], ["exact"], BATCH),
        "floor: L x T rows, batched": lambda: plain(BATCH),
        "floor: L x T one-row forwards": lambda: plain(1),
        "attribution patching": lambda: patch_problem(handle, problem, ["residual"], ["attribution"], BATCH),
        "floor: one forward": one_forward,
    }
    for fn in runs.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.thread_time() - c0)
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}

    def ratios(m: dict) -> dict:
        return {"exact_vs_batched_floor": m["exact patching"] / m["floor: L x T rows, batched"],
                "exact_vs_one_row_forwards": m["exact patching"] / m["floor: L x T one-row forwards"],
                "attribution_in_forwards": m["attribution patching"] / m["floor: one forward"]}

    # CPU time of this (one-threaded) process: what the work costs, whatever else the shared machine runs
    return {"model": label, "pair": pair.name, "layers": layers, "positions": t, "cells": rows, "batch": BATCH,
            "repeats": repeats, "median_seconds": med, "median_cpu_seconds": med_cpu, "wall": ratios(med),
            **ratios(med_cpu)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", default="zoo:shapes-lm,zoo:smollm2-135m-instruct")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for label in args.models.split(","):
        try:
            results.append(bench(label, args.repeats))
        except ModelLoadError as exc:
            print(f"skipped {label}: {exc}")
    print("| model | cells (L x T) | exact patching CPU s | L x T rows batched CPU s | ratio | L x T one-row CPU s | ratio | "
          "attribution CPU s | one forward CPU s | forwards |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        m = r["median_cpu_seconds"]
        print(f"| {r['model']} | {r['cells']} ({r['layers']} x {r['positions']}) | {m['exact patching']:.3f} | "
              f"{m['floor: L x T rows, batched']:.3f} | {r['exact_vs_batched_floor']:.2f} | "
              f"{m['floor: L x T one-row forwards']:.3f} | {r['exact_vs_one_row_forwards']:.2f} | "
              f"{m['attribution patching']:.4f} | {m['floor: one forward']:.4f} | {r['attribution_in_forwards']:.2f} |")
    out = RESULTS / "residual_bench.json"
    out.write_text(json.dumps({"threads": 1, "results": results, "torch": torch.__version__,
                               "limits": {"exact_vs_floor": 1.2, "attribution_forwards": 3.0}}, indent=1) + "\n")
    print(f"wrote {out}")
    ok = all(r["exact_vs_batched_floor"] <= 1.2 and r["attribution_in_forwards"] <= 3.0 for r in results)
    return 0 if ok and results else 1


if __name__ == "__main__":
    sys.exit(main())

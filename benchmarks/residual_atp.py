"""AtP* against attribution patching and exact patching, timed in the same run as ratios.

    OMP_NUM_THREADS=1 python benchmarks/residual_atp.py [--pairs 2] [--repeats 1] [--models zoo:shapes-lm,...]

Per model, on its first `--pairs` offered pairs, with the components a head's output, queries, keys and each
layer's MLP, each repeat times (interleaved, so machine load hits all alike) `patch_problem` with one method:
exact (one patched row per cell, batches of 32), attribution (both prompts, one backward) and AtP* (the
attribution forward with the attention rule's record, the QK fix in float64, then GradDrop's L rows with one
backward), and one plain forward of the prompt as the unit.

Ratios use medians of this one-threaded process's CPU time (the machine is shared: wall times are kept beside
them but are noisy). Writes benchmarks/results/residual_atp.json.
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
from analysis.framework.paths import RESULTS  # noqa: E402

from analysis.model_access.models import ModelLoadError, ModelSpec, load_model  # noqa: E402
from analysis.residual import ResidualParams, pairs_for  # noqa: E402
from analysis.residual.analysis import _problem, patch_problem  # noqa: E402

BATCH = 32
COMPONENTS = ["heads", "queries", "keys", "mlp"]
METHODS = ["exact", "attribution", "atp*"]


def bench(label: str, pairs: int, repeats: int) -> dict:
    handle = load_model(ModelSpec.parse(label))
    out = []
    for pair in pairs_for(handle)[:pairs]:
        problem = _problem(handle, ResidualParams(), pair)

        def one_forward() -> None:
            with handle.session():
                handle.language_model(input_ids=problem.corrupt, use_cache=False, logits_to_keep=1)

        runs = {m: (lambda m=m: patch_problem(handle, problem, COMPONENTS, [m], BATCH)) for m in METHODS}
        runs["one forward"] = one_forward
        for fn in runs.values():  # warm-up
            fn()
        wall: dict[str, list[float]] = {k: [] for k in runs}
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(repeats):
            for name, fn in runs.items():
                t0, c0 = time.perf_counter(), time.thread_time()
                fn()
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.thread_time() - c0)
        c = {k: statistics.median(v) for k, v in cpu.items()}
        w = {k: statistics.median(v) for k, v in wall.items()}
        out.append({"pair": pair.name, "positions": int(problem.clean.shape[1]), "median_cpu_seconds": c,
                    "median_seconds": w,
                    "atp_star_vs_attribution": c["atp*"] / c["attribution"], "exact_vs_atp_star": c["exact"] / c["atp*"],
                    "exact_vs_attribution": c["exact"] / c["attribution"],
                    "atp_star_in_forwards": c["atp*"] / c["one forward"],
                    "wall": {"atp_star_vs_attribution": w["atp*"] / w["attribution"], "exact_vs_atp_star": w["exact"] / w["atp*"]}})
    return {"model": label, "layers": handle.info.layers, "components": COMPONENTS, "batch": BATCH,
            "repeats": repeats, "pairs": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--models", default="zoo:shapes-lm,zoo:smollm2-135m-instruct")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for label in args.models.split(","):
        try:
            results.append(bench(label, args.pairs, args.repeats))
        except ModelLoadError as exc:
            print(f"skipped {label}: {exc}")
    print("| model | pair | exact CPU s | attribution CPU s | AtP* CPU s | AtP* / attribution | exact / AtP* | "
          "AtP* in forwards |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        for p in r["pairs"]:
            m = p["median_cpu_seconds"]
            print(f"| {r['model']} | {p['pair']} | {m['exact']:.2f} | {m['attribution']:.3f} | {m['atp*']:.3f} | "
                  f"{p['atp_star_vs_attribution']:.1f} | {p['exact_vs_atp_star']:.1f} | {p['atp_star_in_forwards']:.1f} |")
    out = RESULTS / "residual_atp.json"
    out.write_text(json.dumps({"threads": 1, "results": results, "torch": torch.__version__,
                               "note": "one-threaded CPU time on a shared, busy machine"}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())

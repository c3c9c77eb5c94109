"""The cost gate's two estimates (seconds, peak MiB) against measured runs, one fresh process per run.

    python benchmarks/memory_bench.py [--only NAME ...] [--list]

Each case runs in its own Python process (`--case NAME`): load the model, estimate the run
(`analysis.framework.cost.estimate`, which first times the machine), run a small version of it once
(lazy imports, first allocations), hand memory back (`cost.release_memory`), reset the process's peak
resident set (/proc/self/clear_refs, 5) and read the resident set, run the case, then read the peak
(VmHWM). Measured memory = peak - resident before (what the run added to a server that already had the
model); measured time = wall time of the run (and the process CPU time beside it). Prints a markdown
table and writes benchmarks/results/memory_bench.json. Small configurations on purpose: each case takes
seconds, the largest (SmolLM2 sharpness at n = 128) about a minute; the issue's 12,000-pair store is
estimated only (`--estimate-only` rows), never run here.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS, ROOT  # noqa: E402

OUT = RESULTS / "memory_bench.json"
SMOL = "zoo:smollm2-135m-instruct"


def _sharpness(model: str, ns: list[int], samples: int, batch: int = 64, thetas: tuple = ()):
    def make(handle):
        from analysis import sharpness as S

        # softmax and the adaptive rule only (each fixed θ is one more forward of the same size: time, not peak)
        params = S.SweepParams(ns=ns, samples=samples, batch=batch, thetas=list(thetas))
        return S.size_sweep, params, S.SweepParams(ns=[4], samples=2)
    return model, make


def _store(pairs: int, batch: int = 16):
    def make(handle):
        from analysis.sae_v import sources, store_for
        from analysis.sae_v.types import SAE_ROOT

        sae = sorted((SAE_ROOT / "shapes-vlm").glob("layer*"))[0].name
        params = sources.choose(handle, sae, "dataset:shapes", store_pairs=pairs, batch_pairs=batch)
        warm = sources.choose(handle, sae, "dataset:shapes", store_pairs=4, batch_pairs=4)
        return store_for, params, warm
    return "zoo:shapes-vlm", make


def _kv(model: str, context: int, generated: int | None = None):
    def make(handle):
        from analysis import kv

        small = kv.policy_settings(snap_window=4, morph_window=4)
        params = kv.KvParams(context=context, budget=max(16, context // 4), new_tokens=8, policies=small)
        return kv.analyze, params, kv.KvParams(context=48, budget=16, new_tokens=2, policies=small)
    return model, make


def _residual(model: str, batch: int = 32):
    def make(handle):
        from analysis import residual as R

        params = R.ResidualParams(batch=batch)
        return R.patch, params, R.ResidualParams(batch=batch, components=["residual"])
    return model, make


CASES = {
    "sharpness shapes-lm n=8,16,32 x16": _sharpness("zoo:shapes-lm", [8, 16, 32], 16),
    "sharpness shapes-lm n=256 x64": _sharpness("zoo:shapes-lm", [256], 64),
    "sharpness smollm2 n=32 x8": _sharpness(SMOL, [32], 8),
    "sharpness smollm2 n=128 x4": _sharpness(SMOL, [128], 4),
    "sharpness smollm2 n=128 x12": _sharpness(SMOL, [128], 12),
    "sae-v store shapes-vlm 300 pairs": _store(300),
    "sae-v store shapes-vlm 1000 pairs": _store(1000),
    "kv shapes-lm context 96": _kv("zoo:shapes-lm", 96),
    "kv smollm2 context 128": _kv(SMOL, 128),
    "residual patch shapes-lm": _residual("zoo:shapes-lm"),
    "residual patch smollm2": _residual(SMOL),
}
ESTIMATE_ONLY = {  # the measurements (#50), too heavy to rerun here: estimated beside them
    "sharpness smollm2 n=128 x32 (page default rules)": (_sharpness(SMOL, [128], 32, thetas=(0.5, 2.0)), 2.9e3 - 1.25e3),
    "sae-v store shapes-vlm 3000 pairs": (_store(3000), 3.8e3 - 1.4e3),
    "sae-v store shapes-vlm 12000 pairs": (_store(12000), 11.2e3 - 1.8e3),
}


class _CpuClock:
    """`time` for cost.calibrate with every clock reading this thread's CPU time."""
    perf_counter = staticmethod(time.thread_time)
    thread_time = staticmethod(time.thread_time)
    monotonic = staticmethod(time.monotonic)


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0  # kB -> MiB
    raise RuntimeError(field)


def run_case(name: str, estimate_only: bool = False) -> dict:
    import torch

    from analysis.framework import cost
    from analysis.model_access.models import ModelSpec, load_model

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    model, make = (ESTIMATE_ONLY[name][0] if name in ESTIMATE_ONLY else CASES[name])
    handle = load_model(ModelSpec.parse(model))
    fn, params, warm = make(handle)
    t0 = time.process_time()
    est = cost.estimate(fn, handle, params)
    est_cpu = time.process_time() - t0
    # The same estimate with the machine's speed read in CPU time: on a crowded machine (load 20+ on 2 cores
    # while these were taken) wall times measure the crowd; CPU time against CPU time measures the estimate.
    cost._calibrated.clear()
    cost.time = _CpuClock
    on_cpu = cost.estimate(fn, handle, params)
    cost.time = time
    row = {"case": name, "model": handle.spec.label, "estimate_s": est.seconds, "estimate_mb": est.mb,
           "estimate_cpu_s": on_cpu.seconds, "estimating_s": est_cpu,
           "range_s": list(on_cpu.range()), "counted": {k: v for k, v in vars(est.work).items() if v}}
    if estimate_only:
        return row
    fn(handle, warm)
    cost.release_memory()
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from now
    before = _status("VmRSS")
    c0, w0 = time.process_time(), time.perf_counter()
    fn(handle, params)
    row.update(measured_s=time.perf_counter() - w0, measured_cpu_s=time.process_time() - c0,
               measured_mb=_status("VmHWM") - before, rss_before_mb=before)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case")
    ap.add_argument("--estimate-only", action="store_true")
    ap.add_argument("--only", nargs="*", default=None, help="substrings of case names")
    ap.add_argument("--reestimate", action="store_true",
                    help="estimate every stored row again with today's code (its measurement stays as it was)")
    args = ap.parse_args()
    if args.case:
        print("ROW " + json.dumps(run_case(args.case, args.estimate_only)))
        return 0
    if args.reestimate:
        return reestimate()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "MODEL_INSPECTOR_CONFIG": "deploy/public.toml"}  # read-only: a built store stays in memory
    env.pop("MODEL_INSPECTOR_CONFIG") if not Path("deploy/public.toml").is_file() else None
    rows = []
    jobs = [(n, False) for n in CASES] + [(n, True) for n in ESTIMATE_ONLY]
    for name, only_estimate in jobs:
        if args.only and not any(s in name for s in args.only):
            continue
        cmd = [sys.executable, __file__, "--case", name] + (["--estimate-only"] if only_estimate else [])
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        line = next((x for x in out.stdout.splitlines() if x.startswith("ROW ")), None)
        if line is None:
            print(f"{name}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        row = json.loads(line[4:])
        if only_estimate:
            row["measured_mb"] = ESTIMATE_ONLY[name][1]
            row["measured_by"] = "issue #50 (server RSS growth)"
        rows.append(row)
        print(_line(row), flush=True)
    previous = json.loads(OUT.read_text()) if OUT.is_file() and args.only else {"rows": []}
    kept = [r for r in previous["rows"] if r["case"] not in {x["case"] for x in rows}]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"taken": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
                               "note": "busy shared 2-core machine, one torch thread", "rows": kept + rows}, indent=1))
    print("\n| case | est. MiB | measured MiB | measured / est. | est. CPU s | measured CPU s | measured / est. | "
          "wall s (est. / measured) |\n|---|---|---|---|---|---|---|---|")
    for r in kept + rows:
        print(_line(r))
    return 0


def reestimate() -> int:
    """The stored rows with their estimates computed again (after a constant was fitted to them)."""
    data = json.loads(OUT.read_text())
    for row in data["rows"]:
        if row["case"] not in CASES and row["case"] not in ESTIMATE_ONLY:
            continue
        out = subprocess.run([sys.executable, __file__, "--case", row["case"], "--estimate-only"], capture_output=True,
                             text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
                             cwd=ROOT)
        line = next((x for x in out.stdout.splitlines() if x.startswith("ROW ")), None)
        if line is None:
            print(f"{row['case']}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        new = json.loads(line[4:])
        row.update(estimate_mb=new["estimate_mb"], estimate_cpu_s=new["estimate_cpu_s"], range_s=new["range_s"],
                   estimated_again=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        print(_line(row), flush=True)
    OUT.write_text(json.dumps(data, indent=1))
    return 0


def _line(r: dict) -> str:
    ms, mc = r.get("measured_s"), r.get("measured_cpu_s")
    head = f"| {r['case']} | {r['estimate_mb']:.0f} | {r['measured_mb']:.0f} | {r['measured_mb'] / r['estimate_mb']:.2f} "
    if not ms:
        return head + f"| {r['estimate_cpu_s']:.1f} | – | – | {r['estimate_s']:.0f} / – |"
    return head + (f"| {r['estimate_cpu_s']:.1f} | {mc:.1f} | {mc / r['estimate_cpu_s']:.2f} "
                   f"| {r['estimate_s']:.1f} / {ms:.1f} |")


if __name__ == "__main__":
    sys.exit(main())

"""Peak resident memory of the largest run a public visitor can start on each panel, alone and two at once,
beside the public example's memory budget (deploy/public.toml: `limits.max_run_mb`, `limits.server_mb`).

    python benchmarks/public_peak.py [--only NAME ...]     # about 15 min on a busy 2-core machine

Each case runs in its own Python process (`--case NAME`) that stands in for a public server: it loads
every model a visitor of the example may open that the panels run on (the demo zoo and SmolLM2), then
finds the largest run of the case's family that the cost gate lets start (`components.limits`' rule:
estimated seconds <= `max_run_seconds`, estimated MiB <= `max_run_mb`, resident + estimate <= `server_mb`)
by bisection over one size (prompts, pairs, context, characters), with the machine's speed read in CPU
time (a crowded machine's wall clock would make the gate refuse smaller runs: this is the largest an idle
machine of this kind starts). Then it runs a small version once (first allocations), hands memory back,
resets the peak resident set (/proc/self/clear_refs, 5) and measures:
- alone: the run on one thread; peak resident (VmHWM) and what it added over the resident set before;
- two at once: the same run from two threads on the one shared model (two visitors; the example runs two
  at once, one each), and whether the gate would start the second beside the first
  (`resident + 2 x estimate <= server_mb`) or make it wait.
Writes benchmarks/results/public_peak.json and prints a markdown table (docs/deploy.md quotes it).
The family of each panel is the one whose memory grows fastest for its time (a visitor after memory
would choose it); see CASES.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import DEPLOY, ROOT, result_file  # noqa: E402

OUT = result_file("public_peak.json")
SMOL = "zoo:smollm2-135m-instruct"
LOADED = ("zoo:shapes-lm", "zoo:shapes-vlm", SMOL)  # what a public server holds once visitors opened each
SENTENCE = "When Mary and John went to the store, John gave a drink to "


def _sharpness(handle, size):  # 64 prompts (one batch) of `size` items each
    from analysis import sharpness as S

    params = S.default_params(handle)
    params.ns, params.samples = [size], 64
    return S.size_sweep, params, {}


def _kv(handle, size):  # one prompt of `size` context tokens, the page's other settings as they open
    from analysis import kv

    return kv.analyze, kv.KvParams(context=size, examples=1), {}


def _residual(handle, size):  # the logit lens over an own prompt pair of `size` characters
    from analysis import residual as R

    text = (SENTENCE * (size // len(SENTENCE) + 1))[:size].rsplit(" ", 1)[0] + " "
    return R.inspect, R.ResidualParams(pair="own", prompt=text, corrupt=text.replace("John", "Anna"),
                                       answer=" Mary", foil=" John"), {}


def _inversion(handle, size):  # a secret prompt of `size` characters (the attack allows 64 tokens)
    from analysis import inversion as I

    return I.reconstruct, I.AttackParams(prompt=(SENTENCE * 40)[:size].strip()), {}


def _store(handle, size):  # the SAE-V feature store of `size` Shapes pairs (the 12,000 took 11.2 GB)
    from analysis.sae_v import sources, store_for
    from analysis.sae_v.types import SAE_ROOT

    sae = sorted((SAE_ROOT / "shapes-vlm").glob("layer*"))[0].name
    return store_for, sources.choose(handle, sae, "dataset:shapes", store_pairs=size), {}


def _captions(handle, size):  # a pasted caption of `size` characters, checked claim by claim, grounded (IG)
    from analysis.captions import CorrectionParams, correct_scene

    claims = " ".join(f"there is a {z} {c} {s} at the {p} ." for z in ("large", "small")
                      for c in ("red", "blue", "green") for s in ("circle", "square", "triangle")
                      for p in ("top left", "bottom right"))  # distinct claims: the decomposer keeps each once
    caption = claims[:size].rsplit(" .", 1)[0] + " ."
    return correct_scene, CorrectionParams(caption=caption, scene_seed=0, ground=True), {}


def _forget() -> None:
    """Drop what a run keeps for the next one (the caption pipeline's kept verifications), so that every
    measured run computes."""
    import analysis.captions.pipeline as pipeline

    with pipeline._KEPT_LOCK:
        pipeline._KEPT.clear()


# name -> (panel, model, family, smallest size, largest size tried, what the size counts, CPU seconds the
# benchmark spends on one run at most). Where the gate would start a longer run than that budget, the run
# measured is the largest within it and the row says so: on a busy 2-core machine a 120 s run measured
# three times (alone, then two at once) is 10 minutes per panel. The families are chosen so that the
# budget binds only where a run's peak does not grow with its length (more claims, more decode steps).
CASES = {
    "sharpness": ("Attention sharpness", "zoo:shapes-lm", _sharpness, 8, 4096, "items per prompt (64 prompts)", 20),
    "kv": ("KV-cache eviction", "zoo:shapes-lm", _kv, 96, 8192, "context tokens", 10),
    "residual": ("Residual stream", SMOL, _residual, 60, 2000, "characters of an own prompt (logit lens)", 20),
    "inversion": ("Prompt reconstruction", SMOL, _inversion, 20, 2000, "characters of the secret prompt", 20),
    "sae-v": ("SAE-V", "zoo:shapes-vlm", _store, 8, 12000, "pairs in the feature store", 30),
    "captions": ("Caption correction", "zoo:shapes-vlm", _captions, 48, 2000, "characters of a pasted caption", 10),
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


def _largest(handle, family, lo: int, hi: int, limits, cap_s: float = float("inf")) -> tuple[int, object, object]:
    """The largest size in [lo, hi] whose estimate the gate lets start and, with `cap_s`, is estimated at
    most that many seconds (sizes assumed monotone in cost)."""
    from analysis.framework import cost

    def allowed(size: int):
        try:
            fn, params, kwargs = family(handle, size)
            est = cost.estimate(fn, handle, params, kwargs)
        except Exception:  # noqa: BLE001 (settings the panel refuses: not a run a visitor can start)
            return None
        if not est.work.calls:  # nothing would run (a sharpness n whose prompts do not fit): the run refuses
            return None
        ok = (est.seconds <= min(limits.max_run_seconds, cap_s) and est.mb <= limits.max_run_mb
              and _status("VmRSS") + est.mb <= limits.server_mb)
        return est if ok else None

    best = allowed(lo)
    if best is None:
        raise RuntimeError(f"even the smallest run ({lo}) is refused")
    good, bad = lo, hi + 1
    if allowed(hi) is not None:
        good = bad = hi
    while bad - good > max(1, good // 50):  # to within 2 %
        mid = (good + bad) // 2
        if allowed(mid) is not None:
            good = mid
        else:
            bad = mid
    return good, *family(handle, good)[1:2], allowed(good)


def _timed(fn, handle, params, kwargs, out: list, i: int) -> None:
    c0, w0 = time.thread_time(), time.perf_counter()
    fn(handle, copy.deepcopy(params), **kwargs)
    out[i] = (time.perf_counter() - w0, time.thread_time() - c0)


def run_case(name: str) -> dict:
    import torch

    from analysis.framework import config, cost
    from analysis.model_access.models import ModelSpec, load_model

    torch.set_num_threads(1)
    limits = config.current().limits
    panel, model, family, lo, hi, unit, cap_s = CASES[name]
    handles = {m: load_model(ModelSpec.parse(m)) for m in LOADED}
    handle = handles[model]
    cost.time = _CpuClock
    t0 = time.process_time()
    gate_size, _, gate_est = _largest(handle, family, lo, hi, limits)
    searching = time.process_time() - t0
    size, params, est = (gate_size, _, gate_est) if gate_est.seconds <= cap_s else \
        _largest(handle, family, lo, gate_size, limits, cap_s)
    cost.time = time
    fn, _, kwargs = family(handle, size)
    small_fn, small, small_kwargs = family(handle, lo)
    small_fn(handle, small, **small_kwargs)  # lazy imports, first allocations
    cost.release_memory()
    row = {"case": name, "panel": panel, "model": handle.spec.label, "size": size, "size_counts": unit,
           "estimate_mb": round(est.mb, 1), "estimate_cpu_s": round(est.seconds, 1),
           "searching_cpu_s": round(searching, 2),
           "gate_largest": {"size": gate_size, "estimate_mb": round(gate_est.mb, 1),
                            "estimate_cpu_s": round(gate_est.seconds, 1)},
           "capped_by_benchmark": size < gate_size,
           "limits": {"max_run_seconds": limits.max_run_seconds, "max_run_mb": limits.max_run_mb,
                      "server_mb": limits.server_mb, "concurrent_runs": limits.concurrent_runs}}
    for label, threads in (("alone", 1), ("two_at_once", 2)):
        _forget()
        Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from now
        before = _status("VmRSS")
        times: list = [None] * threads
        workers = [threading.Thread(target=_timed, args=(fn, handle, params, kwargs, times, i)) for i in range(threads)]
        w0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if any(t is None for t in times):
            raise RuntimeError(f"{label}: a run failed")
        peak = _status("VmHWM")
        row[label] = {"rss_before_mb": round(before, 1), "peak_rss_mb": round(peak, 1),
                      "added_mb": round(peak - before, 1), "wall_s": round(time.perf_counter() - w0, 1),
                      "cpu_s_per_run": [round(t[1], 1) for t in times]}
        cost.release_memory()
    row["gate_starts_both_at_once"] = row["two_at_once"]["rss_before_mb"] + 2 * est.mb <= limits.server_mb
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case")
    ap.add_argument("--only", nargs="*", default=None, help="case names")
    args = ap.parse_args()
    if args.case:
        print("ROW " + json.dumps(run_case(args.case)))
        return 0
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "MODEL_INSPECTOR_CONFIG": str(DEPLOY / "public.toml")}
    rows = []
    for name in CASES:
        if args.only and name not in args.only:
            continue
        out = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True, text=True, env=env,
                             cwd=ROOT)
        line = next((x for x in out.stdout.splitlines() if x.startswith("ROW ")), None)
        if line is None:
            print(f"{name}: failed\n{out.stderr[-3000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(line[4:]))
        print(_line(rows[-1]), flush=True)
    previous = json.loads(OUT.read_text()) if OUT.is_file() and args.only else {"rows": []}
    kept = [r for r in previous["rows"] if r["case"] not in {x["case"] for x in rows}]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"taken": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
                               "note": "busy shared 2-core machine (7 other developers), one torch thread per run",
                               "rows": kept + rows}, indent=1) + "\n")
    print("\n| panel (model) | largest run the gate starts | est. MiB | alone: added / peak RSS MiB | "
          "two at once: added / peak RSS MiB | gate starts both at once |\n|---|---|---|---|---|---|")
    for r in kept + rows:
        print(_line(r))
    return 0


def _line(r: dict) -> str:
    a, b = r["alone"], r["two_at_once"]
    gate = r.get("gate_largest", {})
    capped = (f" (the gate starts up to {gate['size']:,}: est. {gate['estimate_mb']:.0f} MiB, "
              f"{gate['estimate_cpu_s']:.0f} s)") if r.get("capped_by_benchmark") else ""
    return (f"| {r['panel']} ({r['model']}) | {r['size']:,} {r['size_counts']}{capped} | {r['estimate_mb']:.0f} | "
            f"{a['added_mb']:.0f} / {a['peak_rss_mb']:.0f} | {b['added_mb']:.0f} / {b['peak_rss_mb']:.0f} | "
            f"{'yes' if r['gate_starts_both_at_once'] else 'no: the second waits'} |")


if __name__ == "__main__":
    sys.exit(main())

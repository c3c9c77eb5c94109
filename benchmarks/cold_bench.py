"""Cold first render of every panel's default view, and warm reruns (Streamlit AppTest).

    python benchmarks/cold_bench.py [--panels kv-cache,...] [--repeats 3] [--threads 1]

"Cold" is what the first user meets on a freshly started server: each panel runs in a fresh Python
interpreter that has done what the server does before it reports healthy (Streamlit, and
scripts/serve.py's import of components/preload.py and its measurement of the demo models' speed;
timed separately as "imports") and nothing else: no model kept loaded, no result computed. Timed: the
whole app script plus the switch to the panel with its default settings on the panel's default demo
model — model load, analysis (or precomputed lookup) and figures included. "Warm" is a rerun of the
same session right after (Streamlit's caches and the panel's results warm). The median of
`--repeats` fresh interpreters is reported. Prints a markdown table and writes
benchmarks/results/cold_bench.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS, ROOT  # noqa: E402  (every project path comes from analysis/framework/paths.py)
OUT = RESULTS / "cold_bench.json"

# url path -> (page file, default model of the panel)
PANELS = {
    "kv-cache": ("views/kv_cache.py", "zoo:shapes-lm"),
    "prompt-reconstruction": ("views/prompt_reconstruction.py", "zoo:shapes-lm"),
    "attention-sharpness": ("views/attention_sharpness.py", "zoo:shapes-lm"),
    "sae-features": ("views/sae_features.py", "zoo:shapes-vlm"),
    "caption-correction": ("views/caption_correction.py", "zoo:shapes-vlm"),
}


def one(page: str, model: str, threads: int) -> dict:
    """Run in a fresh interpreter: time the cold render and a warm rerun of one panel."""
    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    from streamlit.testing.v1 import AppTest  # noqa: F401  (the harness, not the app, is excluded)

    from analysis.model_access.models import ModelSpec

    t_imports = time.perf_counter()
    try:
        import components.preload  # (what scripts/serve.py does before listening: these imports, then
        components.preload.calibrate_zoo()  # this machine's speed on each demo model, in a thread)
    except ImportError:
        pass
    imports = time.perf_counter() - t_imports
    t0 = time.perf_counter()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.session_state["model_spec"] = ModelSpec.parse(model)
    at.query_params["model"] = model
    at.run()
    at.switch_page(page)
    at.run()
    cold = time.perf_counter() - t0
    errors = [str(e.value) for e in at.exception] + [str(e.value) for e in at.error]
    warm = []
    for _ in range(3):
        t1 = time.perf_counter()
        at.run()
        warm.append(time.perf_counter() - t1)
    return {"cold_s": cold, "warm_s": statistics.median(warm), "errors": errors, "imports_s": imports,
            "charts": len(list(at.get("plotly_chart")))}


def machine() -> str:
    from analysis.zoo.__main__ import cpu_name

    cpu = cpu_name()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, load average {load:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--panels", default=",".join(PANELS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--no-store", action="store_true", help="ignore the precomputed results (as before)")
    parser.add_argument("--label", default="", help="a note stored with the results (e.g. 'before')")
    args = parser.parse_args()
    if args.one:
        page, model = PANELS[args.one]
        print(json.dumps(one(page, model, args.threads)))
        return 0
    if args.no_store:
        os.environ["MODEL_INSPECTOR_PRECOMPUTED"] = "0"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "MODEL_INSPECTOR_STORE": str(ROOT / ".model_inspector" / "bench.db")}
    rows = []
    for name in args.panels.split(","):
        runs = []
        for _ in range(args.repeats):
            proc = subprocess.run([sys.executable, __file__, "--one", name, "--threads", str(args.threads)],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        row = {"panel": name, "cold_s": statistics.median(r["cold_s"] for r in runs),
               "cold_all_s": [round(r["cold_s"], 3) for r in runs],
               "warm_s": statistics.median(r["warm_s"] for r in runs),
               "imports_s": statistics.median(r.get("imports_s", 0.0) for r in runs),
               "errors": runs[-1]["errors"], "charts": runs[-1]["charts"]}
        rows.append(row)
        print(f"{name}: cold {row['cold_s']:.2f} s {row['cold_all_s']}, warm {row['warm_s']:.3f} s, "
              f"errors {row['errors']}", file=sys.stderr, flush=True)
    print(f"\nMachine: {machine()}; torch threads {args.threads}; median of {args.repeats} fresh interpreters.\n")
    print("| panel (default view) | cold first render | warm rerun | server imports (before healthy) | goal |")
    print("|---|---|---|---|---|")
    for r in rows:
        ok = "✓" if r["cold_s"] <= 2.0 and r["warm_s"] <= 0.3 and not r["errors"] else "✗"
        print(f"| {r['panel']} | {r['cold_s']:.2f} s | {r['warm_s']:.3f} s | {r['imports_s']:.1f} s | "
              f"≤ 2 s / ≤ 0.3 s {ok} |")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(OUT.read_text()) if OUT.is_file() else {}
    runs_by_label = previous.get("runs", {}) if isinstance(previous, dict) else {}
    runs_by_label[args.label or "latest"] = {"machine": machine(), "threads": args.threads,
                                             "repeats": args.repeats, "rows": rows,
                                             "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    OUT.write_text(json.dumps({"runs": runs_by_label}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

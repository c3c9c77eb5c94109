"""The contribution graph's cost as a ratio to one plain forward of the same prompt, measured in the same run.

    OMP_NUM_THREADS=1 python benchmarks/residual_graph.py [--repeats 5] [--models zoo:shapes-lm,...]

Per model, on the prompt of its first offered pair's kind the panel shows (shapes-lm: needle-0; SmolLM2:
capital-france), each repeat times, interleaved so the shared machine's load hits both alike:

- the floor: one plain forward of the language model (`use_cache=False`, no capture);
- `contribution_graph` (analysis/residual/contributions.py): its one captured forward through the backend seam,
  the decomposition of every layer's attention per (source, head) and every importance, and the top-down graph.

Ratios use medians of this one-threaded process's CPU time (wall time beside it). Writes
benchmarks/results/residual_graph.json. Figures from a busy shared machine: read the ratio, not the seconds.
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

from analysis.model_access.models import ModelSpec, load_model  # noqa: E402
from analysis.residual.contributions import contribution_graph  # noqa: E402
from analysis.residual.pairs import find  # noqa: E402
from analysis.residual.prompts import encoded  # noqa: E402

PAIRS = {"zoo:shapes-lm": "needle-0", "zoo:smollm2-135m-instruct": "capital-france"}


def timed(fn) -> tuple[float, float, object]:
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c, time.perf_counter() - w, out


def bench(label: str, repeats: int) -> dict:
    handle = load_model(ModelSpec.parse(label))
    prompt = find(handle, PAIRS[label]).clean
    ids = encoded(handle, prompt, "prompt")

    @torch.no_grad()
    def plain():
        with handle.session():
            return handle.language_model(input_ids=ids, use_cache=False)

    plain(), contribution_graph(handle, prompt)  # warm both
    floor, graph, floor_wall, graph_wall, parts = [], [], [], [], []
    for _ in range(repeats):
        c, w, _ = timed(plain)
        floor.append(c), floor_wall.append(w)
        c, w, g = timed(lambda: contribution_graph(handle, prompt))
        graph.append(c), graph_wall.append(w), parts.append(g.seconds)
    med = statistics.median
    out = {"model": label, "pair": PAIRS[label], "tokens": int(ids.shape[1]), "repeats": repeats,
           "forward_cpu_s": med(floor), "graph_cpu_s": med(graph), "ratio_cpu": med(graph) / med(floor),
           "ratio_wall": med(graph_wall) / med(floor_wall),
           "graph_parts_cpu_s": {k: med(p[k] for p in parts) for k in parts[0]}}
    out["captured_forward_ratio"] = out["graph_parts_cpu_s"]["forward_cpu"] / med(floor)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", default=",".join(PAIRS))
    args = ap.parse_args()
    rows = [bench(m, args.repeats) for m in args.models.split(",")]
    for r in rows:
        print(f"{r['model']} ({r['tokens']} tokens): forward {r['forward_cpu_s'] * 1e3:.1f} ms CPU, graph "
              f"{r['graph_cpu_s'] * 1e3:.1f} ms: {r['ratio_cpu']:.2f}x one forward (wall {r['ratio_wall']:.2f}x); "
              f"its captured forward {r['captured_forward_ratio']:.2f}x, parts {r['graph_parts_cpu_s']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "residual_graph.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""Cost estimates against measured times, on two model sizes: shapes-lm (638 k parameters) and a
random-weight model of Qwen2.5-0.5B's shape (24 layers, d = 896, 14/2 heads, 494 M parameters, built
from its config in memory; no download).

    python benchmarks/cost_bench.py [--threads 2] [--skip-big]

For each model: `analysis.cost.calibrate` (a few tiny timed forwards), then small runs of the KV,
sharpness and prompt-reconstruction analyses, each estimated first and then timed (on the small
model after one untimed run, so that lazy imports are not counted). Also prints the
estimate for each page's default settings on the big model (what the page shows before its Run
button) without running them. Prints a markdown table, writes benchmarks/results/cost_bench.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analysis import cost  # noqa: E402
from analysis import inversion as inv  # noqa: E402
from analysis import kv_eviction as kv  # noqa: E402
from analysis import sharpness as S  # noqa: E402
from analysis.models import ModelHandle, ModelSpec, describe, load_model, zoo_models  # noqa: E402
from analysis.tiny_models import default_words, make_word_tokenizer  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "cost_bench.json"


def qwen_half_b() -> ModelHandle:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32_768,
                      tie_word_embeddings=True, attn_implementation="eager")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    words = [str(i) for i in range(100)] + default_words(400) + ["Numbers:", "The", "largest", "number", "is"]
    tok = make_word_tokenizer(words)
    return ModelHandle(spec=ModelSpec("local", "qwen2.5-0.5b-shape-random"), model=model, kind="causal_lm",
                       info=describe(model, "causal_lm"), language_model=model, tokenizer=tok)


def jobs(handle: ModelHandle) -> list[tuple[str, object, object]]:
    prompt = "1 2 3 4 5 6" if handle.info.parameters > 1e8 else "there is a large red circle"
    return [
        ("KV: every policy, 32-token context", kv.analyze,
         kv.KvParams(context=32, budget=12, snap_window=4, morph_window=4, new_tokens=4)),
        ("sharpness: n = 4, 8, 2 prompts each", S.size_sweep, S.SweepParams(ns=[4, 8], samples=2, batch=2)),
        ("reconstruction: 6 tokens, layer 2", inv.reconstruct, inv.AttackParams(prompt=prompt, layer=2)),
    ]


def page_defaults(handle: ModelHandle) -> list[tuple[str, object, object, dict]]:
    return [
        ("KV page default (192-token context)", kv.analyze, kv.KvParams(), {}),
        ("sharpness page default (32 prompts per n)", S.size_sweep, S.SweepParams(), {}),
        ("reconstruction, 12 tokens, middle layer", inv.reconstruct,
         inv.AttackParams(prompt=" ".join(str(i) for i in range(12)), layer=handle.info.layers // 2), {}),
    ]


def measure(name: str, handle: ModelHandle) -> list[dict]:
    rows = []
    t0 = time.perf_counter()
    throughput = cost.calibrate(handle)
    print(f"{name}: calibrated in {time.perf_counter() - t0:.1f} s: {throughput}", file=sys.stderr, flush=True)
    for label, fn, params in jobs(handle):
        if handle.info.parameters < 1e8:
            fn(handle, params)  # first call: lazy imports and allocations (the big model runs after these)
        estimate = cost.estimate(fn, handle, params)
        t1 = time.perf_counter()
        fn(handle, params)
        measured = time.perf_counter() - t1
        rows.append({"model": name, "analysis": label, "estimate_s": round(estimate.seconds, 2),
                     "measured_s": round(measured, 2), "ratio": round(measured / estimate.seconds, 2)})
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-big", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows, defaults = [], []
    if "shapes-lm" in zoo_models():
        rows += measure("shapes-lm", load_model(ModelSpec("zoo", "shapes-lm")))
    if not args.skip_big:
        big = qwen_half_b()
        rows += measure(f"Qwen2.5-0.5B shape ({big.info.parameters / 1e6:.0f} M)", big)
        for label, fn, params, kwargs in page_defaults(big):
            e = cost.estimate(fn, big, params, kwargs)
            defaults.append({"analysis": label, "estimate_s": round(e.seconds, 1), "asks_first": e.long})
    load = os.getloadavg()[0]
    print(f"\nMachine: {os.cpu_count()} cores, torch threads {args.threads}, load average {load:.1f}.\n")
    print("| model | analysis | estimate | measured | measured / estimate |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['analysis']} | {r['estimate_s']:.1f} s | {r['measured_s']:.1f} s | {r['ratio']:.2f} |")
    if defaults:
        print("\n| 0.5 B model, page default | estimate | started on page load? |")
        print("|---|---|---|")
        for d in defaults:
            print(f"| {d['analysis']} | {cost.format_seconds(d['estimate_s'])} | "
                  f"{'no: estimate and Run button' if d['asks_first'] else 'yes'} |")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"load": load, "threads": args.threads, "rows": rows, "defaults": defaults,
                               "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

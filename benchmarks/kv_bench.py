"""KV-cache eviction benchmark: decode-step time per policy relative to plain full-cache eager decoding
(same run), and key-value recall quality per policy and budget on shapes-lm.

    python benchmarks/kv_bench.py [--quick] [--examples 24] [--skip-quality] [--skip-speed] [--variants]

Speed: a manual decode loop without any hook is the baseline; every policy runs through the
eviction runner (hooks, gathers, position bookkeeping) on the same tokens, repeats interleaved, median
per-step time. Models: shapes-lm (when the zoo has it) and a GPT-2-small-shaped random-weight model
built in memory from `GPT2Config()` (no download).
Quality: `budget_sweep` on shapes-lm's key-value recall prompts at 25 / 50 / 75 % of the context, every
policy with its own default settings (H2O half heavy hitters / half recent, SnapKV w = 8 and kernel 5,
MorphKV W = 8 and max fusion, the rule released with the paper, StreamingLLM 4 sinks). The main table holds
every policy at the budget when the answer is predicted (PyramidKV: its official per-layer schedule), each
row checked against what its rule claims; the labelled variants (prefill-only SnapKV/PyramidKV, MorphKV's
8903d2a rule) are printed in a separate table.
Prints markdown tables and writes benchmarks/results/kv_bench.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS, ROOT  # noqa: E402  (every project path comes from analysis/framework/paths.py)

from analysis import kv  # noqa: E402
from analysis.model_access import tiny_models  # noqa: E402
from analysis.model_access.models import ModelHandle, ModelSpec, load_model, zoo_models  # noqa: E402


def gpt2_small_random() -> ModelHandle:
    return tiny_models.gpt2_small_random(with_tokenizer=False)


def plain_decode_times(handle: ModelHandle, tokens: list[int], prompt: int) -> list[float]:
    """Full-cache eager decoding with no hooks at all: the baseline (in inference mode, as the runner)."""
    from transformers import DynamicCache

    lm = handle.language_model
    cache = DynamicCache(config=lm.config)
    times = []
    with handle.session(), torch.inference_mode():
        lm(input_ids=torch.tensor([tokens[:prompt]]), position_ids=torch.arange(prompt)[None], cache=cache,
           use_cache=True, logits_to_keep=1)
        for pos in range(prompt, len(tokens) - 1):
            t0 = time.perf_counter()
            lm(input_ids=torch.tensor([[tokens[pos]]]), position_ids=torch.tensor([[pos]]), cache=cache,
               use_cache=True)
            times.append(time.perf_counter() - t0)
    return times


def speed(handle: ModelHandle, prompt: int, steps: int, budget: int, repeats: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(10, handle.info.vocab_size - 10, (prompt + steps + 1,), generator=g).tolist()
    params = kv.KvParams(budget=budget)
    names = list(kv.POLICIES)
    samples: dict[str, list[float]] = {"baseline": []}
    plain_decode_times(handle, tokens, prompt)  # warm-up
    for _ in range(repeats):
        samples["baseline"] += plain_decode_times(handle, tokens, prompt)[1:]
        for name in names:
            pol = kv.make_policy(params, name)
            trace = kv.run_policy(handle, tokens, prompt, pol)
            samples.setdefault(name, []).extend(trace.step_time[1:])  # step 0 also cuts the prompt
    base = statistics.median(samples["baseline"])
    rows = [{"policy": "plain full-cache eager (no hooks)", "ms_per_step": 1000 * base, "ratio": 1.0}]
    for name in names:
        med = statistics.median(samples[name])
        rows.append({"policy": kv.POLICIES.label(name), "ms_per_step": 1000 * med, "ratio": med / base})
    return rows


def progress_printer(every: float = 30.0):
    """A progress callback that prints to stderr at most every `every` seconds, with the time so far."""
    t0, last = time.time(), [0.0]

    def report(frac: float, text: str) -> None:
        if time.time() - last[0] > every:
            last[0] = time.time()
            print(f"  {frac:.0%} {text} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    return report


def quality(handle: ModelHandle, context: int, pairs: int, examples: int, variants: bool = False) -> dict:
    params = kv.KvParams(context=context, pairs=pairs, queries=1, prefill=0.5, examples=examples,
                         sweep=[0.25, 0.5, 0.75])
    t0 = time.time()
    report = progress_printer()
    names = list(kv.POLICIES) if variants else kv.main_policies()
    sweep = kv.budget_sweep(handle, params, report, names=names)
    settings = {f.name: getattr(kv.make_policy(params, cls.name, 10**6), f.name) for f, cls in kv.POLICIES.settings()}
    return {"context": sweep.context, "pairs": pairs, "prefill": params.prefill, "settings": settings,
            "examples": examples, "equal_entries": True, "full_accuracy": sweep.full_accuracy,
            "seconds": round(time.time() - t0, 1), "points": [p.to_dict() for p in sweep.points]}


def print_speed(title: str, rows: list[dict]) -> None:
    print(f"\n### Decode-step time, {title}\n")
    print("| policy | ms / decode step (median) | ratio to plain full cache |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['policy']} | {r['ms_per_step']:.2f} | {r['ratio']:.2f}x |")


def print_quality(q: dict) -> None:
    print(f"\n### Key-value recall on shapes-lm (context {q['context']} tokens, {q['pairs']} needle(s), half "
          f"prefilled and half read token by token, {q['examples']} prompts; full-cache accuracy "
          f"{q['full_accuracy']:.2f})\n")
    shares = sorted({p["share"] for p in q["points"]})
    head = " | ".join(f"acc @{s:.0%} | KL @{s:.0%} | cache @{s:.0%}" for s in shares)
    names = list(dict.fromkeys(p["policy"] for p in q["points"]))
    main = [n for n in names if n in kv.main_policies()]
    for title, group in (("Equal entries (every policy holds C when the answer is predicted)", main),
                         ("Labelled variants", [n for n in names if n not in main])):
        if not group:
            continue
        print(f"\n{title}\n")
        print(f"| policy | {head} |")
        print("|---|" + "---|" * (3 * len(shares)))
        for name in group:
            cells = []
            for s in shares:
                p = next(p for p in q["points"] if p["policy"] == name and p["share"] == s)
                cells += [f"{p['accuracy']:.2f}", f"{p['mean_kl']:.3f}", f"{p['cache']:.0f}"]
            print(f"| {kv.POLICIES.label(name)} | " + " | ".join(cells) + " |")
    for p in q["points"]:  # every row holds the entries its rule claims (PyramidKV: its official schedule)
        assert abs(p["cache"] - p["claimed"]) < 1e-9, (p["policy"], p["share"], p["cache"], p["claimed"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    ap.add_argument("--examples", type=int, default=24)
    ap.add_argument("--context", type=int, default=192)
    ap.add_argument("--pairs", type=int, default=2, help="needles in each key-value prompt")
    ap.add_argument("--lm", default="zoo:shapes-lm", help="the demo LM (zoo:NAME or local:PATH)")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--variants", action="store_true",
                    help="also sweep the labelled variants (prefill-only SnapKV/PyramidKV, MorphKV 8903d2a rule)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out: dict = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    steps, repeats = (16, 1) if args.quick else (48, 3)
    spec = ModelSpec.parse(args.lm)
    if spec.source != "zoo" or spec.name in zoo_models():
        lm = load_model(spec)
        import hashlib

        weights = Path(lm.path) / "model.safetensors"
        out["shapes_lm"] = {"spec": spec.label, "weights_md5": hashlib.md5(weights.read_bytes()).hexdigest()}
        if not args.skip_speed:
            out["shapes_lm_speed"] = speed(lm, 256, steps, 128, repeats)
            print_speed("shapes-lm (context 256, budget 128)", out["shapes_lm_speed"])
        if not args.skip_quality:
            out["shapes_lm_quality"] = quality(lm, args.context, args.pairs, 4 if args.quick else args.examples,
                                             args.variants)
            print_quality(out["shapes_lm_quality"])
    else:
        print("shapes-lm is not in the zoo yet: skipping its rows")
    if not args.skip_speed:
        gpt2 = gpt2_small_random()
        out["gpt2_small_speed"] = speed(gpt2, 256, steps // 2, 128, repeats)
        print_speed("GPT-2-small-shaped random weights (context 256, budget 128)", out["gpt2_small_speed"])
    target = RESULTS / "kv_bench.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(target.read_text()) if target.is_file() else {}
    target.write_text(json.dumps({**previous, **out}, indent=2))  # --skip-* keeps the last rows of the other part
    print(f"\nwrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Forward time with the adaptive-temperature attention function vs plain eager attention.

    OMP_NUM_THREADS=1 python benchmarks/sharpness_bench.py [--tokens 256] [--repeats 5]

Models: `shapes-lm` from the zoo (when installed) and a GPT-2-small-shaped random-weight model built
in memory from `GPT2Config()` defaults (no download). Each repeat times eager, then the panel's
function in softmax mode, then adaptive θ, interleaved so machine load hits all three alike; the
ratios use medians from the same run. Prints a markdown table and writes
benchmarks/results/sharpness_bench.json.
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

from analysis import sharpness as S  # noqa: E402
from analysis.model_access import tiny_models  # noqa: E402
from analysis.model_access.models import ModelHandle, ModelLoadError, ModelSpec, load_model  # noqa: E402


def gpt2_small_random() -> ModelHandle:
    return tiny_models.gpt2_small_random(with_tokenizer=False)


def time_forwards(handle: ModelHandle, tokens: int, repeats: int) -> dict:
    vocab = handle.info.vocab_size
    ids = torch.randint(0, vocab, (1, min(tokens, handle.info.max_positions or tokens)),
                        generator=torch.Generator().manual_seed(0))

    def eager() -> None:
        with handle.session():
            handle.language_model(input_ids=ids, use_cache=False)

    def softmax_fn() -> None:
        S.tempered_logits(handle, ids, S.Temperature())

    def adaptive() -> None:
        S.tempered_logits(handle, ids, S.Temperature("adaptive"))

    runs = {"eager": eager, "function, softmax": softmax_fn, "function, adaptive θ": adaptive}
    for fn in runs.values():  # warm-up
        fn()
    t0 = time.perf_counter()
    eager()
    # small models: more repeats (at least ~3 s of eager forwards) so the shared machine's noise averages out
    repeats = max(repeats, min(200, int(3.0 / max(time.perf_counter() - t0, 1e-4))))
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    return {
        "model": handle.spec.label, "parameters": handle.info.parameters, "tokens": int(ids.shape[1]),
        "repeats": repeats, "median_s": med, "min_s": best, "all_s": times,
        "ratio_adaptive_vs_eager_min": best["function, adaptive θ"] / best["eager"],
        # each repeat times the three back to back, so a per-repeat ratio sees one machine load
        "ratio_adaptive_vs_eager_paired": statistics.median(
            a / e for a, e in zip(times["function, adaptive θ"], times["eager"])),
        "ratio_softmax_fn_vs_eager": med["function, softmax"] / med["eager"],
        "ratio_adaptive_vs_eager": med["function, adaptive θ"] / med["eager"],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default="zoo:shapes-lm", help="the trained model to time besides GPT-2 small")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    handles = []
    try:
        handles.append(load_model(ModelSpec.parse(args.model)))
    except ModelLoadError as exc:
        print(f"(skipping {args.model}: {exc})")
    handles.append(gpt2_small_random())
    rows = [time_forwards(h, args.tokens, args.repeats) for h in handles]
    print(f"Forward of {args.tokens} tokens (batch 1), median (and best) of >= {args.repeats} interleaved repeats, torch threads "
          f"{torch.get_num_threads()}\n")
    print("| model | params | tokens | repeats | eager (ms) | function, softmax (ms) | adaptive θ (ms) | adaptive / eager: median of paired ratios | ratio of medians | ratio of bests |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        m = r["median_s"]
        print(f"| {r['model']} | {r['parameters'] / 1e6:.1f} M | {r['tokens']} | {r['repeats']} | {m['eager'] * 1e3:.1f} "
              f"| {m['function, softmax'] * 1e3:.1f} | {m['function, adaptive θ'] * 1e3:.1f} "
              f"| **{r['ratio_adaptive_vs_eager_paired']:.2f}x** | {r['ratio_adaptive_vs_eager']:.2f}x "
              f"| {r['ratio_adaptive_vs_eager_min']:.2f}x |")
    out = RESULTS / "sharpness_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"tokens": args.tokens, "repeats": args.repeats, "threads": torch.get_num_threads(),
                               "rows": rows, "goal_ratio": 1.3}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

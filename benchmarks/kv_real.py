"""The KV panel on a real instruct model: its default analyses timed against the plain forwards they need
(same run, repeats interleaved), the cost estimate against the measured time, and the full cache's
accuracy on the natural-language recall task.

    python benchmarks/kv_real.py --lm zoo:smollm2-135m-instruct [--repeats 2] [--accuracy 16] [--sweep 8]

Times are CPU seconds of this process (one torch thread; steadier than wall time on a machine shared
with other jobs) and wall seconds, floor and analysis interleaved `--repeats` times. The floor replays
every forward an analysis makes (recorded with a pre-hook: its input length and
whether it starts a new cache) with transformers' default attention and a plain DynamicCache: the same
number of forwards on inputs of the same lengths, without eviction (a full cache attends to more
entries, so the floor is, if anything, generous to the analysis). Writes benchmarks/results/kv_real.json.
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
from benchmarks.result_names import result_name  # noqa: E402

from analysis.framework import cost  # noqa: E402
from analysis import kv
from analysis.model_access.models import ModelHandle, ModelSpec, load_model  # noqa: E402


def record_forwards(handle: ModelHandle, fn) -> list[tuple[int, bool]]:
    """(input tokens, starts a new cache) of every forward `fn()` makes, in order."""
    calls = []

    def pre(module, args, kwargs):
        ids = kwargs.get("input_ids")
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        calls.append((ids.shape[1], cache is None or cache.get_seq_length() == 0))

    hook = handle.language_model.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        fn()
    finally:
        hook.remove()
    return calls


def replay(handle: ModelHandle, calls: list[tuple[int, bool]]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) for the same forwards, plain: default attention, a growing
    DynamicCache, no hooks."""
    from transformers import DynamicCache

    lm, vocab = handle.language_model, handle.info.vocab_size
    g = torch.Generator().manual_seed(0)
    c0, t0 = time.process_time(), time.perf_counter()
    with handle.session(), torch.inference_mode():
        cache, pos = None, 0
        for n, fresh in calls:
            if fresh or cache is None:
                cache, pos = DynamicCache(config=lm.config), 0
            ids = torch.randint(10, vocab - 10, (1, n), generator=g)
            lm(input_ids=ids, position_ids=torch.arange(pos, pos + n)[None], cache=cache, use_cache=True,
               logits_to_keep=1)
            pos += n
    return time.process_time() - c0, time.perf_counter() - t0


def timed(fn) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of fn(): on a machine shared with other jobs the CPU time of this one
    process (one torch thread) is the steadier measure; the wall time is what a user waits."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - t0


def speed(handle: ModelHandle, name: str, fn, run, params, repeats: int) -> dict:
    calls = record_forwards(handle, lambda: fn(handle, params))
    floors, runs = [], []
    estimates = []
    for _ in range(repeats):  # interleaved: the machine's load hits both alike
        floors.append(replay(handle, calls))
        cost._calibrated.pop(cost.calibration_key(handle), None)  # priced at this moment's load
        estimates.append(float(cost.estimate(run, handle, params).seconds))
        runs.append(timed(lambda: fn(handle, params)))
    cpu_floor, cpu = statistics.median(f[0] for f in floors), statistics.median(r[0] for r in runs)
    wall_floor, wall = statistics.median(f[1] for f in floors), statistics.median(r[1] for r in runs)
    estimate = statistics.median(estimates)
    return {"analysis": name, "forwards": len(calls), "tokens": sum(n for n, _ in calls),
            "floor_cpu_s": round(cpu_floor, 2), "cpu_s": round(cpu, 2), "ratio_cpu": round(cpu / cpu_floor, 3),
            "floor_wall_s": round(wall_floor, 2), "wall_s": round(wall, 2), "ratio_wall": round(wall / wall_floor, 3),
            "estimate_s": round(estimate, 2), "estimate_over_wall": round(estimate / wall, 3),
            "floors": [[round(x, 2) for x in f] for f in floors], "runs": [[round(x, 2) for x in r] for r in runs],
            "estimates": [round(x, 2) for x in estimates]}


def full_accuracy(handle: ModelHandle, params: kv.KvParams, prompts: int) -> dict:
    """The full cache's teacher-forced accuracy on the recall task (one plain forward per prompt)."""
    hits = total = 0
    per_seed = []
    for seed in range(params.seed, params.seed + prompts):
        task = kv.build_task(handle, params, seed=seed)
        with handle.session(), torch.inference_mode():
            logits = handle.language_model(input_ids=torch.tensor([task.tokens])).logits[0]
        right = [int(logits[a - 1].argmax()) == task.tokens[a] for a in task.answer_positions]
        hits += sum(right)
        total += len(right)
        per_seed.append(all(right))
    return {"prompts": prompts, "context": params.context, "pairs": params.pairs, "queries": params.queries,
            "accuracy": hits / total, "prompt_right": per_seed, "source": task.source, "tokens": len(task.tokens)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lm", required=True)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--accuracy", type=int, default=16, help="prompts for the full cache's recall accuracy")
    ap.add_argument("--sweep", type=int, default=0, help="prompts for a retrieval budget sweep (0: none)")
    ap.add_argument("--context", type=int, default=96, help="the page's default on a model this size")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    handle = load_model(ModelSpec.parse(args.lm))
    retrieval = kv.KvParams(context=args.context)
    long = kv.KvParams(task="long-response")
    out = {"model": result_name(args.lm), "threads": torch.get_num_threads(), "torch": torch.__version__}
    if args.accuracy:
        out["accuracy"] = full_accuracy(handle, retrieval, args.accuracy)
        print(json.dumps(out["accuracy"]), flush=True)
    out["speed"] = [speed(handle, "analyze (retrieval, page default)", kv.analyze, kv.analyze, retrieval, args.repeats),
                    speed(handle, "long_response (page default)", kv.long_response, kv.long_response, long,
                          args.repeats)]
    for row in out["speed"]:
        print(json.dumps(row), flush=True)
    if args.sweep:
        sweep = kv.budget_sweep(handle, kv.KvParams(context=args.context, examples=args.sweep),
                                names=kv.main_policies())
        out["sweep"] = {"context": sweep.context, "examples": args.sweep, "full_accuracy": sweep.full_accuracy,
                        "points": [p.to_dict() for p in sweep.points]}
        for p in sweep.points:
            v = p.values
            print(f"{p.policy} {p.share:.0%} C={p.budget} acc {v['accuracy']:.2f} KL {v['mean_kl']:.3f} held {v['cache']:g}",
                  flush=True)
    target = RESULTS / "kv_real.json"
    previous = json.loads(target.read_text()) if target.is_file() else {}
    target.write_text(json.dumps({**previous, **out}, indent=2))  # a run without --accuracy keeps the last one
    print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

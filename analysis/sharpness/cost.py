"""How much work a sharpness analysis is, counted from its settings (analysis/framework/cost.py prices it)."""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

from analysis.framework.cost import Work, forward_bytes
from analysis.model_access.models import ModelHandle
from analysis.sharpness.params import SweepParams, validate_params
from analysis.sharpness.prompt import PromptParams, prompt_ids
from analysis.sharpness.scoring import tree_nodes
from analysis.sharpness.sweep import chunks, prompt_builder, prompts_for

# The temperature attention function with its recorder, against a plain eager call: the extra per-call
# Python work and the second softmax pass of the adaptive rule.
TEMPERATURE_OVERHEAD = 1.5
# Memory, fitted to peak resident growth (benchmarks/memory_bench.py: shapes-lm n = 256 x 64, SmolLM2 n = 32
# x 8 and n = 128 x 4): attention score tensors alive at once in a tempered forward (the scores, the tempered
# softmax, the packed tree's float mask), and what stays per layer until the forward ends, in units of the
# residual stream (rows x tokens x d floats): 1.4 of it per layer, measured (30 layers of SmolLM2: +257 MB).
TEMPERATURE_COPIES = 2.5
KEPT_PER_LAYER = 1.4
# A forward whose attention scores of one layer (rows x heads x length^2 floats) do not fit in the last-level cache
# runs its attention from memory: its pairs cost this many times more (shapes-lm, 4 heads of 32: 97 ns a pair at
# 4 x 512 tokens, 17 MB of scores; 466 ns at 8 x 512, 34 MB; fitted on sharpness at n = 256 x 64 prompts, 288 MB a
# layer: estimated 1.4 s and measured 2.4-2.6 s of CPU before, on a 32 MB L3).
SPILLED_ATTENTION = 2.5
CACHE_FALLBACK = 32 * 2**20  # bytes, where the system does not say


def cache_bytes() -> int:
    """The last-level CPU cache's size in bytes (Linux sysfs), else CACHE_FALLBACK."""
    from pathlib import Path

    best = (0, 0)
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level, size = int((index / "level").read_text()), (index / "size").read_text().strip()
            units = {"K": 2**10, "M": 2**20, "G": 2**30}
            best = max(best, (level, int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)))
        except (OSError, ValueError):
            continue
    return best[1] or CACHE_FALLBACK


# Prompts built to count the work, over all n together: more prompts per n are extrapolated from these,
# so that estimating costs the same for 32 prompts as for 10,000 (#50: an estimate took 620 s).
SAMPLE_PROMPTS = 256


def _sample_size(params: SweepParams) -> int:
    return min(params.samples, max(2, SAMPLE_PROMPTS // max(1, len(set(params.ns)))))


def sweep_work(handle: ModelHandle, params: SweepParams, kwargs: dict) -> Work:
    """`size_sweep`: per n, every rule over the prompts, one forward per chunk of equal-length prompts,
    each row the prompt plus its chunk's candidate tree. Settings the sweep refuses are refused here.
    Counted exactly from the prompts themselves up to `_sample_size` prompts per n, beyond it from that
    many (their lengths scaled to the requested count); an n whose first prompt does not fit ends the
    count (larger n fit even less)."""
    validate_params(params, handle.info.layers)
    build = prompt_builder(handle.tokenizer)
    limit = handle.info.max_positions or 4096
    rules = len(params.temperatures())
    sample = _sample_size(params)
    cache = cache_bytes()
    work = Work()
    for n in sorted(set(params.ns)):
        if n > limit or prompts_for(build, n, dataclasses.replace(params, samples=1), limit) is None:
            if n > limit:
                break  # every item takes a token at least: this n and every larger one cannot fit
            continue
        prompts = prompts_for(build, n, dataclasses.replace(params, samples=sample), limit)
        if prompts is None:
            continue
        scale = params.samples / len(prompts)
        for chunk, count in _scaled_chunks(prompts, params.batch, scale):
            rows, extra = len(chunk), len(tree_nodes(chunk))
            length = len(chunk[0].input_ids) + extra
            spilled = SPILLED_ATTENTION if rows * handle.info.heads * length ** 2 * 4 > cache else 1.0
            work.add(calls=count, tokens=rows * length * count, logits=rows * extra * count,
                     overhead=(TEMPERATURE_OVERHEAD - 1) * count,
                     attended=rows * length * (length + 1) / 2 * TEMPERATURE_OVERHEAD * spilled * count, times=rules,
                     peak=_peak(handle, rows, length, logits=rows * (extra + 1) * 2))
    return work


def _peak(handle: ModelHandle, rows: int, length: int, logits: int) -> float:
    """Bytes at the peak of one tempered forward (see TEMPERATURE_COPIES, KEPT_PER_LAYER)."""
    kept = handle.info.layers * rows * length * handle.info.hidden_size * 4 * KEPT_PER_LAYER
    return forward_bytes(handle, rows, length, logits=logits, copies=TEMPERATURE_COPIES) + kept


def _scaled_chunks(prompts: list, batch: int, scale: float) -> list[tuple[list, float]]:
    """(a chunk, how many forwards like it): the sweep's own chunks when nothing is scaled; else per length
    of the sample, its prompts' share of the requested count in chunks of at most `batch`."""
    if scale == 1:
        return [(chunk, 1) for chunk in chunks(prompts, batch)]
    by_len: dict[int, list] = defaultdict(list)
    for p in prompts:
        by_len[len(p.input_ids)].append(p)
    out = []
    for group in by_len.values():
        count = len(group) * scale
        forwards = math.ceil(count / batch)
        rows = min(batch, math.ceil(count / forwards))
        chunk = (group * math.ceil(rows / len(group)))[:rows]
        out.append((chunk, forwards))
    return out


def prompt_work(handle: ModelHandle, params: PromptParams, kwargs: dict) -> Work:
    """`analyse_prompt`: the prompt under softmax and under the chosen rule."""
    n = len(prompt_ids(handle.tokenizer, params.text))
    return Work().add(calls=1, tokens=n, attended=n * (n + 1) / 2 * TEMPERATURE_OVERHEAD,
                      overhead=TEMPERATURE_OVERHEAD - 1, times=2,
                      peak=_peak(handle, 1, n, logits=n))

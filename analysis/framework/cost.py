"""How long an analysis will take here, before it starts: model size x settings / measured speed.

Every analysis is a sequence of forward passes. Its cost is estimated as

    seconds = calls · a + tokens · b + attended · c + rows · r + patches · v + seconds elsewhere

with `calls` forward calls, `tokens` tokens pushed through them, `attended` (query, key) pairs
of attention, `rows` passes over one row of the input-embedding table (ranking the whole
vocabulary, as the reconstruction attack does at every position: on a 152 k-word vocabulary that
costs more than the forwards) and `patches` image patches through a VLM's vision tower, counted
from the settings without running the model (`estimate_work`). `a` (seconds
per call: Python and per-layer overhead) and `b` (seconds per token: the weights' matmuls) are
measured on this machine with a few tiny forwards of the loaded model (`calibrate`, cached per
model); `c` and `v` follow from `b` by counting FLOPs (a token's matmuls cost 2 · non-embedding
parameters; one attended pair costs 4 · layers · heads · head_dim; a patch costs 2 · the vision tower's
and projector's parameters); `r` is timed on the model's embedding table (one elementwise pass over
up to 16 k of its rows). Work done by another model (caption correction's decomposer/rewriter LM)
is priced with that model's own calibration and carried as seconds. Pages refuse to start work estimated above
`LIMIT_S` on page load: they show the estimate and a button instead. `benchmarks/cold_bench.py
--cost` and tests/page/test_cost.py compare estimates with measured times.
"""
from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from analysis.model_access import anatomy
from analysis.model_access.model_lock import activity, current_activity
from analysis.model_access.models import ModelHandle

LIMIT_S = 10.0  # work expected to take longer is not started without the user asking
EAGER_ATTENTION_OVERHEAD = 3.0  # eager softmax attention runs well below the matmul FLOP rate
BACKWARD = 3.0  # a forward plus backward costs about three forwards
# A forward plus a backward for the input's gradient alone costs about two: Captum's Integrated
# Gradients asks autograd for the pixels' gradient only, so no weight gradient is computed (0.5 B VLM:
# 3 grounded claims measured 0.65 of the estimate with BACKWARD, 0.96-1.04 with this).
INPUT_GRADIENT = 2.0


@dataclass(frozen=True)
class Throughput:
    per_call: float  # a: seconds per forward call (batch 1, one token)
    per_token: float  # b: seconds per token of the weights' matmuls
    per_pair: float  # c: seconds per attended (query, key) pair
    per_logit: float  # seconds per extra position whose next-token logits are computed
    model: str
    per_row: float = 0.0  # r: seconds per elementwise pass over one row of the embedding table
    per_call_fixed: float = 0.0  # the part of `per_call` a forward pays even when stopped after one block
    per_patch: float = 0.0  # v: seconds per image patch through a VLM's vision tower and projector


@dataclass
class Work:
    calls: float = 0.0
    tokens: float = 0.0
    attended: float = 0.0  # (query, key) pairs over the layers that run, summed over calls
    logits: float = 0.0  # positions with next-token logits beyond the last one of each call
    overhead: float = 0.0  # extra per-call costs (hooks, custom attention), in units of one call
    rows: float = 0.0  # elementwise passes over one embedding-table row (vocabulary rankings)
    # Forwards stopped after a share δ of the layers count δ in `calls` and 1 − δ here: they still
    # pay a call's fixed part (embedding, masks, Python), which dominates on a small model.
    cut: float = 0.0
    patches: float = 0.0  # image patches through the vision tower (a VLM's images)
    seconds_elsewhere: float = 0.0  # work on another model, priced with that model's calibration
    # Memory (bytes): `peak` the largest working set of one step (a forward's activations and attention
    # scores), combined by max; `held` what the run keeps until it ends (collected activations, codes),
    # summed. 0 and 0: derived from the mean forward (`Estimate.mb`).
    peak: float = 0.0
    held: float = 0.0

    def add(self, calls: float = 0.0, tokens: float = 0.0, attended: float = 0.0, logits: float = 0.0,
            overhead: float = 0.0, rows: float = 0.0, cut: float = 0.0, patches: float = 0.0,
            seconds_elsewhere: float = 0.0, peak: float = 0.0, held: float = 0.0, times: float = 1.0) -> "Work":
        self.calls += calls * times
        self.tokens += tokens * times
        self.attended += attended * times
        self.logits += logits * times
        self.overhead += overhead * times
        self.rows += rows * times
        self.cut += cut * times
        self.patches += patches * times
        self.seconds_elsewhere += seconds_elsewhere * times
        self.peak = max(self.peak, peak)  # steps run one after another: their working sets do not add up
        self.held += held
        return self

    def stopped(self, calls: float, depth: float, tokens: float = 0.0, attended: float = 0.0,
                rows: float = 0.0) -> "Work":
        """`calls` forwards stopped after a share `depth` of the layers (`tokens`, `attended` in full)."""
        return self.add(calls=calls * depth, cut=calls * (1 - depth), tokens=tokens * depth,
                        attended=attended * depth, rows=rows)

    def seconds(self, t: Throughput) -> float:
        return ((self.calls + self.overhead) * t.per_call + self.tokens * t.per_token
                + self.attended * t.per_pair + self.logits * t.per_logit + self.rows * t.per_row
                + self.cut * t.per_call_fixed + self.patches * t.per_patch + self.seconds_elsewhere)


@dataclass(frozen=True)
class Estimate:
    seconds: float
    work: Work
    throughput: Throughput
    mb: float = 0.0  # peak memory the run adds to the server, in MiB (`memory_mb`)

    @property
    def long(self) -> bool:
        return self.seconds > LIMIT_S

    def range(self) -> tuple[float, float]:
        """(low, high) seconds: the spread of measured / estimated in the calibration table (TIME_RANGE)."""
        return self.seconds * TIME_RANGE[0], self.seconds * TIME_RANGE[1]

    def text(self) -> str:
        return f"about {format_range(*self.range())}"


# Measured / estimated time over the calibration runs (docs/performance.md, "Estimates against measured
# runs"): the range a page shows around an estimate.
TIME_RANGE = (0.7, 1.4)


def format_range(low: float, high: float) -> str:
    """'20–35 s', '2–4 min', '50 s–2 min': a range in the unit of each end, the shared unit written once."""
    a, b = format_seconds(low), format_seconds(high)
    if a == b:
        return a
    if low < 1:
        return f"up to {b}"
    unit_a, unit_b = a.rsplit(" ", 1)[-1], b.rsplit(" ", 1)[-1]
    if unit_a == unit_b:
        return f"{a.rsplit(' ', 1)[0]}–{b}"
    return f"{a}–{b}"


LARGE_MODEL = 1e8  # parameters above which pages start from smaller default settings


def default_for(handle: ModelHandle, small_model: Any, large_model: Any) -> Any:
    """A page's default setting: `large_model` (smaller work) for models above LARGE_MODEL parameters."""
    return large_model if handle.info.parameters > LARGE_MODEL else small_model


def format_seconds(s: float) -> str:
    if s < 1:
        return "under a second"
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


# ---------------------------------------------------------------------------------------------
# Measuring this machine on the loaded model

_calibrated: dict[tuple, "_Calibration"] = {}
_cal_lock = threading.Lock()
# A calibration whose thread got less than this share of a CPU (other sessions' work, a burst of
# users) is slowed by the crowd, not by the model: it stands until RECALIBRATE_AFTER_S have passed,
# then the next estimate measures again and keeps the faster reading of each kind. Measured on
# shapes-lm beside six busy threads: share 0.08, per-token time 30x and per-call time 100x the idle
# reading (share 0.99–1.0), which, kept for the server's life, made small runs ask for a click.
BUSY_SHARE = 0.5
RECALIBRATE_AFTER_S = 30.0


@dataclass
class _Calibration:
    throughput: Throughput
    at: float  # _clock() when measured
    share: float  # CPU time of the measuring thread / wall time


def _clock() -> float:
    return time.monotonic()


def calibration_key(handle: ModelHandle) -> tuple:
    """What a calibration is kept under: the model as named and its size, dtype and device, not the
    Python object. Every load of the same model runs at the same speed, so a reading taken once (at
    server start, by scripts/serve.py, while the machine is idle) serves the copy the sessions load
    later, and a model reloaded after the cache dropped it is not measured again."""
    return handle.spec.label, handle.info.parameters, handle.info.dtype, str(handle.device)


def param_split(handle: ModelHandle) -> tuple[int, int]:
    """(parameters every token goes through, output-head parameters): embedding lookups cost nothing."""
    lm = handle.language_model
    embed = lm.get_input_embeddings()
    total = sum(p.numel() for p in lm.parameters())
    head = lm.get_output_embeddings()
    head_n = head.weight.numel() if head is not None else embed.weight.numel()
    tied = head is not None and head.weight is embed.weight
    body = total - embed.weight.numel() - (0 if tied or head is None else head_n)
    return max(1, body), head_n


def calibrate(handle: ModelHandle, repeats: int = 5) -> Throughput:
    """Time forwards of one token and of a batch of tokens (median of `repeats`), once per model (`calibration_key`).

    The batch has about 3e8 / parameters tokens (32 to 512): enough that the weights' matmuls, not
    per-call overhead, dominate it, and short (about a second) even for a 0.5 B model."""
    if getattr(handle, "remote", None) is not None:  # weights on NDIF: nothing here to time
        return handle.remote.throughput(handle.spec.label)
    key = calibration_key(handle)
    with _cal_lock:
        known = _calibrated.get(key)
        if known is not None and (known.share >= BUSY_SHARE or _clock() - known.at < RECALIBRATE_AFTER_S):
            return known.throughput
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    result = _measure(handle, repeats)
    share = (time.thread_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)
    if known is not None:  # a crowd only ever slows a reading down: keep the faster of each
        result = dataclasses.replace(result, **{f.name: min(getattr(result, f.name), getattr(known.throughput, f.name))
                                                for f in dataclasses.fields(Throughput) if f.name != "model"})
        share = max(share, known.share)
    with _cal_lock:
        _calibrated[key] = _Calibration(result, _clock(), share)
    return result


def _measure(handle: ModelHandle, repeats: int) -> Throughput:
    """One calibration: the timed forwards of `calibrate`."""
    lm = handle.language_model
    body, head = param_split(handle)
    vocab = min(int(handle.info.vocab_size), 1000)
    gen = torch.Generator().manual_seed(0)
    width = min(64, handle.info.max_positions or 64)
    batch = max(1, min(512, max(32, int(3e8 / body))) // width)

    def timed(shape: tuple[int, int]) -> float:
        ids = torch.randint(0, vocab, shape, generator=gen).to(handle.device)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            try:
                lm(input_ids=ids, use_cache=False, logits_to_keep=1)
            except anatomy.StopForward:
                pass
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    # named for others waiting; while it waits itself, the caller's queue notice is shown
    with activity("measuring this machine's speed", current_activity()[1]), handle.patch() as patch, \
            torch.no_grad():
        timed((1, 1))  # warm-up (the first call allocates)
        one, many = timed((1, 1)), timed((batch, width))
        anatomy.Capture(0).attach(patch, lm)  # now every forward stops after the first block
        first = timed((1, 1))
    per_row = _row_pass_seconds(lm, repeats)
    n_layers = max(1, handle.info.layers)
    per_layer = max(one - first, 0.0) / max(1, n_layers - 1)
    fixed = min(max(first - per_layer, 0.0), one)
    n_many = batch * width
    per_token = max((many - one) / (n_many - 1), 1e-9)
    info = handle.info
    flops_pair = 4.0 * info.layers * info.heads * info.head_dim
    per_pair = per_token * flops_pair / (2.0 * body) * EAGER_ATTENTION_OVERHEAD
    vision = anatomy.vision_parameters(handle) if handle.kind == "vlm" else 0
    return Throughput(per_call=max(one - per_token, 1e-6), per_token=per_token, per_pair=per_pair,
                      per_logit=per_token * head / body, model=handle.spec.label, per_row=per_row,
                      per_call_fixed=fixed, per_patch=per_token * vision / body)


def _row_pass_seconds(lm, repeats: int = 3, rows: int = 16_384) -> float:
    """Seconds per row of one elementwise pass over the input-embedding table (a slice of it)."""
    table = lm.get_input_embeddings().weight.detach()
    part = table[:rows].float()
    part * 1.0001  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        part * 1.0001
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / max(1, len(part))


# ---------------------------------------------------------------------------------------------
# Counting work from the settings: each panel declares a work count per run function
# (`Run(fn, estimate)` in its ANALYSIS, analysis/framework/panels.py)


def estimate_work(fn: Callable, handle: ModelHandle, params: Any, kwargs: dict | None = None) -> Work:
    """Forward calls, tokens and attended pairs the analysis will run.

    Raises MissingEstimator when no panel declares `fn` (the runner then asks before starting: the gate
    fails closed), and the estimator's own UserError for bad settings (the analysis reports the same)."""
    from analysis.framework import panels

    return panels.run_for(fn).estimate(handle, params, dict(kwargs or {}))


def estimate(fn: Callable, handle: ModelHandle, params: Any, kwargs: dict | None = None) -> Estimate:
    work = estimate_work(fn, handle, params, kwargs)
    t = calibrate(handle)
    return Estimate(seconds=work.seconds(t), work=work, throughput=t, mb=memory_mb(work, handle))


# ---------------------------------------------------------------------------------------------
# Memory: what a run adds to the server's resident memory at its peak, from the same counts
#
#     MiB = RUN_OVERHEAD_MB + (peak + held) / 2^20
#
# `peak`: the largest step's working set; a forward without gradients frees each layer's temporaries
# before the next, so one layer's (the residual stream, its norm, q/k/v/o, the MLP's up/gate/act: about
# 4 d + 3 d_ff values per token) plus the attention scores and their softmax (eager: heads x queries x
# keys, ATTENTION_COPIES of them) plus the logits it returns (float32 over the vocabulary). `held`: what
# the run accumulates (a panel's estimator counts it). Calibrated against peak resident memory measured
# in a fresh process per run (benchmarks/memory_bench.py; table in docs/performance.md).

MIB = float(2 ** 20)
# Fitted to the peak resident growth of plain eager forwards (benchmarks/memory_bench.py): SmolLM2 8 x 333
# tokens +274 MB, shapes-lm sharpness 64 x 260: one layer's temporaries count about 3 times (the allocator
# keeps freed blocks for reuse, the MLP's gate, up and product live together), the scores about 2.2 times.
ACTIVATION_COPIES = 3.0
ATTENTION_COPIES = 2.2
RUN_OVERHEAD_MB = 10.0  # allocator arenas, Python objects and the result of any run (measured: tiny runs)


def element_bytes(handle: ModelHandle) -> int:
    return 2 if "16" in str(handle.info.dtype) else 4


def _intermediate(handle: ModelHandle) -> int:
    config = handle.language_model.config
    config = getattr(config, "text_config", None) or config
    return int(getattr(config, "intermediate_size", None) or 4 * handle.info.hidden_size)


def forward_bytes(handle: ModelHandle, rows: float, length: float, keys: float | None = None,
                  logits: float = 0.0, copies: float = ATTENTION_COPIES) -> float:
    """The working set of one forward of `rows` sequences of `length` new tokens attending to `keys`
    positions each (default: causal over `length`), returning `logits` positions' logits (all rows)."""
    info = handle.info
    keys = length if keys is None else keys
    e = element_bytes(handle)
    layer = rows * length * (4 * info.hidden_size + 3 * _intermediate(handle)) * e * ACTIVATION_COPIES
    scores = rows * info.heads * length * keys * 4 * copies  # softmax is taken in float32
    return layer + scores + logits * info.vocab_size * 4


def memory_mb(work: Work, handle: ModelHandle) -> float:
    """Peak MiB a run adds to the server: its estimator's `peak` and `held`, or, where it counted none,
    the mean forward of its work (tokens and attended pairs per call)."""
    if getattr(handle, "remote", None) is not None:  # the weights and activations live on NDIF
        return RUN_OVERHEAD_MB + work.held / MIB
    peak = work.peak
    if not peak and work.calls:
        per_call = work.tokens / work.calls
        pairs = work.attended / work.calls
        info = handle.info
        peak = (per_call * (4 * info.hidden_size + 3 * _intermediate(handle)) * element_bytes(handle) * ACTIVATION_COPIES
                + pairs * 2 * info.heads * 4 * ATTENTION_COPIES  # attended counts half the causal square
                + (1 + work.logits / work.calls) * info.vocab_size * 4)
    return RUN_OVERHEAD_MB + (peak + work.held) / MIB


def release_memory() -> None:
    """After heavy work: collect its cycles and hand freed heap pages back to the system (glibc's
    malloc_trim), so that a finished run's peak does not stay resident."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the allocator keeps its pages, nothing else to do
        pass


def sequence(prefill: int, total: int, *, overhead: float = 1.0, generate: int = 0) -> Work:
    """A prefill of `prefill` tokens then one call per further token (decode with a growing cache)."""
    steps = max(0, total + generate - 1 - prefill)
    w = Work(calls=1, tokens=prefill, attended=prefill * (prefill + 1) / 2)
    # decode step k attends to prefill + k entries (an upper bound when a policy evicts)
    w.add(calls=steps, tokens=steps, attended=steps * prefill + steps * (steps + 1) / 2,
          overhead=(1 + steps) * (overhead - 1))
    return w


def continuation(start: int, generate: int, *, overhead: float = 1.0) -> Work:
    """`generate` greedy tokens continued from a cache that has read `start` tokens: the first comes with
    the forward that read the last of them, each further one costs a call."""
    steps = max(0, generate - 1)
    return Work(calls=steps, tokens=steps, attended=steps * start + steps * (steps + 1) / 2,
                overhead=steps * (overhead - 1))

"""One cached run of an analysis: the same settings on the same model compute once for everyone.

    result = cached_run("attack", inv.reconstruct, handle, params, label="Reconstructing")

calls `inv.reconstruct(handle, params, progress=report)` the first time, drawing a progress bar, and
returns the stored result afterwards (also to other sessions). The store is a bounded LRU shared by
the whole server (`st.cache_data` cannot replay a progress bar drawn outside the cached function, so
it is not used here). When another session is already computing the same key, this one waits for
that result instead of starting the same work again.

On a miss the run is first looked up among the results shipped with the app (`precomputed`:
`python scripts/warm.py` stores every default view's and preset's runs, fingerprinted by the model's
weights and the settings), then estimated (`analysis/framework/cost.py`): long work waits for a click, runs
with a progress bar showing the time left and a Stop button, and says when it is queued behind
another user's analysis on the shared model (`analysis/model_access/model_lock.py`).

An analysis that also uses other models (caption correction: a captioner, a decomposer/rewriter LM)
names them in `models={"lm": lm_handle}`: they are passed to it as keyword arguments, their labels
are part of the key and their weights part of a shipped result's fingerprint. A result computed
outside `cached_run` (from other cached steps) can still be shared and shipped with `remember(...)`.
Work a page runs itself (a `st.cache_data` step, e.g. an uploaded image's) asks first through
`confirm(...)`: the same estimate and Run button, without storing the result.

Extension points, keyed on the same `RunKey`:
- `add_source(fn)`: `fn(key, handle, params, models) -> result | None`, asked on a miss before computing;
- `add_guard(fn)`: `fn(key, handle, params) -> None`, called before computing; it may show a
  message and `st.stop()`;
- `add_sink(fn)`: told every computed result (the warm command stores them).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple

import streamlit as st

from analysis.framework import cost, precompute
from analysis.framework.errors import UserError
from analysis.model_access.model_lock import activity
from analysis.framework.progress import Progress
from components import limits

MAX_ENTRIES = 48
log = logging.getLogger(__name__)


class RunKey(NamedTuple):
    kind: str  # which analysis ("attack", "sweep", ...): one result type per kind
    model: str  # the model's label
    params: str  # the settings, as JSON
    extra: str  # keyword arguments passed to the analysis, as a stable repr


@dataclass
class RunStore:
    """A bounded LRU of results plus the keys being computed right now."""

    max_entries: int = MAX_ENTRIES
    lock: threading.Lock = field(default_factory=threading.Lock)
    entries: OrderedDict = field(default_factory=OrderedDict)
    running: dict = field(default_factory=dict)  # RunKey -> threading.Event, set when done

    def get(self, key: RunKey) -> Any | None:
        with self.lock:
            if key in self.entries:
                self.entries.move_to_end(key)
                return self.entries[key]
        return None

    def put(self, key: RunKey, value: Any) -> None:
        with self.lock:
            self.entries[key] = value
            self.entries.move_to_end(key)
            while len(self.entries) > self.max_entries:
                self.entries.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()


@st.cache_resource(max_entries=1)
def run_store() -> RunStore:
    return RunStore()


_SOURCES: list[Callable[[RunKey, Any, Any], Any]] = []
_GUARDS: list[Callable[[RunKey, Any, Any], None]] = []
_SINKS: list[Callable[..., None]] = []
# Runs estimated longer than this wait for the user's click. MODEL_INSPECTOR_ASK_ABOVE_S changes it
# ("inf": run everything at once, as the warm command and the page tests do).
ASK_ABOVE_S = float(os.environ.get("MODEL_INSPECTOR_ASK_ABOVE_S", cost.LIMIT_S))
# Runs estimated longer than this are not one click away: the page says what the run will do and its Run
# button waits for a tick in "I understand" (#47: "Run it (about 13.2 h)" was one click).
CONFIRM_ABOVE_S = 600.0
RUN_ON_DEMAND = False  # True: on-demand sections run without their button (the warm command's --extras)


def add_source(fn: Callable[..., Any]) -> None:
    """Ask `fn(key, handle, params, models)` for a ready result on a miss (None: not available)."""
    if fn not in _SOURCES:
        _SOURCES.append(fn)


def remove_source(fn: Callable[[RunKey, Any, Any], Any]) -> None:
    if fn in _SOURCES:
        _SOURCES.remove(fn)


def add_guard(fn: Callable[[RunKey, Any, Any], None]) -> None:
    """Call `fn(key, handle, params)` before computing; it may stop the page."""
    if fn not in _GUARDS:
        _GUARDS.append(fn)


def add_sink(fn: Callable[..., None]) -> None:
    """Call `fn(key, handle, params, analysis, kwargs, result, seconds, models)` after each computation."""
    if fn not in _SINKS:
        _SINKS.append(fn)


def helpers(models: dict | None) -> dict[str, tuple[str, str]]:
    """The other models of a run as precompute's helpers: keyword -> (label, weights folder)."""
    return {name: (h.spec.label, getattr(h, "path", "")) for name, h in (models or {}).items()}


def precomputed(key: RunKey, handle, params, models: dict | None = None) -> Any | None:
    """A result computed ahead (`python scripts/warm.py`) for exactly these models' weights and settings."""
    if not getattr(handle, "path", ""):
        return None
    return precompute.lookup(key.kind, key.model, key.params, key.extra, handle.path, helpers=helpers(models))


add_source(precomputed)
add_guard(limits.check_run)  # the deployment's limits: longest prompt, runs per visitor per minute


def _as_json(params: Any) -> str:
    return params.to_json() if hasattr(params, "to_json") else repr(params)


def run_key(kind: str, handle, params: Any, models: dict | None = None, **kwargs) -> RunKey:
    extra = repr(sorted(kwargs.items()))
    if models:
        extra += " with " + repr(sorted((name, h.spec.label) for name, h in models.items()))
    return RunKey(kind, handle.spec.label, _as_json(params), extra)


def _widget_key(prefix: str, key: RunKey) -> str:
    return f"{prefix}_{hashlib.sha256(repr(key).encode()).hexdigest()[:12]}"


def ready(kind: str, handle, params: Any, models: dict | None = None, **kwargs) -> Any | None:
    """The result if it is already known (computed in this server or shipped), without computing."""
    key = run_key(kind, handle, params, models, **kwargs)
    hit = run_store().get(key)
    if hit is not None:
        return hit
    for source in _SOURCES:
        found = source(key, handle, params, models)
        if found is not None:
            run_store().put(key, found)
            return found
    return None


def remember(kind: str, fn: Callable, handle, params: Any, result: Any, *, models: dict | None = None,
             seconds: float = 0.0, **kwargs) -> None:
    """Share (and let the warm command ship) a result computed outside `cached_run`, e.g. from other
    cached steps; `fn(handle, params, **models, **kwargs)` must compute the same result."""
    key = run_key(kind, handle, params, models, **kwargs)
    if run_store().get(key) is not None:
        return
    run_store().put(key, result)
    for sink in _SINKS:
        sink(key, handle, params, fn, kwargs, result, seconds, models or {})


def cached_run(kind: str, fn: Callable, handle, params: Any, *, label: str, on_demand: bool = False,
               optional: bool = False, models: dict | None = None, **kwargs) -> Any:
    """`fn(handle, params, progress=..., **models, **kwargs)`, computed once per (kind, models, params, kwargs).

    Before computing, the run is estimated (`analysis/framework/cost.py`). Work expected to take longer than
    `ASK_ABOVE_S` is not started on page load: the page shows the estimate and a Run button, and
    stops there (`on_demand=False`) or returns None (`on_demand=True`: a section that only runs when
    asked, e.g. a sweep; it shows its button first unless the result is ready). `optional=True`: a section
    that runs at once when short and, when long, shows the estimate and its button and returns None (the
    page goes on below it). A started run shows a progress bar
    with the time left, a Stop button when long, and, while another user holds the model, a
    "queued behind ..." line.
    """
    store = run_store()
    models = models or {}
    key = run_key(kind, handle, params, models, **kwargs)
    while True:
        hit = store.get(key)
        if hit is not None:
            return hit
        with store.lock:
            waiting = store.running.get(key)
            if waiting is None:
                done = store.running[key] = threading.Event()
                break
        with st.spinner(f"{label} (another user started the same run; waiting for it) ..."):
            waiting.wait()
        # loop: the other run stored its result, or failed (then this session computes it itself)
    try:
        for source in _SOURCES:
            found = source(key, handle, params, models)
            if found is not None:
                store.put(key, found)
                return found
        for guard in _GUARDS:
            guard(key, handle, params)
        go, estimate = _gate(key, fn, handle, params, label, {**models, **kwargs}, on_demand)
        if not go:
            if on_demand or optional:
                return None
            st.stop()
        # counted per visitor; waits for a free slot (concurrency limit) and for memory (its estimated peak)
        with limits.run_slot(label, mb=estimate.mb if estimate is not None else 0.0):
            result, seconds = _compute(key, fn, handle, params, label, {**models, **kwargs}, estimate)
        store.put(key, result)
        for sink in _SINKS:
            sink(key, handle, params, fn, kwargs, result, seconds, models)
        return result
    finally:
        with store.lock:
            store.running.pop(key, None)
        done.set()


def confirm(kind: str, fn: Callable, handle, params: Any, *, label: str, models: dict | None = None,
            inputs: str | None = None, **kwargs) -> None:
    """Ask before long work that a page runs itself (a `st.cache_data` step), as `cached_run` does:
    when `fn(handle, params, **models, **kwargs)` is estimated above `ASK_ABOVE_S`, show the estimate
    and a Run button and stop the page until it is pressed. Once passed (short, or pressed), the same
    run is not asked about again in this session. `kwargs` go to the estimator (e.g. `image=`);
    `inputs` stands for them in the key when their repr is not stable (an upload: its hash)."""
    keyed = {"inputs": inputs} if inputs is not None else kwargs
    key = run_key(kind, handle, params, models, **keyed)
    for guard in _GUARDS:
        guard(key, handle, params)
    passed, name = st.session_state.setdefault("_runs_confirmed", {}), _widget_key("confirmed", key)
    if (ASK_ABOVE_S == math.inf and not limits.cost_capped()) or name in passed:
        return
    go, _ = _gate(key, fn, handle, params, label, {**(models or {}), **kwargs})
    if not go:
        st.stop()
    passed[name] = True
    while len(passed) > MAX_ENTRIES:
        passed.pop(next(iter(passed)))


def _gate(key: RunKey, fn: Callable, handle, params, label: str, kwargs: dict,
          on_demand: bool = False) -> tuple[bool, Any]:
    """(go, estimate): the run's estimate (`analysis/framework/cost.py`) and whether to start it now. Long work, an
    on-demand section or a run the user stopped shows its estimate and a Run button (`_asked`) and
    goes only in the rerun where that button was pressed."""
    queue_slot = st.empty()
    failed = False
    try:
        with activity(f"{label.rstrip(' .')} on {handle.spec.label}", _queue_notice(queue_slot)):
            estimate = cost.estimate(fn, handle, params, kwargs)  # the first one times the model (holds its lock)
    except UserError:  # bad settings: start, so that the analysis reports them itself, at once
        refusal = limits.run_refusal(fn, None)
        if refusal:
            st.warning(refusal, icon=":material/block:")
            return False, None
        return True, None
    except Exception:  # no estimate (an undeclared run, an estimator's bug): fail closed, ask first
        log.exception("no work estimate for %s", getattr(fn, "__qualname__", fn))
        estimate, failed = None, True
    finally:
        queue_slot.empty()
    refusal = limits.run_refusal(fn, estimate, estimate_failed=failed, label=label)
    if refusal:  # above the instance's largest run, or training it does not allow: nothing starts
        st.warning(refusal, icon=":material/block:")
        limits.count_refused_view()
        return False, estimate
    stopped = _stopped_runs().get(_widget_key("stop", key))
    if stopped is None and not on_demand and estimate is not None and estimate.seconds <= ASK_ABOVE_S:
        return True, estimate
    if not _asked(key, handle, label, estimate, on_demand, stopped):
        return False, estimate
    _stopped_runs().pop(_widget_key("stop", key), None)
    return True, estimate


def _stopped_runs() -> dict[str, float]:
    """This session's runs stopped with their Stop button (widget key -> seconds it had run), until
    the user runs them again: a stopped run is not restarted on its own by the next rerun."""
    return st.session_state.setdefault("_runs_stopped", {})


def _mark_stopped(stop_key: str, started: float) -> None:
    """The Stop button's callback: it runs first in the rerun its click causes (the interrupted run
    has already undone its patches and released the model)."""
    _stopped_runs()[stop_key] = time.time() - started


def _queue_notice(slot) -> Callable:
    """An `on_wait` for the model's lock: "Queued: the shared model is busy with ..." in `slot`."""
    def on_wait(status) -> None:
        slot.info(status.message(), icon=":material/hourglass_top:")
    return on_wait


def _asked(key: RunKey, handle, label: str, estimate, on_demand: bool, stopped: float | None = None) -> bool:
    """Show the estimate and a Run button; True in the rerun where the user pressed it (the note and
    button then make way for the run). After the user stopped this run (`stopped`: seconds it had
    run), say so and offer to run it again."""
    if stopped is None and on_demand and RUN_ON_DEMAND:
        return True
    if stopped is None and not on_demand and ASK_ABOVE_S == math.inf:
        return True
    slot = st.empty()
    with slot.container():
        pressed = _ask(key, handle, label, estimate, on_demand, stopped)
    if pressed:
        slot.empty()
    return pressed


def _ask(key: RunKey, handle, label: str, estimate, on_demand: bool, stopped: float | None) -> bool:
    when = estimate.text() if estimate is not None else "a while"
    if stopped is not None:
        st.warning(f"**Stopped.** {label.rstrip(' .')} was stopped after {stopped:.0f} s, as you asked; nothing "
                   "of it is shown, and the shared model is free again. Change the settings, or run it again.",
                   icon=":material/stop_circle:")
        return _run_button(key, handle, label, estimate, f"Run it again ({when})")
    if on_demand and (estimate is None or estimate.seconds <= ASK_ABOVE_S):
        return st.button(f"Run: {label.rstrip(' .')} ({when})", key=_widget_key("run", key))
    info = handle.info
    memory = f" and need about {estimate.mb:,.0f} MB of memory" if estimate is not None and estimate.mb >= 1 else ""
    st.info(f"**{label.rstrip(' .')}** would take {when}{memory} on this machine with {handle.spec.label} "
            f"({info.parameters / 1e6:,.0f} M parameters), so it is not started on its own. Smaller settings "
            "(the page's counts, lengths and batch sizes) run sooner.", icon=":material/schedule:")
    return _run_button(key, handle, label, estimate, f"Run it ({when})")


def _run_button(key: RunKey, handle, label: str, estimate, text: str) -> bool:
    """The Run button; for a run estimated above CONFIRM_ABOVE_S, first what it will do and a tick that
    enables the button."""
    if estimate is None or estimate.seconds <= CONFIRM_ABOVE_S:
        return st.button(text, key=_widget_key("run", key), type="primary")
    low, high = estimate.range()
    st.warning(f"**This is a long run: {cost.format_range(low, high)}.** {label.rstrip(' .')} will hold "
               f"{handle.spec.label} for all of that time: other analyses on this model wait behind it, nothing "
               "of it is shown until it ends, and *Stop* ends it early (nothing is kept then).",
               icon=":material/warning:")
    sure = st.checkbox(f"I understand: run it for {cost.format_range(low, high)}", key=_widget_key("sure", key))
    return st.button(text, key=_widget_key("run", key), type="primary", disabled=not sure) and sure


def _compute(key: RunKey, fn: Callable, handle, params, label: str, kwargs: dict, estimate):
    long = estimate is not None and estimate.seconds > 3.0
    stop_slot, queue_slot = st.empty(), st.empty()
    if long:
        # Pressing it reruns the page; Streamlit then stops this run at its next progress update
        # (the model's patches are undone and its lock released on the way out), and the rerun
        # says it was stopped instead of starting it again (`_mark_stopped`).
        stop_slot.button("Stop", key=_widget_key("stop", key), icon=":material/stop_circle:",
                         on_click=_mark_stopped, args=(_widget_key("stop", key), time.time()))

    try:
        with timed_progress(label, estimate.seconds if estimate is not None else None) as report, \
                activity(f"{label.rstrip(' .')} on {handle.spec.label}", _queue_notice(queue_slot)):
            t0 = time.perf_counter()
            result = fn(handle, params, progress=report, **kwargs)
            return result, time.perf_counter() - t0
    finally:
        stop_slot.empty()
        queue_slot.empty()


@contextlib.contextmanager
def timed_progress(label: str, expected: float | None) -> Iterator[Progress]:
    """A progress bar that says how long the run has taken and how long it has left."""
    bar = st.progress(0.0, text=label)
    t0 = time.perf_counter()
    last = [0.0]

    def update(fraction: float, message: str = "") -> None:
        now = time.perf_counter()
        fraction = min(max(float(fraction), 0.0), 1.0)
        if now - last[0] < 0.2 and fraction < 1.0:  # a few updates a second are plenty
            return
        last[0] = now
        elapsed = now - t0
        if fraction >= 0.05:
            left = elapsed * (1 - fraction) / fraction
        else:
            left = max(expected - elapsed, 0.0) if expected is not None else None
        tail = f" · {elapsed:.0f} s so far" + (f", about {cost.format_seconds(left)} left" if left is not None else "")
        bar.progress(fraction, text=f"{label} {message}".strip() + tail)

    try:
        yield update
    finally:
        bar.empty()

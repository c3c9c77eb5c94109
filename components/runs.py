"""One cached run of an analysis: the same settings on the same model compute once for everyone.

    result = cached_run("attack", inv.reconstruct, handle, params, label="Reconstructing")

calls `inv.reconstruct(handle, params, progress=report)` the first time, drawing a progress bar, and
returns the stored result afterwards (also to other sessions). The store is a bounded LRU shared by
the whole server (`st.cache_data` cannot replay a progress bar drawn outside the cached function, so
it is not used here). When another session is already computing the same key, this one waits for
that result instead of starting the same work again.

Extension points (for precomputed results or cost checks), both keyed on the same `RunKey`:
- `add_source(fn)`: `fn(key, handle, params) -> result | None`, asked on a miss before computing;
- `add_guard(fn)`: `fn(key, handle, params) -> None`, called before computing; it may show a
  message and `st.stop()` (e.g. an estimate and a Run button for a long job).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import streamlit as st

from components.common import progress

MAX_ENTRIES = 48


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


def add_source(fn: Callable[[RunKey, Any, Any], Any]) -> None:
    """Ask `fn(key, handle, params)` for a ready result on a miss (None: not available)."""
    if fn not in _SOURCES:
        _SOURCES.append(fn)


def remove_source(fn: Callable[[RunKey, Any, Any], Any]) -> None:
    if fn in _SOURCES:
        _SOURCES.remove(fn)


def add_guard(fn: Callable[[RunKey, Any, Any], None]) -> None:
    """Call `fn(key, handle, params)` before computing; it may stop the page."""
    if fn not in _GUARDS:
        _GUARDS.append(fn)


def _as_json(params: Any) -> str:
    return params.to_json() if hasattr(params, "to_json") else repr(params)


def run_key(kind: str, handle, params: Any, **kwargs) -> RunKey:
    return RunKey(kind, handle.spec.label, _as_json(params), repr(sorted(kwargs.items())))


def cached_run(kind: str, fn: Callable, handle, params: Any, *, label: str, **kwargs) -> Any:
    """`fn(handle, params, progress=..., **kwargs)`, computed once per (kind, model, params, kwargs)."""
    store = run_store()
    key = run_key(kind, handle, params, **kwargs)
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
            ready = source(key, handle, params)
            if ready is not None:
                store.put(key, ready)
                return ready
        for guard in _GUARDS:
            guard(key, handle, params)
        with progress(label) as report:
            result = fn(handle, params, progress=report, **kwargs)
        store.put(key, result)
        return result
    finally:
        with store.lock:
            store.running.pop(key, None)
        done.set()

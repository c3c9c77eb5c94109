"""Figures built once per result: a rerun, or another user looking at the same result, reuses them.

    @shared_figure
    def memory_figure(result: KvResult) -> go.Figure: ...

Building a Plotly figure validates every property and costs tens of milliseconds; a page with six
figures spent most of a warm rerun there. Results come from the server-wide run store (and
Streamlit's caches) as the same objects until they are evicted, so a figure is keyed by its
arguments' *identity* (plain values — numbers, strings, tuples of them — by value). The cache keeps
the arguments alive with the figure, so an id can never be reused by another object while its
entry exists. Bounded per builder (least recently used first out).

Rules for callers: treat a returned figure as read-only (Streamlit's `plotly_chart` and the share
bar only read it) and never mutate a result after it has been drawn.
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Any, Callable, TypeVar

MAX_PER_BUILDER = 16  # a few sessions on a few results; each entry keeps its result alive
_PLAIN = (str, int, float, bool, type(None))

F = TypeVar("F", bound=Callable[..., Any])


def _part(value: Any) -> tuple:
    if isinstance(value, _PLAIN):
        return (type(value).__name__, value)
    if isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value):
        return ("tuple", tuple(_part(v) for v in value))
    return ("id", id(value))


def shared_figure(fn: F) -> F:
    cache: OrderedDict = OrderedDict()
    lock = threading.Lock()

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        key = (tuple(_part(a) for a in args), tuple(sorted((k, _part(v)) for k, v in kwargs.items())))
        with lock:
            hit = cache.get(key)
            if hit is not None:
                cache.move_to_end(key)
                return hit[1]
        figure = fn(*args, **kwargs)  # outside the lock: two sessions may both build it, both are right
        with lock:
            cache[key] = ((args, kwargs), figure)  # the arguments stay alive, so their ids stay theirs
            cache.move_to_end(key)
            while len(cache) > MAX_PER_BUILDER:
                cache.popitem(last=False)
        return figure

    wrapper.cache_clear = cache.clear  # type: ignore[attr-defined]
    wrapper.cache_len = lambda: len(cache)  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]

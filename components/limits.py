"""The deployment's limits on what one visitor may make the server do (docs/deploy.md, `[limits]`).

- `check_run(key, handle, params)`: a guard of components/runs.py, before the estimate: the longest
  prompt, and the per-minute limit (read only).
- `run_refusal(fn, estimate)`: after the estimate, before anything starts: a run above
  `limits.max_run_seconds` or `limits.max_run_mb`, one that would take the server past `limits.server_mb`
  even alone, one the cost of which cannot be estimated while a limit is on, or training where this
  visitor may not train. The page says which limit, and nothing starts.
- `run_slot(label, mb)`: around the computation itself: counts the view against `runs_per_minute` (a view's
  several runs count once) and waits for one of the server's `concurrent_runs` slots, of which one
  visitor holds at most `visitor_runs`, and for memory: runs in flight reserve their estimated peak, and a
  run that would take the server past `server_mb` waits until one ends. Afterwards the run's memory is
  handed back (`cost.release_memory`).
- `save_refusal()`: the per-visitor limit on saves to the gallery.

Every limit counts per visitor (`hosting.visitor_id`: the signed-in user or the address, never the
browser session) and per server process (replicas count their own).
"""
from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Any, Callable, Iterator

import streamlit as st

from analysis.framework import config as cfg
from components import hosting
from components.hosting import RateLimiter


class Slots:
    """At most `n` heavy computations at once in this server (0: no limit), at most `share` of them one
    owner's (0: no share); reentrant per thread (a run inside a run holds one slot)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self.running = 0
        self.peak = 0
        self.by_owner: collections.Counter = collections.Counter()
        self._held = threading.local()
        self.reserved_mb = 0.0  # the estimated peaks of the runs in flight
        self.base_mb = 0.0  # the server's resident memory when the first of them started

    def blocked_by(self, n: int, owner: str = "", share: int = 0, mb: float = 0.0, budget: float = 0.0) -> str:
        """'' when a slot is free for `owner`; 'mine' when their share is taken; 'all' when every slot is;
        'memory' when `mb` more beside the runs in flight would pass `budget` MiB (a run alone always starts:
        `run_refusal` has checked it against the resident memory)."""
        if share > 0 and self.by_owner[owner] >= share:
            return "mine"
        if n > 0 and self.running >= n:
            return "all"
        if budget > 0 and self.running and self.base_mb + self.reserved_mb + mb > budget:
            return "memory"
        return ""

    def acquire(self, n: int, timeout: float, owner: str = "", share: int = 0, mb: float = 0.0,
                budget: float = 0.0) -> bool:
        if getattr(self._held, "depth", 0):
            self._held.depth += 1
            return True
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.blocked_by(n, owner, share, mb, budget):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            if not self.running:
                self.base_mb = resident_mb()
            self.running += 1
            self.by_owner[owner] += 1
            self.reserved_mb += mb
            self.peak = max(self.peak, self.running)
        self._held.depth, self._held.owner, self._held.mb = 1, owner, mb
        return True

    def release(self) -> None:
        self._held.depth -= 1
        if self._held.depth:
            return
        with self._cond:
            self.running -= 1
            self.reserved_mb = max(0.0, self.reserved_mb - self._held.mb) if self.running else 0.0
            self.by_owner[self._held.owner] -= 1
            if self.by_owner[self._held.owner] <= 0:
                del self.by_owner[self._held.owner]
            self._cond.notify_all()  # owners wait on different conditions


def resident_mb() -> float:
    """This server process's resident memory now, in MiB (0 where /proc is not there to read)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


RUNS = RateLimiter()  # views with heavy runs, per visitor per minute
SAVES = RateLimiter()  # saves to the gallery, per visitor per minute
SLOTS = Slots()


def clear() -> None:
    """Forget every count (tests; a server restart does the same)."""
    RUNS.clear()
    SAVES.clear()


def _texts(value: Any, out: list[str], depth: int = 0) -> list[str]:
    """Every string in a settings object (dataclass fields, lists, dicts), for the prompt limit."""
    import dataclasses

    if depth > 6:
        return out
    if isinstance(value, str):
        out.append(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _texts(getattr(value, f.name), out, depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            _texts(v, out, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _texts(v, out, depth + 1)
    return out


def check_run(key, handle, params) -> None:
    """components/runs.py's guard, before anything is estimated or computed: a text above the
    longest prompt, or a visitor over the per-minute limit, gets one line and a stopped page."""
    config = hosting.settings()
    hosting.check_texts(*_texts(params, []))
    wait = RUNS.wait_s(hosting.visitor_id(), config.limits.runs_per_minute, token=hosting.script_run_token())
    if wait:
        _over_limit(config, wait)


def _over_limit(config: cfg.Config, wait: float) -> None:
    at = time.strftime("%H:%M:%S", time.localtime(time.time() + wait))
    st.warning(f"You have started {config.limits.runs_per_minute} views with new analyses in the last minute, the "
               f"most this instance allows per visitor (a view's several analyses count once). You can run again "
               f"in {wait:.0f} s (at {at}). Results other visitors have computed, and the shipped default views, "
               "still open at once.", icon=":material/hourglass_top:")
    st.stop()


def _minutes(seconds: float) -> str:
    from analysis.framework import cost

    return cost.format_seconds(seconds)


def trains(fn: Callable) -> bool:
    """Whether a run function trains (and writes) a model every visitor then sees (`Run.trains`)."""
    from analysis.framework import panels
    from analysis.framework.errors import MissingEstimator

    try:
        return panels.run_for(fn).trains
    except MissingEstimator:
        return False


def run_refusal(fn: Callable, estimate: Any, estimate_failed: bool = False, label: str = "This analysis") -> str | None:
    """Why this run is not started on this instance (None: it may start). `estimate`: cost.Estimate or None;
    `label`: what the run is called on its page."""
    what = label.rstrip(" .") or "This analysis"
    config = hosting.settings()
    if trains(fn):
        refusal = config.training_refusal(bool(hosting.signed_in_user()))
        if refusal:
            return refusal
    limits = config.limits
    cap, cap_mb, server = limits.max_run_seconds, limits.max_run_mb, limits.server_mb
    if not (cap or cap_mb or server):
        return None
    if estimate is None:
        bound = " and ".join(x for x in (f"at up to {_minutes(cap)}" if cap else "",
                                          f"to need up to {cap_mb:,} MB of memory" if cap_mb else "",
                                          "within the server's memory" if server and not cap_mb else "") if x)
        return (f"The cost of {what[0].lower() + what[1:]} cannot be estimated, and this instance only starts "
                f"analyses estimated {bound}." if estimate_failed else None)
    if cap and estimate.seconds > cap:
        return (f"{what} would take about {_minutes(estimate.seconds)} on this machine; this instance runs "
                f"analyses of up to {_minutes(cap)} each, so it was not started. Smaller settings (fewer prompts, "
                "a shorter text, fewer steps or tokens) run sooner.")
    return memory_refusal(what, estimate.mb, cap_mb, server)


def memory_refusal(what: str, mb: float, cap_mb: int, server_mb: int) -> str | None:
    """Why a run estimated at `mb` MiB at its peak is not started (None: it fits): above `cap_mb` per run, or,
    with nothing else running, above what the server's budget `server_mb` leaves beside what it holds now."""
    smaller = ("Smaller settings (fewer prompts or pairs, a shorter text, a smaller batch) need less memory.")
    if cap_mb and mb > cap_mb:
        return (f"{what} would need about {mb:,.0f} MB of memory at its peak on this machine; this instance runs "
                f"analyses of up to {cap_mb:,} MB each, so it was not started. {smaller}")
    if server_mb:
        held = SLOTS.base_mb if SLOTS.running else resident_mb()
        if held + mb > server_mb:
            return (f"{what} would need about {mb:,.0f} MB of memory at its peak; this server's budget is "
                    f"{server_mb:,} MB and it holds {held:,.0f} MB now (its models and results), so it was not "
                    f"started. {smaller}")
    return None


def cost_capped() -> bool:
    """Whether runs must be estimated before they start even where nobody is asked (a cap is on)."""
    limits = hosting.settings().limits
    return bool(limits.max_run_seconds or limits.max_run_mb or limits.server_mb)


def count_refused_view() -> None:
    """A view refused before it ran (above the largest run) counts against the visitor's views per minute as
    one that ran: its estimate was work the server did (#50: before, refused views cost nothing)."""
    RUNS.wait_s(hosting.visitor_id(), hosting.settings().limits.runs_per_minute, record=True,
                token=hosting.script_run_token())


@contextlib.contextmanager
def run_slot(label: str, mb: float = 0.0) -> Iterator[None]:
    """Around one heavy computation: counts its view against the visitor's per-minute limit and waits for
    one of the server's `limits.concurrent_runs` slots, at most `limits.visitor_runs` of them this
    visitor's, saying so while it waits (a visitor who leaves stops the wait: the notice is redrawn every
    second, where Streamlit stops a run)."""
    config = hosting.settings()
    visitor = hosting.visitor_id()
    wait = RUNS.wait_s(visitor, config.limits.runs_per_minute, record=True, token=hosting.script_run_token())
    if wait:  # another tab of the same visitor got there first
        _over_limit(config, wait)
    n, share, budget = config.limits.concurrent_runs, config.limits.visitor_runs, config.limits.server_mb
    notice, t0 = None, time.monotonic()
    while not SLOTS.acquire(n, timeout=1.0, owner=visitor, share=share, mb=mb, budget=budget):
        notice = notice or st.empty()
        waited = f"waiting {time.monotonic() - t0:.0f} s"
        blocked = SLOTS.blocked_by(n, visitor, share, mb, budget)
        if blocked == "memory":
            notice.info(f"{label.rstrip(' .')} needs about {mb:,.0f} MB of memory, more than this server's budget "
                        f"({budget:,} MB) leaves beside the analyses running now; it starts as soon as one of them "
                        f"finishes ({waited}).", icon=":material/hourglass_top:")
        elif blocked == "mine":
            notice.info(f"{label.rstrip(' .')}: you already have {share} analysis running on this server, the most "
                        f"one visitor may run at once; this one starts when yours finishes ({waited}).",
                        icon=":material/hourglass_top:")
        else:
            notice.info(f"{label.rstrip(' .')}: all {n} analysis slots of this server are busy; yours starts as "
                        f"soon as one is free ({waited}).", icon=":material/hourglass_top:")
    if notice is not None:
        notice.empty()
    try:
        yield
    finally:
        SLOTS.release()
        if not getattr(SLOTS._held, "depth", 0):  # the outermost run ended
            from analysis.framework import cost

            cost.release_memory()  # the run's activations are garbage now: give their pages back


def save_refusal() -> str | None:
    """Counts a save against the visitor's per-minute limit; why it is refused, or None."""
    per_minute = hosting.settings().limits.saves_per_minute
    wait = SAVES.wait_s(hosting.visitor_id(), per_minute, record=True)
    if wait:
        return (f"You have saved {per_minute} analyses in the last minute, the most this instance allows per "
                f"visitor; save again in {wait:.0f} s.")
    return None

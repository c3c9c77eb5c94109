"""The memory budget beside the time budget (#50): runs in flight reserve their estimated peak and a run that
would take the server past `server_mb` waits for one to end; a run above `max_run_mb`, or past the budget
alone, is refused with the limit named; the configuration carries both keys; ranges read as ranges."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from analysis.framework import config as cfg
from analysis.framework import cost
from analysis.framework.paths import ROOT
from components import limits


@pytest.fixture()
def resident(monkeypatch):
    """The server's resident memory, as the budget reads it: 100 MiB unless a test changes it."""
    now = {"mb": 100.0}
    monkeypatch.setattr(limits, "resident_mb", lambda: now["mb"])
    return now


def _hold(slots: limits.Slots, mb: float, budget: float, started: threading.Event, stop: threading.Event,
          owner: str) -> threading.Thread:
    def work():
        assert slots.acquire(0, timeout=5, owner=owner, mb=mb, budget=budget)
        started.set()
        stop.wait(10)
        slots.release()
    t = threading.Thread(target=work)
    t.start()
    return t


def test_a_run_that_would_pass_the_servers_budget_waits_for_one_in_flight(resident):
    slots = limits.Slots()
    started, stop = threading.Event(), threading.Event()
    first = _hold(slots, 300, 500, started, stop, "a")
    assert started.wait(5)
    assert slots.reserved_mb == 300 and slots.base_mb == 100
    assert slots.blocked_by(0, "b", 0, mb=150, budget=500) == "memory"  # 100 + 300 + 150 > 500
    assert slots.blocked_by(0, "b", 0, mb=50, budget=500) == ""  # 450 fits
    t0 = time.monotonic()
    assert not slots.acquire(0, timeout=0.3, owner="b", mb=150, budget=500)
    assert time.monotonic() - t0 >= 0.25, "it waited"
    got = []
    second = threading.Thread(target=lambda: got.append(slots.acquire(0, timeout=5, owner="b", mb=150, budget=500)))
    second.start()
    time.sleep(0.2)
    assert not got, "still waiting while the first run holds its 300 MiB"
    stop.set()
    first.join()
    second.join()
    assert got == [True] and slots.reserved_mb == 150


def test_without_a_budget_memory_never_blocks(resident):
    slots = limits.Slots()
    started, stop = threading.Event(), threading.Event()
    first = _hold(slots, 10_000, 0, started, stop, "a")
    assert started.wait(5)
    assert slots.blocked_by(0, "b", 0, mb=10_000, budget=0) == ""
    stop.set()
    first.join()
    assert slots.reserved_mb == 0 and slots.running == 0


def test_a_run_above_the_per_run_cap_is_refused_with_the_limit_named(resident):
    text = limits.memory_refusal("Building the feature store", 900, 500, 0)
    assert "Building the feature store would need about 900 MB of memory at its peak" in text
    assert "this instance runs analyses of up to 500 MB each, so it was not started" in text
    assert limits.memory_refusal("Building the feature store", 400, 500, 0) is None


def test_a_run_past_the_servers_budget_alone_is_refused(resident):
    resident["mb"] = 1500
    text = limits.memory_refusal("Sweeping n", 300, 0, 1700)
    assert "this server's budget is 1,700 MB and it holds 1,500 MB now" in text
    assert limits.memory_refusal("Sweeping n", 150, 0, 1700) is None


def test_the_public_example_sets_both_memory_limits():
    public = cfg.parse((ROOT / "deploy" / "public.toml").read_text())
    assert 0 < public.limits.max_run_mb < public.limits.server_mb <= 2048  # a 2 GB container
    assert cfg.parse("[limits]\nmax_run_mb = 300\nserver_mb = 1000\n").limits.server_mb == 1000
    with pytest.raises(cfg.ConfigError):
        cfg.parse("[limits]\nmax_run_mb = 'lots'\n")


@pytest.mark.parametrize("low,high,text", [(14, 28, "14–28 s"), (120, 300, "2–5 min"), (50, 130, "50 s–2 min"),
                                           (0.2, 0.4, "under a second"), (0.5, 3, "up to 3 s")])
def test_a_range_reads_as_one(low, high, text):
    assert cost.format_range(low, high) == text


def test_the_memory_counts_add_the_held_and_keep_the_largest_step():
    w = cost.Work(peak=100.0, held=10.0)
    w.add(peak=50.0, held=5.0, times=3).add(peak=300.0)
    assert (w.peak, w.held) == (300.0, 15.0)

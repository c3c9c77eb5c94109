"""The shared model's lock: first come first served, reentrant, and it tells a waiter what it waits for."""
from __future__ import annotations

import threading
import time

import pytest

from analysis.model_access.model_lock import LockStatus, ModelLock, activity


def _wait_until(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.005)


def test_lock_is_reentrant_and_only_the_owner_releases():
    lock = ModelLock()
    with lock:
        with lock:
            assert lock.held_by_me()
        assert lock.held_by_me()
    assert lock.status().holder is None
    with pytest.raises(RuntimeError):
        lock.release()


def test_waiters_get_the_lock_in_arrival_order():
    lock = ModelLock()
    order: list[str] = []
    lock.acquire()
    threads = []
    for name in "BCDE":
        def run(name=name):
            with activity(name), lock:
                order.append(name)
        t = threading.Thread(target=run)
        t.start()
        threads.append(t)
        _wait_until(lambda n=len(threads): len(lock.status().waiting) == n)  # queued in this order
    lock.release()
    for t in threads:
        t.join(5)
    assert order == list("BCDE")


def test_a_chunked_analysis_lets_a_waiting_user_in_between_chunks():
    """A long job re-taking the lock per chunk must not starve a user who arrived meanwhile."""
    lock = ModelLock()
    chunks_done: list[int] = []
    other_got_it_after: list[int] = []
    started = threading.Event()

    def long_job():
        with activity("long sweep"):
            for i in range(40):
                lock.acquire()  # back to back, as an analysis loop re-takes it for its next chunk
                started.set()
                time.sleep(0.01)
                chunks_done.append(i)
                lock.release()

    def other_user():
        started.wait(5)
        with activity("one forward"), lock:
            other_got_it_after.append(len(chunks_done))

    a, b = threading.Thread(target=long_job), threading.Thread(target=other_user)
    a.start()
    b.start()
    a.join(10)
    b.join(10)
    assert other_got_it_after and other_got_it_after[0] <= 2, other_got_it_after


def test_waiter_is_told_the_holder_and_its_place():
    lock = ModelLock()
    seen: list[LockStatus] = []
    release = threading.Event()

    def holder():
        with activity("KV-cache eviction: every policy"), lock:
            release.wait(5)

    h = threading.Thread(target=holder)
    h.start()
    _wait_until(lambda: lock.status().holder is not None)

    def waiter():
        with activity("sharpness sweep", on_wait=seen.append), lock:
            pass

    w = threading.Thread(target=waiter)
    w.start()
    _wait_until(lambda: len(seen) >= 1)
    release.set()
    h.join(5)
    w.join(5)
    status = seen[0]
    assert status.holder == "KV-cache eviction: every policy"
    assert status.position == 1 and status.waiting == ["sharpness sweep"]
    assert "KV-cache eviction: every policy" in status.message() and "Queued" in status.message()


def test_a_waiter_that_gives_up_leaves_the_queue():
    """Stop pressed while queued: the exception from on_wait removes the waiter, the lock still works."""
    lock = ModelLock()
    lock.acquire()

    class Stop(Exception):
        pass

    def give_up(status):
        raise Stop

    errors = []

    def waiter():
        try:
            with activity("stopped", on_wait=give_up), lock:
                pass
        except Stop:
            errors.append("stopped")

    t = threading.Thread(target=waiter)
    t.start()
    t.join(5)
    assert errors == ["stopped"]
    assert lock.status().waiting == []
    lock.release()
    got = []
    t2 = threading.Thread(target=lambda: (lock.acquire(), got.append(1), lock.release()))
    t2.start()
    t2.join(5)
    assert got == [1]


def test_handle_uses_the_fair_lock(tiny_llama):
    assert isinstance(tiny_llama.lock, ModelLock)
    with tiny_llama.session():
        assert tiny_llama.lock.held_by_me()


def test_checkpoint_hands_the_model_to_a_waiter_unpatched_then_repatches(tiny_llama):
    """A long analysis' checkpoint: the waiter runs on the plain model, then the analysis' hook is back."""
    import torch

    lm = tiny_llama.language_model
    ids = torch.tensor([[1, 2, 3]])
    calls: list[str] = []
    waiter_saw_hooks: list[int] = []
    waiter_done = threading.Event()

    def hook(module, args, output):
        calls.append("hooked")

    def waiter():
        with activity("a quick forward"), tiny_llama.session():
            before = len(calls)
            lm(input_ids=ids)
            waiter_saw_hooks.append(len(calls) - before)
        waiter_done.set()

    with activity("long analysis"), tiny_llama.patch() as patch:
        patch.hook(lm, hook)
        assert patch.checkpoint() is False  # nobody waits: nothing happens
        t = threading.Thread(target=waiter)
        t.start()
        _wait_until(lambda: tiny_llama.lock.status().waiting == ["a quick forward"])
        assert patch.checkpoint() is True
        assert waiter_done.is_set() and waiter_saw_hooks == [0]
        assert tiny_llama.lock.held_by_me()
        lm(input_ids=ids)
        assert calls == ["hooked"]  # the analysis' hook is back for its next chunk
    t.join(5)
    lm(input_ids=ids)
    assert calls == ["hooked"]  # and gone after the patch

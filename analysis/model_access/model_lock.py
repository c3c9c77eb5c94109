"""The lock of a shared model: reentrant, first come first served, and able to say who waits for what.

Every user of a server shares one loaded model, and every analysis that touches it holds its lock.
A plain `threading.RLock` gives no order (a long analysis that re-acquires the lock between chunks
can starve everyone else) and no account of itself (a waiting page cannot say what it waits for).
`ModelLock` hands the lock out in arrival order, so an analysis that takes it per chunk (a forward,
a policy run, a decode loop) lets every waiter in between its chunks; and `status()` names the
holder's activity and the queue behind it.

What a thread is doing comes from `activity(label, on_wait)`: pages wrap a run in it, the lock
records the label when the thread acquires, and while the thread waits it calls `on_wait(status)`
a few times a second (the page draws "queued behind ..."; an exception raised there — a Streamlit
rerun when the user presses Stop — leaves the queue cleanly).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

WAIT_POLL_S = 0.25
_local = threading.local()


@dataclass
class LockStatus:
    holder: str | None  # the activity holding the lock (None: free)
    held_for: float  # seconds the holder has held it
    waiting: list[str] = field(default_factory=list)  # activities queued, first in line first
    position: int | None = None  # the asking thread's place in the queue (1 = next), None if not queued

    def message(self) -> str:
        """One line for a waiting user."""
        if self.holder is None:
            return "The model is free."
        ahead = (self.position or 1) - 1
        queue = f"; {ahead} more ahead of you" if ahead > 0 else ""
        return (f"Queued: the shared model is busy with “{self.holder}” (for {self.held_for:.0f} s){queue}. "
                "This run starts as soon as it is free.")


@contextlib.contextmanager
def activity(label: str, on_wait: Callable[[LockStatus], None] | None = None) -> Iterator[None]:
    """Name what this thread is doing (shown to others waiting) and how to report its own waits."""
    previous = getattr(_local, "activity", None)
    _local.activity = (label, on_wait)
    try:
        yield
    finally:
        _local.activity = previous


def current_activity() -> tuple[str, Callable[[LockStatus], None] | None]:
    return getattr(_local, "activity", None) or ("an analysis", None)


class ModelLock:
    """Reentrant FIFO lock. `with lock:` works like an RLock; `status()` says who holds and who waits."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._label: str | None = None
        self._since = 0.0
        self._queue: deque[tuple[int, str]] = deque()  # (ticket, label)
        self._next_ticket = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        label, on_wait = current_activity()
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            if self._owner is None and not self._queue:
                self._take(me, label)
                return True
            if not blocking:
                return False
            ticket = self._next_ticket
            self._next_ticket += 1
            self._queue.append((ticket, label))
        try:
            while True:
                with self._cond:
                    if self._owner is None and self._queue[0][0] == ticket:
                        self._queue.popleft()
                        self._take(me, label)
                        self._cond.notify_all()
                        return True
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        self._leave(ticket)
                        return False
                    self._cond.wait(WAIT_POLL_S if remaining is None else min(WAIT_POLL_S, remaining))
                    waiting_status = self._status(ticket) if on_wait is not None else None
                if waiting_status is not None and waiting_status.holder is not None:
                    on_wait(waiting_status)  # outside the condition: it may draw, or raise to give up
        except BaseException:
            with self._cond:
                self._leave(ticket)
            raise

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("cannot release a model lock this thread does not hold")
            self._depth -= 1
            if self._depth == 0:
                self._owner, self._label = None, None
                self._cond.notify_all()

    def release_all(self) -> int:
        """Release every level this thread holds (a checkpoint between chunks); returns the depth."""
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("cannot release a model lock this thread does not hold")
            depth, self._depth = self._depth, 0
            self._owner, self._label = None, None
            self._cond.notify_all()
            return depth

    def acquire_again(self, depth: int) -> None:
        """Take the lock back (in queue order) at the depth `release_all` returned."""
        self.acquire()
        with self._cond:
            self._depth = depth

    def __enter__(self) -> "ModelLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def status(self) -> LockStatus:
        with self._cond:
            return self._status(None)

    def has_waiters(self) -> bool:
        return bool(self._queue)  # a racy read is fine: a checkpoint just looks again at the next chunk

    def held_by_me(self) -> bool:
        return self._owner == threading.get_ident()

    # -- internals (called with the condition held) ---------------------------------------------

    def _take(self, me: int, label: str) -> None:
        self._owner, self._depth, self._label, self._since = me, 1, label, time.monotonic()

    def _leave(self, ticket: int) -> None:
        for i, (t, _) in enumerate(self._queue):
            if t == ticket:
                del self._queue[i]
                break
        self._cond.notify_all()

    def _status(self, ticket: int | None) -> LockStatus:
        position = next((i + 1 for i, (t, _) in enumerate(self._queue) if t == ticket), None)
        held_for = time.monotonic() - self._since if self._owner is not None else 0.0
        return LockStatus(holder=self._label if self._owner is not None else None, held_for=held_for,
                          waiting=[label for _, label in self._queue], position=position)

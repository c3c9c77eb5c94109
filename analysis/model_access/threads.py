"""How many CPU threads torch may use in one process of Model Inspector (the CLI, the server).

Call `configure()` once, first thing, before anything imports torch: the OpenMP runtime reads its
wait policy when torch is loaded.

    MODEL_INSPECTOR_THREADS=N   torch intra-op threads for this process (default: see below)

Without it, an explicit OMP_NUM_THREADS is left to torch (the team's test runs set it to 1); else
torch gets every core (its own default) but its OpenMP threads wait *passively*
(OMP_WAIT_POLICY=PASSIVE, unless set) instead of spinning on a core between parallel regions. With
the default active wait, two analyses in two processes on a 2-core machine each kept two threads
spinning while the other process wanted the same cores; measured numbers are in docs/readme_zoo.md
("Torch threads").
"""
from __future__ import annotations

import os

from analysis.framework.errors import SettingsError

ENV = "MODEL_INSPECTOR_THREADS"


class ThreadsError(SettingsError):
    """MODEL_INSPECTOR_THREADS is not a positive whole number."""


def requested() -> int | None:
    """The thread count MODEL_INSPECTOR_THREADS asks for, or None when it is unset or empty."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ThreadsError(f"{ENV}={text!r} is not a positive whole number of threads.")
    return n


def configure() -> int | None:
    """Apply the policy above to this process; returns the thread count it set, or None when torch
    keeps its own (OMP_NUM_THREADS, or every core). Raises ThreadsError on a bad MODEL_INSPECTOR_THREADS."""
    n = requested()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read by libgomp when torch loads it
    if n is not None:
        os.environ["OMP_NUM_THREADS"] = str(n)  # for anything that reads it at import (MKL, tokenizers' pool)
        import torch

        torch.set_num_threads(n)
    return n

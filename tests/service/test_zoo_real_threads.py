"""Torch's thread policy for the CLI and the server (analysis/model_access/threads.py), set before torch loads."""
from __future__ import annotations

import os
import subprocess
import sys

from analysis.framework.paths import ROOT
PROBE = ("from analysis.model_access import threads; threads.configure(); import os, torch; "
         "print(torch.get_num_threads(), os.environ.get('OMP_WAIT_POLICY'))")


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "MODEL_INSPECTOR_THREADS")}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=dict(base, PYTHONPATH=str(ROOT), **env),
                          capture_output=True, text=True, timeout=120)


def test_the_environment_sets_the_thread_count_and_torch_waits_passively():
    out = _run(["-c", PROBE], MODEL_INSPECTOR_THREADS="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "PASSIVE"]


def test_an_explicit_wait_policy_is_kept():
    out = _run(["-c", PROBE], OMP_WAIT_POLICY="ACTIVE", OMP_NUM_THREADS="1")
    assert out.stdout.split() == ["1", "ACTIVE"]


def test_a_bad_thread_count_is_one_error_line_from_the_cli():
    out = _run(["-m", "analysis", "info"], MODEL_INSPECTOR_THREADS="two")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "error: MODEL_INSPECTOR_THREADS='two' is not a positive whole number of threads."]

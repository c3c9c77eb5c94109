"""The crowd benchmark's CPU accounting (benchmarks/crowd_bench.py: Chromium + server CPU seconds)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import crowd_bench  # noqa: E402

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\nimport sys; sys.stdin.read()"


def test_cpu_seconds_counts_living_descendants_by_name(tmp_path):
    """A child (process name "crowdbusy") that burns 0.4 s of CPU and stays alive is counted under its
    parent, by its name or with no name given, and not under a name it does not have; the parent's
    own CPU is not counted under the child's name."""
    exe = tmp_path / "crowdbusy"
    exe.symlink_to(sys.executable)
    me = psutil.Process()
    child = subprocess.Popen([str(exe), "-c", BUSY], stdin=subprocess.PIPE)
    try:
        proc = psutil.Process(child.pid)
        while sum(proc.cpu_times()[:2]) < 0.4:  # until it has burnt its share, then it waits on stdin
            psutil.wait_procs([proc], timeout=0.05)
        assert proc.name() == "crowdbusy"
        burnt = sum(proc.cpu_times()[:2])
        assert abs(crowd_bench.cpu_seconds(me, "crowdbusy") - burnt) < 0.05  # the child alone
        assert crowd_bench.cpu_seconds(me) >= sum(me.cpu_times()[:2]) + burnt - 0.05  # parent and child
        assert crowd_bench.cpu_seconds(me, "no-such-process-name") == 0.0
    finally:
        child.communicate(b"")

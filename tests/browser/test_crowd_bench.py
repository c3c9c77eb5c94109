"""The crowd benchmark's CPU accounting (benchmarks/crowd_bench.py: Chromium + server CPU seconds) and
its watch on the pages (when each page was drawn)."""
from __future__ import annotations

import subprocess
import sys
import time

import psutil

from analysis.framework.paths import BENCHMARKS, ROOT  # noqa: E402
sys.path.insert(0, str(BENCHMARKS))
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


# A page shaped like Streamlit's, as the watcher sees it: the app's script state, a title, placeholders
PAGE = ("<div data-testid='stApp' data-test-script-state='running'><h1>t</h1>"
        "<div data-testid='stSkeleton'></div></div>")


def test_settle_dates_a_page_by_its_last_change_and_waits_for_quiet_from_the_call(chromium):
    """The watcher notes when the page's state last changed (here 0.6 s after the call: the script run
    ends, and a moment later the placeholder makes way for a chart); settle returns that moment, after
    a quiet second; a page already quiet still waits a second from the call (so a rerun that an action
    just before causes is seen); a page made without the watcher gets it."""
    script = ("document.querySelector(\"[data-testid='stApp']\").setAttribute('data-test-script-state', "
              "'notRunning')")
    chart = ("const s = document.querySelector(\"[data-testid='stSkeleton']\"); "
             "s.setAttribute('data-testid', 'stPlotlyChart')")
    browser = chromium.browser
    page = plain = None
    try:
        page = crowd_bench.new_page(browser)
        page.set_content(PAGE)
        start = time.perf_counter()
        # the chart's timer starts inside the script's, so the two changes are at least 0.3 s apart however
        # late a busy machine runs the first (two timers started together can fire together)
        page.evaluate(f"setTimeout(() => {{ {script}; setTimeout(() => {{ {chart} }}, 300) }}, 300)")
        [(done, first)] = crowd_bench._settle_all([page], 20_000)
        returned = time.perf_counter()
        assert 0.25 <= first - start <= 3.0  # the script run ended (a placeholder was still there)
        assert 0.55 <= done - start <= 4.0 and done - first >= 0.25  # drawn: a chart replaced the placeholder
        assert returned - done >= 1.0  # after a quiet second
        time.sleep(1.5)
        called = time.perf_counter()
        # a change half a second after the call: settle must see it and wait a second more
        page.evaluate("setTimeout(() => { const d = document.createElement('div'); "
                      "d.setAttribute('data-testid', 'stMetric'); document.querySelector('h1').after(d) }, 500)")
        [again] = crowd_bench.settle_all([page], 20_000)
        assert 0.45 <= again - called <= 4.0 and time.perf_counter() - called >= 1.5
        plain = browser.new_page()  # no watcher installed before its content
        plain.set_content(PAGE.replace("running", "notRunning").replace("stSkeleton", "stPlotlyChart"))
        called = time.perf_counter()
        crowd_bench.settle(plain, 20_000)
        assert time.perf_counter() - called >= 1.0
    finally:
        for opened in (page, plain):
            if opened is not None:
                opened.context.close()


def test_browser_floor_rejects_a_bad_repeat_count_with_one_error_line():
    """benchmarks/browser_floor.py: a bad argument is one `error:` line and exit status 2, before any
    browser or server starts."""
    root = ROOT
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "browser_floor.py"), "--repeats", "0"],
                         capture_output=True, text=True, timeout=120, cwd=root)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == ["error: --repeats must be at least 1"]
    assert run.stdout == ""


def test_save_labelled_keeps_other_labels_and_replaces_its_own(tmp_path):
    out = tmp_path / "results" / "bench.json"
    crowd_bench.save_labelled(out, "a", {"x": 1})
    crowd_bench.save_labelled(out, "b", {"x": 2})
    crowd_bench.save_labelled(out, "a", {"x": 3})
    import json

    stored = json.loads(out.read_text())
    assert sorted(stored) == ["a", "b"] and stored["a"]["x"] == 3 and stored["b"]["x"] == 2
    assert all(v["when"].endswith("Z") for v in stored.values())

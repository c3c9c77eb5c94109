"""A room full of people: N users open the app at once, right after the server is healthy.

    python benchmarks/crowd_bench.py [--users 1,6] [--repeats 1]

One `streamlit run` server per measurement, started fresh; as soon as its health endpoint answers,
N headless Chromium pages (Debian's chromium, one browser context = one session each, started before
the server as the users' browsers would be) open different panels together. Measured, in seconds after
"healthy" (all pages are watched at once): when every page's first script run ended (the server's
answer), and when every page was drawn (idle for good with no placeholder left, confirmed by a second
of quiet: the browser has also loaded Streamlit's and Plotly's JavaScript); exceptions on the pages;
the ratio N = 6 / N = 1. The six users: two on KV-cache
eviction (one on the default view, one on other settings), one each on prompt reconstruction,
attention sharpness, caption correction and SAE-V. Prints a markdown table and writes
benchmarks/results/crowd_bench.json. tests/test_crowd.py uses the same machinery.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
import screenshot  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "crowd_bench.json"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
TIME_WORDS = ("time", "second", "ms", "(s)")

# (url path, query): the crowd, in the order users join
USERS = [
    ("kv-cache", ""),
    ("prompt-reconstruction", ""),
    ("attention-sharpness", ""),
    ("caption-correction", "?model=zoo:shapes-vlm"),
    ("sae-features", "?model=zoo:shapes-vlm"),
    ("kv-cache", "?policy=h2o&budget=32"),
]


def start_server(env: dict | None = None) -> tuple[subprocess.Popen, str, float]:
    """Start the app (scripts/serve.py: `streamlit run app.py` after the heavy imports); return the
    process, its URL and the moment its health check passed."""
    port = screenshot.free_port()
    cmd = [sys.executable, str(ROOT / "scripts" / "serve.py"), "--server.port", str(port),
           "--server.address", "127.0.0.1", "--server.headless", "true"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started, deadline = time.perf_counter(), time.time() + 180
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
            start_server.last_start_s = time.perf_counter() - started
            return proc, f"http://127.0.0.1:{port}", time.perf_counter()
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the app did not start within 180 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def page_numbers(page) -> dict[str, str]:
    """Metric cards (label -> value) the page shows, without wall-clock timings."""
    out = {}
    for metric in page.locator("[data-testid='stMetric']").all():
        label = metric.locator("[data-testid='stMetricLabel']").inner_text().strip()
        if any(w in label.lower() for w in TIME_WORDS):
            continue
        out[label] = metric.locator("[data-testid='stMetricValue']").inner_text().strip()
    return out


IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"


def _script_idle(page) -> bool:
    return bool(page.locator(IDLE).count() and page.locator("h1").count())


def _state(page) -> tuple | None:
    """(metric cards, charts) when the page's script is not running and the page has drawn its title
    and all its elements; None while it runs (or has not started: "notRunning" is also shown before
    the first run) or while elements are still placeholders (Streamlit shows skeletons until a
    lazily loaded component, Plotly's on first use, has arrived: seconds on a busy machine)."""
    if not page.locator(IDLE).count() or not page.locator("h1").count():
        return None
    if page.locator("[data-testid='stSkeleton']").count():
        return None
    return (page.locator("[data-testid='stMetric']").count(), page.locator("[data-testid='stPlotlyChart']").count())


def settle_all(pages: list, timeout_ms: int, quiet_s: float = 1.0) -> list[float]:
    """Watch every page at once; for each, the moment (perf_counter) its script run ended for good:
    from then on it stayed idle, with the same cards and charts, for `quiet_s` (a rerun that a widget
    or a finished queue triggers starts within that time)."""
    return [d for d, _ in _settle_all(pages, timeout_ms, quiet_s)]


def _settle_all(pages: list, timeout_ms: int, quiet_s: float = 1.0) -> list[tuple[float, float]]:
    """settle_all, plus for each page the moment its first script run ended (the server's answer; the
    page may still be drawing placeholders then, and a widget may rerun it once it is drawn)."""
    deadline = time.perf_counter() + timeout_ms / 1000
    since: list[float | None] = [None] * len(pages)
    seen: list[tuple | None] = [None] * len(pages)
    done: list[float | None] = [None] * len(pages)
    first_idle: list[float | None] = [None] * len(pages)
    while any(d is None for d in done):
        if time.perf_counter() > deadline:
            raise TimeoutError("a page did not settle")
        for i, page in enumerate(pages):
            if done[i] is not None:
                continue
            now = time.perf_counter()
            if first_idle[i] is None and _script_idle(page):
                first_idle[i] = now
            state = _state(page)
            if state is None or state != seen[i]:
                since[i] = now if state is not None else None
                seen[i] = state
            elif now - since[i] >= quiet_s:
                done[i] = since[i]
        time.sleep(0.05)
    return [(d, min(s if s is not None else d, d)) for d, s in zip(done, first_idle)]  # type: ignore[arg-type]


def settle(page, timeout_ms: int, quiet_s: float = 1.0) -> None:
    """Wait until one page's script run has ended for good (see settle_all)."""
    settle_all([page], timeout_ms, quiet_s)


def visit(pages: list, base: str, users: list[tuple[str, str]], healthy_at: float,
          timeout_ms: int = 300_000) -> list[dict]:
    """Every user opens their page at once (browsers already open); wait until all are done."""
    for page, (path, query) in zip(pages, users):
        page.goto(f"{base}/{path}{query}", wait_until="commit")
    done_at = _settle_all(pages, timeout_ms)
    results = []
    for (path, query), page, (t, script_t) in zip(users, pages, done_at):
        results.append({
            "page": f"{path}{query}", "done_s": round(t - healthy_at, 2),
            "first_run_s": round(script_t - healthy_at, 2),
            "exceptions": page.locator("[data-testid='stException']").all_inner_texts(),
            "errors": page.locator("[data-testid='stAlertContentError']").all_inner_texts(),
            "charts": page.locator("[data-testid='stPlotlyChart']").count(),
            "numbers": page_numbers(page),
        })
    return results


def _browser_pages(p, n: int) -> tuple:
    browser = p.chromium.launch(executable_path=CHROMIUM, args=screenshot.CHROMIUM_ARGS)
    pages = [browser.new_context(viewport={"width": 1400, "height": 900}).new_page() for _ in range(n)]
    return browser, pages


def crowd(base: str, users: list[tuple[str, str]], healthy_at: float, timeout_ms: int = 300_000) -> list[dict]:
    """Open every user's page at once (one browser context each); wait until all are done."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser, pages = _browser_pages(p, len(users))
        try:
            return visit(pages, base, users, healthy_at, timeout_ms)
        finally:
            browser.close()


def measure(n: int, env: dict | None = None) -> dict:
    """The users sit at open browsers; the server starts; when it is healthy they all open their page.
    Timed from "healthy" to the end of the last page's script run (browser start-up not included)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser, pages_ = _browser_pages(p, n)
        try:
            proc, base, healthy_at = start_server(env)
            try:
                pages = visit(pages_, base, USERS[:n], healthy_at)
            finally:
                stop_server(proc)
        finally:
            browser.close()
    return {"users": n, "all_done_s": max(p["done_s"] for p in pages),
            "all_first_runs_s": max(p["first_run_s"] for p in pages), "pages": pages,
            "server_start_s": round(start_server.last_start_s, 1),
            "exceptions": sum(len(p["exceptions"]) for p in pages)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="1,6")
    parser.add_argument("--label", default="latest")
    args = parser.parse_args()
    rows = [measure(int(n)) for n in args.users.split(",")]
    load = os.getloadavg()[0]
    print(f"\nMachine: {os.cpu_count()} cores, load average {load:.1f}; time from the server's health check "
          "passing until every page's script run has finished.\n")
    print("| users | server start → healthy | every first run ended | every page drawn | exceptions | per page (s) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        per = ", ".join(f"{p['page'].split('?')[0]} {p['first_run_s']:.1f}/{p['done_s']:.1f}" for p in r["pages"])
        print(f"| {r['users']} | {r['server_start_s']:.1f} s | {r['all_first_runs_s']:.1f} s | {r['all_done_s']:.1f} s "
              f"| {r['exceptions']} | {per} |")
    if len(rows) >= 2:
        print(f"\nratio N = {rows[-1]['users']} / N = {rows[0]['users']}: "
              f"{rows[-1]['all_done_s'] / rows[0]['all_done_s']:.2f}")
    previous = json.loads(OUT.read_text()) if OUT.is_file() else {}
    previous[args.label] = {"load": load, "rows": rows, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(previous, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

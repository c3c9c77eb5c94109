"""A room full of people: N users open the app at once, right after the server is healthy.

    python benchmarks/crowd_bench.py [--users 1,6] [--clients browser,protocol] [--label NAME]
                                     [--server-env NAME=VALUE ...]

One `streamlit run` server per measurement, started fresh; as soon as its health endpoint answers,
N headless Chromium pages (Debian's chromium, one browser context = one session each, started before
the server as the users' browsers would be) open different panels together. Measured, in seconds after
"healthy" (all pages are watched at once): when every page's first script run ended (the server's
answer), and when every page was drawn (idle for good with no placeholder left, confirmed by a second
of quiet: the browser has also loaded Streamlit's and Plotly's JavaScript); exceptions on the pages;
the ratio N = 6 / N = 1. The six users: two on KV-cache
eviction (one on the default view, one on other settings), one each on prompt reconstruction,
attention sharpness, caption correction and SAE-V. Prints a markdown table and writes
benchmarks/results/crowd_bench.json. tests/browser/test_crowd.py uses the same machinery.

On one 2-core machine the six Chromium renderers take most of the CPU the server needs, which in a
room would be six laptops' own. Each browser measurement therefore also reports the CPU seconds the
Chromium processes and the server spent from the moment the pages were opened until the last was drawn,
and the floor they imply: (browser + server CPU) / cores, the earliest the last page could be done if
the cores were shared perfectly and nothing waited. `--clients protocol` measures the server's part
alone: each user is a websocket client that sends what a browser sends on opening its link
(Streamlit's BackMsg) and reads the page's elements until the script run ends, with the metric values
and chart counts a browser shows. Both kinds run by default. `--server-env OMP_NUM_THREADS=1` starts
the servers with that setting.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil  # pinned in requirements.txt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS, ROOT  # noqa: E402  (every project path comes from analysis/framework/paths.py)
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
import screenshot  # noqa: E402

OUT = RESULTS / "crowd_bench.json"
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
    started = time.perf_counter()
    screenshot.wait_healthy(proc, port, timeout_s=180, poll_s=0.1)
    start_server.last_start_s = time.perf_counter() - started
    return proc, f"http://127.0.0.1:{port}", time.perf_counter()


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


# Each page watches itself (installed before Streamlit's code runs): after every change to its DOM it
# notes whether its state changed, and when. Python reads that twice a second, one call per page. The
# measurement used to ask each page over the DevTools protocol every 50 ms (five locator counts): with
# six idle pages that took 0.7 of the two cores (Chromium 5.4-6.5, Playwright's driver 3.2, Python 1.6
# CPU s in 15 s), on the cores it was measuring. Now about 0.05. (A timer in the page instead of the
# observer ran late: Chromium puts timers behind a loading page's other work, so pages read as done
# about 0.8 s after their last element appeared.)
WATCH = """(() => {
  const w = window.__crowdWatch = {state: null, since: null, firstIdle: null};
  const look = () => {
    const app = document.querySelector("[data-testid='stApp']");
    const idle = !!app && app.getAttribute("data-test-script-state") === "notRunning"
                 && document.querySelector("h1") !== null;
    const now = Date.now();
    if (idle && w.firstIdle === null) w.firstIdle = now;
    let state = null;
    if (idle && document.querySelector("[data-testid='stSkeleton']") === null)
      state = document.querySelectorAll("[data-testid='stMetric']").length + "/"
              + document.querySelectorAll("[data-testid='stPlotlyChart']").length;
    if (state !== w.state) { w.state = state; w.since = now; }
  };
  new MutationObserver(look).observe(document, {subtree: true, childList: true, attributes: true,
                                                attributeFilter: ["data-test-script-state", "data-testid"]});
  look();
})();"""
_READ = "() => window.__crowdWatch ? [window.__crowdWatch.state, window.__crowdWatch.since, " \
        "window.__crowdWatch.firstIdle, Date.now()] : null"


def settle_all(pages: list, timeout_ms: int, quiet_s: float = 1.0) -> list[float]:
    """Watch every page at once; for each, the moment (perf_counter) its script run ended for good:
    from then on it stayed idle, with the same cards and charts, for `quiet_s` (a rerun that a widget
    or a finished queue triggers starts within that time). Pages made by `new_page` carry the watcher
    from their first script on; any other page gets it at the first look."""
    return [d for d, _ in _settle_all(pages, timeout_ms, quiet_s)]


def _settle_all(pages: list, timeout_ms: int, quiet_s: float = 1.0) -> list[tuple[float, float]]:
    """settle_all, plus for each page the moment its first script run ended (the server's answer; the
    page may still be drawing placeholders then, and a widget may rerun it once it is drawn).

    A page is drawn when its script is not running, its title is there and no element is still a
    placeholder (Streamlit shows skeletons until a lazily loaded component, Plotly's on first use, has
    arrived: seconds on a busy machine); "notRunning" alone is also shown before the first run. The
    quiet time counts from this call at the earliest, so a rerun that an action just before it causes
    is waited for. A page made without the watcher (not by `new_page`) gets it now. The page's own
    clock (Date.now) and time.time() are the same clock here."""
    from playwright.sync_api import Error

    epoch = time.time() - time.perf_counter()  # perf_counter + epoch = Unix time
    called_ms = time.time() * 1000
    deadline = time.perf_counter() + timeout_ms / 1000
    done: list[tuple[float, float] | None] = [None] * len(pages)
    while any(d is None for d in done):
        if time.perf_counter() > deadline:
            raise TimeoutError("a page did not settle")
        for i, page in enumerate(pages):
            if done[i] is not None:
                continue
            try:
                seen = page.evaluate(_READ)
                if seen is None:  # a page made without the watcher: it watches from now on
                    page.evaluate(WATCH)
                    continue
            except Error as err:  # the page is navigating: its context is being replaced
                if "context" not in str(err).lower() and "navigat" not in str(err).lower():
                    raise
                continue
            state, since, first_idle, now = seen
            if state is not None and now - max(since, called_ms) >= quiet_s * 1000:
                done[i] = (since / 1000 - epoch, min(first_idle, since) / 1000 - epoch)
        time.sleep(0.5)  # the times come from the pages' clocks; this only decides when to stop
    return done  # type: ignore[return-value]


def settle(page, timeout_ms: int, quiet_s: float = 1.0) -> None:
    """Wait until one page's script run has ended for good (see settle_all)."""
    settle_all([page], timeout_ms, quiet_s)


def cpu_seconds(root: psutil.Process, name: str | None = None) -> float:
    """User + system CPU seconds of `root` and its living descendants (those whose process name contains
    `name`, when given). Chromium's processes all outlive a measurement, so nothing is lost to exits."""
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            if name is None or name in proc.name():
                t = proc.cpu_times()
                total += t.user + t.system
        except psutil.Error:  # it ended meanwhile
            pass
    return total


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
    return browser, [new_page(browser) for _ in range(n)]


def new_page(browser):
    """A page in a browser context of its own (one user's session) that watches itself for `settle_all`."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.add_init_script(WATCH)
    return context.new_page()


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
            me, server = psutil.Process(), psutil.Process(proc.pid)
            try:
                browsers0, server0 = cpu_seconds(me, "chrom"), cpu_seconds(server)
                pages = visit(pages_, base, USERS[:n], healthy_at)
                # the pages' last quiet second is idle for both, so it adds (almost) nothing here
                cpu = {"browsers": round(cpu_seconds(me, "chrom") - browsers0, 1),
                       "server": round(cpu_seconds(server) - server0, 1)}
            finally:
                stop_server(proc)
        finally:
            browser.close()
    cores = os.cpu_count() or 1
    return {"users": n, "all_done_s": max(p["done_s"] for p in pages),
            "all_first_runs_s": max(p["first_run_s"] for p in pages), "pages": pages,
            "server_start_s": round(start_server.last_start_s, 1),
            "exceptions": sum(len(p["exceptions"]) for p in pages),
            "cpu_s": cpu, "cpu_floor_s": round((cpu["browsers"] + cpu["server"]) / cores, 1)}


def protocol_user(base: str, path: str, query: str, go, timeout_s: float = 300) -> dict:
    """One user without a browser: a websocket client speaking Streamlit's own protocol (the BackMsg
    a browser sends on opening `path?query`, then the ForwardMsgs until the script run ends). What it
    times is the server's part alone: in a room each person's browser draws on their own laptop.
    `go` (a threading.Barrier) is passed when every user is connected; returns perf_counter times."""
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    from websockets.sync.client import connect

    url = base.replace("http", "ws", 1) + "/_stcore/stream"
    elements: dict[tuple, object] = {}
    with connect(url, subprotocols=["streamlit"], max_size=None, open_timeout=60) as ws:
        go.wait()
        msg = BackMsg()
        msg.rerun_script.query_string = query.lstrip("?")
        msg.rerun_script.page_name = path
        ws.send(msg.SerializeToString())
        sent, deadline = time.perf_counter(), time.perf_counter() + timeout_s
        while True:
            fm = ForwardMsg()
            fm.ParseFromString(ws.recv(timeout=max(0.1, deadline - time.perf_counter())))
            kind = fm.WhichOneof("type")
            if kind == "new_session":  # a script run starts: the page is redrawn from scratch
                elements.clear()
            elif kind == "delta" and fm.delta.WhichOneof("type") == "new_element":
                elements[tuple(fm.metadata.delta_path)] = fm.delta.new_element
            elif kind == "script_finished" and fm.script_finished in (
                    ForwardMsg.FINISHED_SUCCESSFULLY, ForwardMsg.FINISHED_WITH_COMPILE_ERROR):
                done = time.perf_counter()
                break
    numbers, exceptions, errors, charts = {}, [], [], 0
    for key in sorted(elements):
        el = elements[key]
        which = el.WhichOneof("type")
        if which == "metric" and not any(w in el.metric.label.lower() for w in TIME_WORDS):
            numbers[el.metric.label] = el.metric.body
        elif which == "exception":
            exceptions.append(f"{el.exception.type}: {el.exception.message}")
        elif which == "alert" and el.alert.format == el.alert.ERROR:
            errors.append(el.alert.body)
        elif which == "plotly_chart":
            charts += 1
    return {"page": f"{path}{query}", "sent": sent, "done": done, "exceptions": exceptions,
            "errors": errors, "charts": charts, "numbers": numbers}


def measure_protocol(n: int, env: dict | None = None) -> dict:
    """N protocol-level users (see protocol_user) open their pages together once the server is healthy."""
    import threading

    proc, base, healthy_at = start_server(env)
    go, results, failures = threading.Barrier(n + 1, timeout=120), [None] * n, []

    def user(i: int, path: str, query: str) -> None:
        try:
            results[i] = protocol_user(base, path, query, go)
        except Exception as exc:  # reported in the row, not raised from a thread
            failures.append(f"{path}{query}: {type(exc).__name__}: {exc}")
            go.abort()

    try:
        # more than six users: the same six links again (a second KV user on H2O computes it again only
        # if the first has not finished: the run store then has it)
        threads = [threading.Thread(target=user, args=(i, *USERS[i % len(USERS)])) for i in range(n)]
        for t in threads:
            t.start()
        try:
            go.wait()  # every user connected (a websocket opens in milliseconds)
        except threading.BrokenBarrierError:
            pass
        for t in threads:
            t.join()
    finally:
        stop_server(proc)
    if failures:
        raise RuntimeError("; ".join(failures))
    pages = []
    for r in results:
        pages.append({**{k: v for k, v in r.items() if k not in ("sent", "done")},
                      "done_s": round(r["done"] - healthy_at, 2), "run_s": round(r["done"] - r["sent"], 2)})
    return {"users": n, "clients": "protocol", "all_done_s": max(p["done_s"] for p in pages),
            "pages": pages, "server_start_s": round(start_server.last_start_s, 1),
            "exceptions": sum(len(p["exceptions"]) for p in pages)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="1,6")
    parser.add_argument("--clients", default="browser,protocol",
                        help="browser: headless Chromium pages on this machine; protocol: websocket clients "
                             "that speak Streamlit's protocol (the server's part alone)")
    parser.add_argument("--label", default="latest")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set this in the server's environment (repeatable), e.g. OMP_NUM_THREADS=1")
    args = parser.parse_args()
    env = {}
    for item in args.server_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            print(f"error: --server-env wants NAME=VALUE, got '{item}'", file=sys.stderr)
            return 2
        env[name] = value
    rows = []
    for clients in args.clients.split(","):
        for n in args.users.split(","):
            row = measure(int(n), env) if clients == "browser" else measure_protocol(int(n), env)
            rows.append({"clients": clients, **row})
    load = os.getloadavg()[0]
    print(f"\nMachine: {os.cpu_count()} cores, load average {load:.1f}; seconds from the server's health check "
          "passing. browser: Chromium pages on this machine (script run ended / page drawn); protocol: "
          "websocket clients, script run ended (the server's part).\n")
    print("| clients | users | server start → healthy | every page done | exceptions | CPU s: browsers + server "
          "(floor) | per page (s) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r["clients"] == "browser":
            done = f"{r['all_first_runs_s']:.1f} / {r['all_done_s']:.1f} s"
            per = ", ".join(f"{p['page'].split('?')[0]} {p['first_run_s']:.1f}/{p['done_s']:.1f}" for p in r["pages"])
        else:
            done = f"{r['all_done_s']:.1f} s"
            per = ", ".join(f"{p['page'].split('?')[0]} {p['done_s']:.1f}" for p in r["pages"])
        cpu = (f"{r['cpu_s']['browsers']:.1f} + {r['cpu_s']['server']:.1f} ({r['cpu_floor_s']:.1f} s)"
               if "cpu_s" in r else "")
        print(f"| {r['clients']} | {r['users']} | {r['server_start_s']:.1f} s | {done} | {r['exceptions']} | {cpu} "
              f"| {per} |")
    for clients in dict.fromkeys(r["clients"] for r in rows):
        mine = [r for r in rows if r["clients"] == clients]
        if len(mine) >= 2:
            print(f"\n{clients}: ratio N = {mine[-1]['users']} / N = {mine[0]['users']}: "
                  f"{mine[-1]['all_done_s'] / mine[0]['all_done_s']:.2f}")
    save_labelled(OUT, args.label, {"load": load, "server_env": env, "rows": rows})
    return 0


def save_labelled(path: Path, label: str, record: dict) -> None:
    """Store `record` (with the time) under `label` in the JSON file at `path`, keeping other labels."""
    previous = json.loads(path.read_text()) if path.is_file() else {}
    previous[label] = {**record, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(previous, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())

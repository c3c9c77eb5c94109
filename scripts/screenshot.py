"""Screenshot app pages in headless Chromium (Debian's /usr/bin/chromium) via Playwright.

    python scripts/screenshot.py --out shots "home" "attention-sharpness?model=zoo:shapes-lm&n=32"

Starts the app on a free local port (unless --url is given), opens each path, waits until
Streamlit has finished running the script, and saves a full-page PNG per path.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import ROOT  # noqa: E402  (every project path comes from analysis/framework/paths.py)
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(port: int, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port),
           "--server.address", "127.0.0.1", "--server.headless", "true"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_healthy(proc, port, timeout_s=90, poll_s=0.5)
    return proc


def wait_healthy(proc: subprocess.Popen, port: int, *, timeout_s: float, poll_s: float,
                 what: str = "the app") -> None:
    """Return once the Streamlit server `proc` on `port` answers its health check; kill it and raise
    if that takes longer than `timeout_s`."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
            return
        except OSError:
            time.sleep(poll_s)
    proc.kill()
    raise RuntimeError(f"{what} did not start within {timeout_s:g} s")


# Drawn: the script run has ended, the page shows an element (none before the first run), nothing lazily loaded is
# still a placeholder (Streamlit shows skeletons until a component, Plotly's on first use, has arrived) and every
# visible Plotly chart has its SVG.
DRAWN_JS = """() => {
  const app = document.querySelector("[data-testid='stApp']");
  return !!app && app.getAttribute('data-test-script-state') === 'notRunning'
    && !!document.querySelector("[data-testid='stElementContainer']")
    && !document.querySelector("[data-testid='stSkeleton']")
    && [...document.querySelectorAll("[data-testid='stPlotlyChart']")].filter(c => c.offsetParent !== null)
         .every(c => c.querySelector('.main-svg'));
}"""
# Notes when the script state or an element's kind last changed (a rerun starting or ending, a placeholder replaced)
# from the moment it is installed, and whether a script run has started or ended since (`ran`; set from the start
# unless the caller waits for one).
_WATCH_JS = """(needRun) => {
  const w = window.__renderWatch = {last: Date.now(), ran: !needRun};
  w.observer = new MutationObserver(records => {
    w.last = Date.now();
    if (records.some(r => r.attributeName === 'data-test-script-state')) w.ran = true;
  });
  w.observer.observe(document, {subtree: true, attributes: true,
                                attributeFilter: ['data-test-script-state', 'data-testid']});
}"""
# Drawn, a run seen where one was awaited, and quiet for `quiet` ms. A document that has no watcher is a new one (the
# page navigated): it gets one, its first run being the one awaited.
_QUIET_JS = f"""(quiet) => {{
  if (!window.__renderWatch) {{ ({_WATCH_JS})(false); return false; }}
  const w = window.__renderWatch;
  return w.ran && ({DRAWN_JS})() && Date.now() - w.last >= quiet;
}}"""


def wait_rendered(page, timeout_ms: int = 180_000, quiet_ms: int = 1000, *, action=None) -> None:
    """Until the page is drawn (DRAWN_JS) and nothing has changed for `quiet_ms`, counted from this call at the
    earliest, so a rerun that starts within that time is waited for. `action` (a click, a key press, a back
    navigation: a callable) is done here, after a watcher is installed, and then a script run must have started
    or ended before the page counts as drawn, however late a busy server answers. This used to be fixed sleeps
    (2 s a call); now a drawn page costs 1 s."""
    page.evaluate(_WATCH_JS, action is not None)
    if action is not None:
        action()
    page.wait_for_function(_QUIET_JS, arg=quiet_ms, timeout=timeout_ms, polling=100)


def shoot(base: str, paths: list[str], out: Path, width: int = 1400) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    files = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for path in paths:
            context = browser.new_context(viewport={"width": width, "height": 900})  # a fresh session per page
            page = context.new_page()
            url_path = "" if path in ("home", "/") else path.lstrip("/")  # the default page lives at /
            page.goto(f"{base}/{url_path}")
            wait_rendered(page)
            name = re.sub(r"[^A-Za-z0-9_-]+", "_", path.split("?")[0] or "home").strip("_") or "home"
            target = out / f"{name}.png"
            # Streamlit scrolls inside its own container, so grow the viewport to the content first.
            height = page.evaluate(
                "() => Math.max(...['[data-testid=stMain]', '[data-testid=stAppViewContainer]', "
                "'[data-testid=stSidebarContent]'].map(s => document.querySelector(s)?.scrollHeight || 0))")
            page.set_viewport_size({"width": width, "height": min(max(int(height) + 40, 900), 12000)})
            page.wait_for_timeout(800)
            page.screenshot(path=str(target), full_page=True)
            context.close()
            files.append(target)
        browser.close()
    return files


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--out", default="test-artifacts/screenshots")
    ap.add_argument("--url", default=None, help="use a running app instead of starting one")
    ap.add_argument("--width", type=int, default=1400)
    args = ap.parse_args()
    proc = None
    base = args.url
    if base is None:
        port = free_port()
        proc = start_app(port)
        base = f"http://127.0.0.1:{port}"
    try:
        for f in shoot(base, args.paths, Path(args.out), args.width):
            print(f)
    finally:
        if proc is not None:
            proc.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What one page load costs the browser, and the least six co-located pages can take on this machine.

    python benchmarks/browser_floor.py [--repeats 3] [--label NAME]

Opens each page in a fresh headless-Chromium context (one new user, nothing cached), waits until it
is drawn (crowd_bench's watcher: idle, no placeholder, a quiet second) and counts the CPU seconds all
Chromium processes spent, median of `--repeats` loads after one warm-up load (so the server's result
caches are warm and only the browser's work is counted). Pages:

- benchmarks/floor_app.py, a separate tiny Streamlit app: a bare page (title and a line of text), the
  same with one small Plotly chart, with one small `st.dataframe`, and with both;
- each of crowd_bench's six users' pages in the app (the crowd of issue 16), and the home page.

From these it prints the floor of a six-user crowd whose browsers share this machine's cores:
(sum of the pages' browser CPU) / cores, before the server does any work; the same for six bare
pages and six pages with one chart and one table, which no Streamlit page with a chart and a table
can go below. Writes benchmarks/results/browser_floor.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS, ROOT  # noqa: E402  (every project path comes from analysis/framework/paths.py)
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
import crowd_bench as cb  # noqa: E402
import screenshot  # noqa: E402
from cold_bench import machine  # noqa: E402

OUT = RESULTS / "browser_floor.json"
FLOOR_PAGES = ["bare", "chart", "table", "chart+table"]


def start_floor_app() -> tuple[subprocess.Popen, str]:
    port = screenshot.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "benchmarks" / "floor_app.py"),
                             "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--server.headless", "true"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    screenshot.wait_healthy(proc, port, timeout_s=120, poll_s=0.1, what="the floor app")
    return proc, f"http://127.0.0.1:{port}"


def page_cpu(browser, url: str, repeats: int) -> list[float]:
    """Chromium CPU seconds of `repeats` fresh loads of `url` (after one warm-up load)."""
    me, out = psutil.Process(), []
    for i in range(repeats + 1):
        page = cb.new_page(browser)
        before = cb.cpu_seconds(me, "chrom")
        page.goto(url, wait_until="commit")
        cb.settle(page, 300_000)
        if i:
            out.append(round(cb.cpu_seconds(me, "chrom") - before, 2))
        page.context.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--label", default="latest")
    args = parser.parse_args()
    if args.repeats < 1:
        print("error: --repeats must be at least 1", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=cb.CHROMIUM, args=screenshot.CHROMIUM_ARGS)
        try:
            proc, base = start_floor_app()
            try:
                for what in FLOOR_PAGES:
                    xs = page_cpu(browser, f"{base}/?what={what}", args.repeats)
                    rows.append({"app": "floor", "page": what, "cpu_s": xs})
                    print(f"floor {what}: {statistics.median(xs):.2f} CPU s", flush=True)
            finally:
                cb.stop_server(proc)
            proc, base, _ = cb.start_server()
            try:
                for path, query in [("", "")] + cb.USERS:
                    xs = page_cpu(browser, f"{base}/{path}{query}", args.repeats)
                    rows.append({"app": "model-inspector", "page": (path or "home") + query, "cpu_s": xs})
                    print(f"app {(path or 'home') + query}: {statistics.median(xs):.2f} CPU s", flush=True)
            finally:
                cb.stop_server(proc)
        finally:
            browser.close()
    cores = os.cpu_count() or 1
    med = {(r["app"], r["page"]): statistics.median(r["cpu_s"]) for r in rows}
    crowd_pages = [(path or "home") + query for path, query in cb.USERS]
    n = len(crowd_pages)
    floors = {
        f"{n} bare Streamlit pages": n * med[("floor", "bare")] / cores,
        f"{n} pages with one chart and one table": n * med[("floor", "chart+table")] / cores,
        f"crowd_bench's {n} pages": sum(med[("model-inspector", pg)] for pg in crowd_pages) / cores,
    }
    print(f"\nMachine: {machine()}. Chromium CPU seconds per fresh page load (median of {args.repeats}):\n")
    print("| app | page | Chromium CPU s |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['app']} | {r['page']} | {statistics.median(r['cpu_s']):.2f} |")
    print(f"\nFloor of {n} co-located browsers on {cores} cores (browser CPU / cores, before any server work):\n")
    for name, s in floors.items():
        print(f"- {name}: {s:.1f} s")
    cb.save_labelled(OUT, args.label, {"machine": machine(), "cores": cores, "repeats": args.repeats, "rows": rows,
                                       "floors_s": {k: round(v, 2) for k, v in floors.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())

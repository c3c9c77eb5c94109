"""The first screen, in a real browser (issue #47): every page and every preset, at 1024x768 (a projector) and
at 1440x900, shows its headline (the metric cards and the first figure that carry the finding) inside the first
viewport, and no table is cut: a table fits its box, or scrolls inside it with its first columns fixed.

One server and one browser for the whole file, one visit per page and size, every check on that visit."""
from __future__ import annotations

import os
import shutil
import sys
from urllib.parse import urlencode

import pytest

from analysis.framework import presets
from analysis.framework.paths import ROOT
from components.registry import PANELS

sys.path.insert(0, str(ROOT / "scripts"))
import screenshot  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not shutil.which(CHROMIUM), reason="Debian chromium is not installed")

SIZES = [(1024, 768), (1440, 900)]
FIGURE_SHOWN_PX = 150  # at least this much of the headline's figure (or text) is on the first screen


def _targets() -> list[tuple[str, str, bool]]:
    """(name, URL path, has a headline) of the home page, every page's default view and every preset."""
    out = [("home", "", False)]
    for panel in PANELS:
        if not panel.available:
            continue
        query = "?model=zoo:shapes-vlm" if panel.kinds[0] == "vlm" else ""
        out.append((panel.url_path, f"{panel.url_path}{query}", bool(panel.name)))
    out += [(f"{p.panel}/{p.name}", f"{p.panel}?{urlencode(p.query())}", True) for p in presets.all_presets()]
    return out


ONLY = os.environ.get("FIRST_SCREEN_ONLY", "")  # while working on a page: a comma-separated part of target names
TARGETS = [t for t in _targets() if not ONLY or any(part in t[0] for part in ONLY.split(","))]

# Where the headline's parts are, relative to the first viewport.
HEADLINE_JS = """() => {
  // the page framework's headline (components/view.py); a page without one: its first metric and figure anywhere
  const h = document.querySelector('.st-key-headline') || document.querySelector("[data-testid='stMain']");
  const box = el => { if (!el) return null; const r = el.getBoundingClientRect();
                      return r.height > 0 ? {top: r.top, bottom: r.bottom} : null; };
  const figure = h.querySelector("[data-testid='stPlotlyChart'], [data-testid='stHtml'], [data-testid='stDataFrame'], "
                                 + "[data-testid='stMarkdown'] span[style], [data-testid='stColumn']");
  return {metric: box(h.querySelector("[data-testid='stMetric']")), figure: box(figure), height: window.innerHeight};
}"""

# Every table in the main area: its box, how wide its content is, and whether the box scrolls.
TABLES_JS = """() => [...document.querySelectorAll("[data-testid='stMain'] [data-testid='stDataFrame'], "
                                                + "[data-testid='stMain'] [data-testid='stTable']")].map((el, i) => {
  const r = el.getBoundingClientRect();
  // a dataframe's grid scrolls in its .dvn-scroller; an st.table's <table> in its parent
  const scroller = el.querySelector('.dvn-scroller') || el.querySelector('table')?.parentElement;
  const folded = el.closest('details') && !el.closest('details').open;  // laid out, but in a folded expander
  if (!scroller) return {i, visible: false};
  const inner = el.querySelector('table') || scroller;
  const style = getComputedStyle(scroller);
  return {i, kind: el.getAttribute('data-testid'), visible: r.width > 0 && r.height > 0 && !folded,
          box: Math.round(scroller.clientWidth), content: Math.round(Math.max(scroller.scrollWidth, inner.scrollWidth)),
          right: Math.round(r.right), main: Math.round(document.querySelector("[data-testid='stMain']").getBoundingClientRect().right),
          scrolls: ['auto', 'scroll'].includes(style.overflowX)};
})"""


# Drawn: Streamlit's script finished, nothing lazily loaded is pending, every plotly chart has its svg.
DRAWN_JS = """() => {
  const app = document.querySelector("[data-testid='stApp']");
  return !!app && app.getAttribute('data-test-script-state') === 'notRunning' && !!document.querySelector('h1')
    && !document.querySelector("[data-testid='stSkeleton']")
    && [...document.querySelectorAll("[data-testid='stPlotlyChart']")].every(c => c.querySelector('.main-svg'));
}"""


def _wait_drawn(page) -> None:
    """Until the page is drawn and still is 300 ms later (a preset that switches model reruns the script)."""
    for _ in range(2):
        page.wait_for_function(DRAWN_JS, timeout=180_000, polling=100)
        page.wait_for_timeout(300)
    page.wait_for_function(DRAWN_JS, timeout=180_000, polling=100)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    port = screenshot.free_port()
    store = tmp_path_factory.mktemp("store") / "analyses.db"
    proc = screenshot.start_app(port, env={"MODEL_INSPECTOR_STORE": str(store)})
    try:
        with sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=CHROMIUM, args=screenshot.CHROMIUM_ARGS)
            yield f"http://127.0.0.1:{port}", chromium
            chromium.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _first_columns_fixed(page, frame) -> bool:
    """Scroll a wide table to its right end: its left strip (the first column, header and rows) must not change."""
    frame.scroll_into_view_if_needed()
    box = frame.bounding_box()
    clip = {"x": box["x"] + 2, "y": box["y"] + 2, "width": 28, "height": min(box["height"] - 4, 120)}
    before = page.screenshot(clip=clip)
    frame.locator(".dvn-scroller").evaluate("e => { e.scrollLeft = e.scrollWidth; }")
    page.wait_for_timeout(200)
    after = page.screenshot(clip=clip)
    frame.locator(".dvn-scroller").evaluate("e => { e.scrollLeft = 0; }")
    return before == after


def _problems(page, has_headline: bool) -> list[str]:
    """Everything wrong with the page as drawn now."""
    found = []
    if page.locator("[data-testid='stException']").count():
        found.append("an exception: " + page.locator("[data-testid='stException']").first.inner_text()[:300])
    if has_headline:
        where = page.evaluate(HEADLINE_JS)
        if where is None or (where["metric"] is None and where["figure"] is None):
            found.append("no headline (metric cards or first figure) at all")
        else:
            height = where["height"]
            if where["metric"] is not None and where["metric"]["bottom"] > height:
                found.append(f"the headline's metrics end at {where['metric']['bottom']:.0f} px, below the first "
                             f"screen ({height} px)")
            if where["figure"] is not None and where["figure"]["top"] > height - FIGURE_SHOWN_PX:
                found.append(f"the headline's figure starts at {where['figure']['top']:.0f} px: less than "
                             f"{FIGURE_SHOWN_PX} px of it on the first screen ({height} px)")
    for t in page.evaluate(TABLES_JS):
        if not t["visible"]:
            continue  # in a folded expander
        if t["right"] > t["main"] + 1:
            found.append(f"table {t['i']} ({t['kind']}) reaches past the page: right edge {t['right']} > {t['main']}")
        if t["content"] <= t["box"] + 2:
            continue  # it fits
        if not t["scrolls"]:
            found.append(f"table {t['i']} ({t['kind']}) is cut: {t['content']} px of content in a {t['box']} px box "
                         "that does not scroll")
        elif t["kind"] == "stDataFrame" and not _first_columns_fixed(
                page, page.locator("[data-testid='stMain'] [data-testid='stDataFrame'], "
                                   "[data-testid='stMain'] [data-testid='stTable']").nth(t["i"])):
            found.append(f"table {t['i']} scrolls ({t['content']} px in {t['box']} px) but its first column moves "
                         "with it: a far-right value cannot be matched to its row")
    return found


SIDEBAR_JS = """() => { const s = document.querySelector("[data-testid='stSidebar']");
  return s ? {collapsed: s.getAttribute('data-collapsed') === 'true', right: s.getBoundingClientRect().right} : null; }"""


def test_the_sidebar_starts_folded_at_1024_px_and_opens(browser):
    """At 1024 px the open sidebar took 29 % of the width: it starts folded there (and open at 1440 px), its
    chevron opens it, and that choice is kept on the next load (components/narrow_sidebar.py)."""
    base, chromium = browser
    for (width, height), folded in ((SIZES[0], True), (SIZES[1], False)):
        context = chromium.new_context(viewport={"width": width, "height": height})
        page = context.new_page()
        try:
            page.goto(f"{base}/attention-sharpness")
            _wait_drawn(page)
            page.wait_for_function(f"() => document.querySelector(\"[data-testid='stSidebar']\")"
                                   f"?.getAttribute('data-collapsed') === '{str(folded).lower()}'", timeout=10_000)
            assert page.evaluate(SIDEBAR_JS)["collapsed"] is folded, width
            if folded:
                page.locator("[data-testid='stExpandSidebarButton']").click()
                page.wait_for_timeout(500)
                shown = page.evaluate(SIDEBAR_JS)
                assert not shown["collapsed"] and shown["right"] > 200, shown
                page.reload()
                _wait_drawn(page)
                page.wait_for_timeout(500)
                assert not page.evaluate(SIDEBAR_JS)["collapsed"]  # the visitor opened it: it stays open
        finally:
            context.close()


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_every_page_and_preset_shows_its_finding_first_and_cuts_no_table(browser, size):
    base, chromium = browser
    context = chromium.new_context(viewport={"width": size[0], "height": size[1]})
    page = context.new_page()
    failures = {}
    try:
        for name, path, has_headline in TARGETS:
            page.goto(f"{base}/{path}")
            _wait_drawn(page)
            first_screen = page.screenshot()  # before the table checks scroll the page
            problems = _problems(page, has_headline)
            if problems:
                failures[name] = problems
                artifacts = ROOT / "test-artifacts" / "first-screen"
                artifacts.mkdir(parents=True, exist_ok=True)
                (artifacts / f"{name.replace('/', '__')}_{size[0]}.png").write_bytes(first_screen)
    finally:
        context.close()
    assert not failures, "\n".join(f"{name}: {'; '.join(p)}" for name, p in failures.items())

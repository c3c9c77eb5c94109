"""Every page and every preset in a real browser (issue #47 and what a presenter must see):
- the first screen, at 1024x768 (a projector) and at 1440x900: the headline (the metric cards and the first figure
  that carry the finding) inside the first viewport, and no table cut (a table fits its box, or scrolls inside it
  with its first columns fixed);
- presentable: no exception, nothing asked of another host, no preset title, metric or select-box value cut and
  every chart's text clear, at 1024 px (and at 1440 px for each page's default view, with at least one chart);
  a full-page screenshot of each default view under test-artifacts/screenshots/.

One visit per preset and two per page, on the process's app server and Chromium (tests/conftest.py): every check
at 1024x768; a preset's window then widened to 1440x900 and its first screen checked again (a resize reruns no
script), a page's default view opened afresh at 1440x900. The tests below read what those visits found."""
from __future__ import annotations

import os
import shutil
from urllib.parse import urlencode

import pytest

from analysis.framework import presets
from analysis.framework.paths import ROOT
from components.narrow_sidebar import NARROW_PX  # the sidebar starts folded in a narrower window
from components.registry import PANELS
from page_checks import assert_nothing_cut, is_outside

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not shutil.which(CHROMIUM), reason="Debian chromium is not installed")

SIZES = [(1024, 768), (1440, 900)]
FIGURE_SHOWN_PX = 150  # at least this much of the headline's figure (or text) is on the first screen


def _targets() -> list[tuple[str, str, bool]]:
    """(name, URL path, has a headline) of the home page, every page's default view and every preset (named
    panel/preset)."""
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
def browser(app_server, chromium):
    """The process's app server and Chromium (tests/conftest.py)."""
    return app_server.base, chromium


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


RESIZED_SETTLE_MS = 400  # a resize reruns no script: the charts and grids re-lay themselves out after it
# Laid out at the window's width: every visible Plotly chart as wide as its box (a chart redraws at the new width a
# moment after a resize; on a busy machine more than half a second later).
RELAID_JS = """() => [...document.querySelectorAll("[data-testid='stPlotlyChart']")].filter(c => c.offsetParent !== null)
  .every(c => { const svg = c.querySelector('.main-svg'); const plot = c.querySelector('.js-plotly-plot');
                return !!svg && !!plot
                  && Math.abs(svg.getBoundingClientRect().width - plot.getBoundingClientRect().width) <= 2; })"""
ARTIFACTS = ROOT / "test-artifacts"
PAGES = [("home", None)] + [(p.url_path, p) for p in PANELS if p.available]
PANEL_OF = {p.url_path: p for p in PANELS}


def _cut(page, url_path: str) -> str:
    """What assert_nothing_cut finds wrong ('' when nothing): titles, metrics, select boxes, chart texts."""
    try:
        assert_nothing_cut(page, url_path, PANEL_OF.get(url_path))
    except AssertionError as err:
        return str(err) or "something is cut"
    return ""


# The sidebar's state: Streamlit keeps a visitor's choice in localStorage; a fresh visitor has none.
FORGET_SIDEBAR_JS = """() => { try { Object.keys(localStorage).filter(k => k.startsWith('stSidebarCollapsed-'))
                                          .forEach(k => localStorage.removeItem(k)); } catch (e) {} }"""
COLLAPSED_JS = """() => document.querySelector("[data-testid='stSidebar']")
                              ?.getAttribute('data-collapsed') === 'true'"""


def _sidebar_settled(page, folded: bool) -> None:
    """The sidebar as a fresh visit at this width shows it: folded below 1100 px (components/narrow_sidebar.py folds
    it on the first run; wait for that), open above (a window widened after that fold is opened here, and the
    choice this stores is forgotten again)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    if folded:
        try:
            page.wait_for_function(COLLAPSED_JS, timeout=3_000, polling=100)
        except PlaywrightTimeout:
            return  # a page with no sidebar to fold
    elif page.evaluate(COLLAPSED_JS):
        page.locator("[data-testid='stExpandSidebarButton']").click()
        page.wait_for_function(f"() => !({COLLAPSED_JS})()", timeout=10_000, polling=100)
        page.evaluate(FORGET_SIDEBAR_JS)
    else:
        return
    _relaid(page)  # the main area's width changed: charts and grids re-lay out


def _resize(page, size: tuple[int, int]) -> None:
    page.set_viewport_size({"width": size[0], "height": size[1]})
    _relaid(page)


def _relaid(page) -> None:
    page.wait_for_timeout(RESIZED_SETTLE_MS)
    page.wait_for_function(DRAWN_JS, timeout=60_000, polling=100)
    for _ in range(2):  # and still, 300 ms later (the sidebar slides open: the width changes more than once)
        page.wait_for_function(RELAID_JS, timeout=20_000, polling=100)
        page.wait_for_timeout(300)


@pytest.fixture(scope="module")
def visits(browser):
    """{target name: what its one visit found}: 'first' {size: first-screen problems}, 'outside' (requests to
    other hosts), 'exception', 'title', 'charts', 'cut' {width: what is cut}. The first screen of each failing
    size is saved under test-artifacts/first-screen/."""
    base, chromium = browser
    found: dict[str, dict] = {}
    outside: list[str] = []
    context = chromium.new_context(viewport={"width": SIZES[0][0], "height": SIZES[0][1]})
    context.on("request", lambda request: outside.append(request.url) if is_outside(request.url) else None)
    page = context.new_page()
    try:
        for name, path, has_headline in TARGETS:
            url_path = name.split("/")[0] if "/" in name else ("" if name == "home" else name)
            seen = found[name] = {"first": {}, "cut": {}, "error": ""}
            outside.clear()
            try:
                _visit(page, base, name, path, has_headline, url_path, seen)
            except Exception as err:  # a page that never draws fails its own tests, not the whole file's
                seen["error"] = f"{type(err).__name__}: {err}"[:2000]
            seen["outside"] = sorted(set(outside))
    finally:
        context.close()
    return found


def _visit(page, base: str, name: str, path: str, has_headline: bool, url_path: str, seen: dict) -> None:
    """One target, as a new visitor: opened at 1024x768 (sidebar folded), its first screen checked, then what a
    presenter must see whole (with the sidebar opened, as they would). A preset is then widened to 1440x900 (the
    sidebar open, as a wider window starts) and its first screen checked again; a page's default view is opened
    afresh at 1440x900 for the same and for what must be whole there, and its full-page picture. (Plotly keeps
    the margins it made room with at a narrower width after a resize: chart texts are judged on fresh loads.)"""
    key = url_path or "home"
    for i, size in enumerate(SIZES):
        if i == 0 or "/" not in name:
            page.evaluate(FORGET_SIDEBAR_JS)  # a new visitor: no stored choice to open or fold the sidebar
            page.set_viewport_size({"width": size[0], "height": size[1]})
            page.goto(f"{base}/{path}")
            _wait_drawn(page)
            _sidebar_settled(page, folded=size[0] < NARROW_PX)
        else:
            page.evaluate("window.scrollTo(0, 0)")
            _resize(page, size)
            _sidebar_settled(page, folded=False)
        if i == 0:
            seen["title"] = page.locator("h1").first.inner_text().strip() if page.locator("h1").count() else ""
            seen["charts"] = page.locator("[data-testid='stPlotlyChart']").count()
        first_screen = page.screenshot()  # before the table checks scroll the page
        problems = _problems(page, has_headline)
        seen["first"][size] = problems
        if problems:
            (ARTIFACTS / "first-screen").mkdir(parents=True, exist_ok=True)
            (ARTIFACTS / "first-screen" / f"{name.replace('/', '__')}_{size[0]}.png").write_bytes(first_screen)
        if i == 0 or "/" not in name:  # presets at 1024 px, the default views at both sizes
            _sidebar_settled(page, folded=False)  # as a presenter opens it: its select boxes whole too
            seen["cut"][size[0]] = _cut(page, key)
        seen["exception"] = seen.get("exception", []) + page.locator("[data-testid='stException']").all_inner_texts()
    if "/" not in name:  # a page's default view: its picture for the record
        (ARTIFACTS / "screenshots").mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "screenshots" / f"{key}.png"), full_page=True)

@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_every_page_and_preset_shows_its_finding_first_and_cuts_no_table(visits, size):
    failures = {name: seen["first"][size] if not seen["error"] else [seen["error"]]
                for name, seen in visits.items() if seen["error"] or seen["first"].get(size)}
    assert not failures, "\n".join(f"{name}: {'; '.join(p)}" for name, p in failures.items())


def _seen(visits: dict, name: str) -> dict:
    if name not in visits:
        pytest.skip(f"{name} is not among FIRST_SCREEN_ONLY's targets")
    seen = visits[name]
    assert not seen["error"], seen["error"]
    return seen


@pytest.mark.parametrize("url_path,panel", PAGES, ids=[p[0] for p in PAGES])
def test_page_renders_in_browser(visits, url_path, panel):
    """Each page's default view (a VLM panel's on the VLM demo model): drawn with no exception, a title, at least
    one chart on a panel with the demo zoo, nothing asked of other hosts, and nothing cut at 1440 or 1024 px."""
    from analysis.model_access.models import zoo_models

    seen = _seen(visits, url_path)
    assert seen["exception"] == []
    assert seen["title"] != ""
    assert seen["outside"] == [], f"the page asked other hosts: {seen['outside']}"
    if panel is not None and panel.page != "saved_analyses.py" and zoo_models():
        assert seen["charts"] >= 1  # every panel shows at least one chart on the default demo model
    assert seen["cut"] == {SIZES[1][0]: "", SIZES[0][0]: ""}, seen["cut"]


@pytest.mark.parametrize("preset", presets.PRESETS, ids=[f"{p.panel}-{p.name}" for p in presets.PRESETS])
def test_every_preset_permalink_is_presentable_at_1024_px(visits, preset):
    """What a presenter opens in a talk, on a 1024-px projector: no exception, nothing asked of other hosts,
    no preset title, metric or select-box value cut, and every chart's text clear (the default views use the
    same figure builders, but presets reach views and settings they do not)."""
    from conftest import zoo_model_ready

    if not zoo_model_ready(preset.model):
        pytest.skip(f"{preset.model} is not converted here (the suite never converts a real model)")
    seen = _seen(visits, f"{preset.panel}/{preset.name}")
    assert seen["exception"] == []
    assert seen["outside"] == [], f"the page asked other hosts: {seen['outside']}"
    assert seen["cut"] == {SIZES[0][0]: ""}, seen["cut"]

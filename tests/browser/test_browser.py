"""Real browser: Debian's headless Chromium, driven by Playwright, opens every page of the app."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

from analysis.framework import presets
from components.registry import PANELS

from analysis.framework.paths import ROOT
sys.path.insert(0, str(ROOT / "scripts"))
import screenshot  # noqa: E402

ARTIFACTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

pytestmark = pytest.mark.skipif(not shutil.which(CHROMIUM), reason="Debian chromium is not installed")

PAGES = [("home", None)] + [(p.url_path, p) for p in PANELS if p.available]

# every request the page made to a host other than the app's own (it must run offline and tell nobody)
OUTSIDE: list[str] = []


def _remember_outside(request) -> None:
    from urllib.parse import urlparse

    url = urlparse(request.url)
    if url.scheme not in ("data", "blob", "about") and url.hostname not in ("127.0.0.1", "localhost"):
        OUTSIDE.append(request.url)


@pytest.fixture(scope="module")
def browser_page(chromium, app_server):
    """One page for the module, on the process's app server and Chromium (tests/conftest.py)."""
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.on("request", _remember_outside)
    yield app_server.base, page
    context.close()


def open_offline(page, url: str) -> None:
    """Open `url`, wait until it is drawn, and check it asked no host but the app's own."""
    OUTSIDE.clear()
    page.goto(url)
    screenshot.wait_rendered(page)
    assert OUTSIDE == [], f"the page asked other hosts: {sorted(set(OUTSIDE))}"


@pytest.mark.parametrize("url_path,panel", PAGES, ids=[p[0] for p in PAGES])
def test_page_renders_in_browser(browser_page, url_path, panel):
    base, page = browser_page
    # the demo model of the panel's first kind (the one its default view is made for, as the warm command)
    query = "?model=zoo:shapes-vlm" if panel is not None and panel.kinds[0] == "vlm" else ""
    open_offline(page, f"{base}/" if url_path == "home" else f"{base}/{url_path}{query}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{url_path}.png"), full_page=True)
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("h1").first.inner_text().strip() != ""
    from analysis.model_access.models import zoo_models

    if panel is not None and panel.page != "saved_analyses.py" and zoo_models():
        # every panel shows at least one chart on the default demo model
        assert page.locator("[data-testid='stPlotlyChart']").count() >= 1
    # a presenter reads whole titles and numbers, on a wide screen and on a 1024-px projector
    for width in (1400, 1024):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(800)  # reflow only (resizing does not rerun the script); Plotly redraws
        assert_nothing_cut(page, url_path, panel)
    page.set_viewport_size({"width": 1400, "height": 900})


# [text (after any icon), cut?] of every visible element a selector finds: cut when the element or
# one inside it is narrower than its text (Streamlit also keeps a hidden twin of each button)
SHOWN = """s => [...document.querySelectorAll(s)].filter(e => e.getClientRects().length > 0)
    .map(e => [e.innerText.trim().split("\\n").pop(),
               [e, ...e.querySelectorAll('*')].some(c => c.scrollWidth > c.clientWidth + 1)])"""


def assert_nothing_cut(page, url_path, panel):
    """Preset titles (the home page's tour links or a panel's preset buttons), every metric's label and
    value and every select box's value are shown whole, not cut to an ellipsis; the sharpness page's
    item counts are all on screen; no chart's text runs into another or off its chart."""
    if panel is None:
        links = page.evaluate(SHOWN, "[data-testid='stPageLink']")
        titles = {t for t, _ in links}
        assert all(p.title in titles for p in presets.PRESETS), titles
        assert [t for t, cut in links if cut] == []
    else:
        buttons = page.evaluate(SHOWN, "[class*='st-key-preset_'] button")
        assert sorted(t for t, _ in buttons) == sorted(p.title for p in presets.for_panel(url_path))
        assert [t for t, cut in buttons if cut] == []
    metrics = page.evaluate(SHOWN, "[data-testid='stMetricLabel'], [data-testid='stMetricValue']")
    assert [t for t, cut in metrics if cut] == []
    # a select box shows its whole value (equal columns once left the layer and head boxes empty)
    selects = page.evaluate(SHOWN, "[data-testid='stSelectbox']")  # [its label, value cut?]
    assert [t for t, cut in selects if cut] == []
    if url_path == "attention-sharpness":
        # every item count is one click away (a multiselect's chips scrolled sideways and hid 64 and 128),
        # once the settings are open (a preset's start folded, under its finding)
        settings = page.locator("[data-testid='stExpander'] details").filter(has_text="Settings").first
        if not settings.evaluate("d => d.open"):
            settings.locator("summary").first.click()
            page.wait_for_timeout(500)
        page.locator(".st-key-sh_ns").scroll_into_view_if_needed()  # below the finding: on screen once scrolled to
        page.wait_for_timeout(300)
        assert options_off_screen(page, "sh_ns", ["2", "4", "8", "16", "32", "64", "128", "256", "512"]) == {}
    # inside every chart: no title, axis title, panel title or legend entry runs into another text, an
    # axis title into ticks or another panel's plot, or any of them past the chart's edge (three panels
    # in one chart overlapped their titles at 1024 px; long titles ran off 440-px charts)
    assert page.evaluate(CHART_TEXT) == []


# [chart title, text, what it runs into] for every chart on the page
CHART_TEXT = """() => {
    const box = (e, t) => { const r = e.getBoundingClientRect();
        return {t: t ?? (e.textContent || "").trim().slice(0, 40), x0: r.left, y0: r.top, x1: r.right, y1: r.bottom}; };
    const real = b => b.x1 - b.x0 > 0 && b.t;
    const hit = (a, b) => Math.min(a.x1, b.x1) - Math.max(a.x0, b.x0) > 2
                          && Math.min(a.y1, b.y1) - Math.max(a.y0, b.y0) > 2;
    const out = [];
    document.querySelectorAll(".js-plotly-plot").forEach(plot => {
        const name = (plot.querySelector(".gtitle") || {}).textContent || "untitled chart";
        const axisTitles = [...plot.querySelectorAll(".infolayer g")]
            .filter(g => /^g-[xy]\\d*title$/.test(g.getAttribute("class") || ""))
            .flatMap(g => [...g.querySelectorAll("text")]).map(e => box(e)).filter(real);
        const texts = axisTitles.concat([...plot.querySelectorAll(
            ".g-gtitle text, .annotation-text, .legendtext, .legendtitletext")].map(e => box(e)).filter(real));
        const ticks = [...plot.querySelectorAll(".xtick text, .ytick text")].map(e => box(e)).filter(real);
        const areas = [...plot.querySelectorAll(".draglayer .nsewdrag")].map(e => box(e, "a plot area"));
        const frame = plot.getBoundingClientRect();
        for (let a = 0; a < texts.length; a++) {
            for (let b = a + 1; b < texts.length; b++)
                if (hit(texts[a], texts[b])) out.push([name, texts[a].t, texts[b].t]);
            const t = texts[a];
            if (t.x0 < frame.left - 1 || t.x1 > frame.right + 1 || t.y0 < frame.top - 1 || t.y1 > frame.bottom + 1)
                out.push([name, t.t, "the chart's edge"]);
        }
        for (const a of axisTitles) {
            const tick = ticks.find(t => hit(a, t));
            if (tick) out.push([name, a.t, "tick " + tick.t]);
            const area = areas.find(t => hit(a, t));
            if (area) out.push([name, a.t, area.t]);
        }
    });
    return out;
}"""


# {label: "missing" | "clipped"} for each label that the widget with this key does not show whole on
# screen: no visible element with that text, or each one reaches past the window's width or past an
# ancestor that clips or scrolls its overflow
OFF_SCREEN = """([key, labels]) => {
    const box = document.querySelector(`.st-key-${key}`);
    const inside = (r, o) => r.left >= o.left - 1 && r.right <= o.right + 1 && r.top >= o.top - 1
                             && r.bottom <= o.bottom + 1;
    const clipped = e => {
        const r = e.getBoundingClientRect();
        if (r.width === 0 || r.left < 0 || r.right > window.innerWidth) return true;
        for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
            const style = getComputedStyle(a);
            const clips = style.overflowX !== "visible" || style.overflowY !== "visible";
            if (clips && !inside(r, a.getBoundingClientRect())) return true;
        }
        return false;
    };
    const text = e => (e.innerText ?? e.textContent ?? "").trim();  // svg parts have no innerText
    const result = {};
    for (const label of labels) {
        const own = [...(box ? box.querySelectorAll("*") : [])].filter(e => e.getClientRects().length > 0
            && text(e) === label && ![...e.children].some(c => text(c) === label));
        if (own.length === 0) result[label] = "missing";
        else if (own.every(clipped)) result[label] = "clipped";
    }
    return result;
}"""


def options_off_screen(page, key, labels):
    return page.evaluate(OFF_SCREEN, [key, labels])


def test_share_bar_opens_and_saves_in_browser(browser_page):
    """The share bar is drawn empty and filled when clicked (a rerun); Save says so below it, and the
    bar stays open."""
    base, page = browser_page
    page.goto(f"{base}/attention-sharpness")
    screenshot.wait_rendered(page)
    bar = page.locator("[data-testid='stExpander']").filter(has_text="Share, save and export")
    assert bar.count() == 1 and page.locator("[data-testid='stCode']").count() == 0
    bar.locator("summary").click()
    page.locator("[data-testid='stCode']").first.wait_for(timeout=60_000)
    assert "attention-sharpness" in page.locator("[data-testid='stCode']").first.inner_text()
    page.get_by_label("Title").fill("browser save <i>check</i>")
    page.get_by_role("button", name="Save").click()
    notice = page.locator("[data-testid='stAlertContentSuccess']").filter(has_text="saved-analyses?id=")
    notice.wait_for(timeout=60_000)
    assert "<i>" in notice.inner_text()  # shown as typed, not as markup
    assert page.locator("[data-testid='stCode']").count() == 2  # the bar is still open (link, iframe snippet)


def test_paired_charts_sit_side_by_side_when_wide_and_stack_when_narrow(browser_page):
    """KV-cache's KL and needle-survival charts: one row at 1400 px; at 1024 px, where half a row
    is ~260 px, the second goes under the first at full size instead of being squeezed."""
    base, page = browser_page
    page.goto(f"{base}/kv-cache")
    screenshot.wait_rendered(page)
    # the page shows one section at a time
    page.locator("[data-testid='stButtonGroup'] button").filter(has_text="KL and needle survival").first.click()
    screenshot.wait_rendered(page)
    boxes = lambda: [page.locator(f".st-key-{key}").bounding_box() for key in ("kv_kl", "kv_survival")]  # noqa: E731
    try:
        for width, side_by_side in ((1400, True), (1024, False)):
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_timeout(300)
            kl, survival = boxes()
            assert kl["width"] >= 400 and survival["width"] >= 400, (width, kl, survival)
            if side_by_side:
                assert abs(kl["y"] - survival["y"]) < 5 and survival["x"] > kl["x"] + kl["width"] - 1
            else:
                assert survival["y"] >= kl["y"] + kl["height"] - 1
    finally:
        page.set_viewport_size({"width": 1400, "height": 900})


@pytest.mark.parametrize("preset", presets.PRESETS, ids=[f"{p.panel}-{p.name}" for p in presets.PRESETS])
def test_every_preset_permalink_is_presentable_at_1024_px(browser_page, preset):
    """What a presenter opens in a talk, on a 1024-px projector: no exception, nothing asked of other
    hosts, no preset title, metric or select-box value cut, and every chart's text clear (the default
    views above use the same figure builders, but presets reach views and settings they do not)."""
    from urllib.parse import urlencode

    from conftest import zoo_model_ready

    if not zoo_model_ready(preset.model):
        pytest.skip(f"{preset.model} is not converted here (the suite never converts a real model)")
    base, page = browser_page
    panel = next(p for p in PANELS if p.url_path == preset.panel)
    page.set_viewport_size({"width": 1024, "height": 900})
    try:
        open_offline(page, f"{base}/{preset.panel}?{urlencode(preset.query())}")
        assert page.locator("[data-testid='stException']").count() == 0
        assert_nothing_cut(page, preset.panel, panel)
    finally:
        page.set_viewport_size({"width": 1400, "height": 900})

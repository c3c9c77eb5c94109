"""Checks that read a drawn page in Chromium, shared by the browser tests: what a presenter must see whole (titles,
metrics, select boxes, chart texts) and the requests a page makes to other hosts."""
from __future__ import annotations

from analysis.framework import presets


def is_outside(url: str) -> bool:
    """A request to a host other than the app's own (the app runs offline and tells nobody)."""
    from urllib.parse import urlparse

    parsed = urlparse(url)
    return parsed.scheme not in ("data", "blob", "about", "file") and parsed.hostname not in ("127.0.0.1", "localhost")


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

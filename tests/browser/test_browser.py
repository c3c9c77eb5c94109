"""Real browser: Debian's headless Chromium, driven by Playwright, on the process's app server: the share bar and
paired charts. Every page and preset is opened, and checked for what a presenter must see whole, by
tests/browser/test_first_screen.py (one visit each for all its checks)."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

from analysis.framework.paths import ROOT
sys.path.insert(0, str(ROOT / "scripts"))
import screenshot  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

pytestmark = pytest.mark.skipif(not shutil.which(CHROMIUM), reason="Debian chromium is not installed")


@pytest.fixture(scope="module")
def browser_page(chromium, app_server):
    """One page for the module, on the process's app server and Chromium (tests/conftest.py)."""
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    yield app_server.base, page
    context.close()


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
    screenshot.wait_rendered(page, action=page.locator("[data-testid='stButtonGroup'] button").filter(
        has_text="KL and needle survival").first.click)
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

"""Talk mode in Chromium at 1024×768 (#48): every shipped talk's steps open from stored results with no
Run button and no error, the big number is on the first screen and equals the step's reading, the
arrow keys and the buttons walk the talk, and nothing is asked of another host. The process's app server and
Chromium (tests/conftest.py)."""
from __future__ import annotations

import os
import re
import shutil
import sys

import pytest

from analysis import talks
from analysis.framework.paths import ROOT
from analysis.model_access.models import ModelSpec, load_model
from components import talk as T

sys.path.insert(0, str(ROOT / "scripts"))
import screenshot  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts" / "screenshots"
pytestmark = pytest.mark.skipif(not shutil.which(CHROMIUM), reason="Debian chromium is not installed")
OUTSIDE: list[str] = []


def _remember_outside(request) -> None:
    from urllib.parse import urlparse

    url = urlparse(request.url)
    if url.scheme not in ("data", "blob", "about", "file") and url.hostname not in ("127.0.0.1", "localhost"):
        OUTSIDE.append(request.url)


@pytest.fixture(scope="module")
def browser_page(app_server, chromium):
    """One 1024x768 window of the process's Chromium on the process's app server (tests/conftest.py) for the
    file, noting every request to another host."""
    context = chromium.new_context(viewport={"width": 1024, "height": 768})
    page = context.new_page()
    page.on("request", _remember_outside)
    try:
        yield app_server.base, page
    finally:
        context.close()


@pytest.fixture(scope="module")
def expected():
    """Each step's number as its stored result gives it, computed here from analysis/precomputed/."""
    handles: dict = {}

    def number(step) -> str:
        label = step.preset_value().model
        handle = handles.get(label) or handles.setdefault(label, load_model(ModelSpec.parse(label)))
        now = T.show_step(step, handle)
        assert not now.missing, now.missing
        return now.text
    return number


def _screen(page, k: int, n: int, action=None) -> str:
    """Step k of n, drawn (after `action`, the key or button that moves to it, when given): no error, no Run
    button, no sidebar, its number on the first screen; returns that number."""
    screenshot.wait_rendered(page, action=action)
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stAlertContentError']").count() == 0
    assert page.get_by_role("button", name=re.compile(r"^Run")).count() == 0, "a talk step offers a Run button"
    assert page.locator("[data-testid='stSidebar']").count() == 0 or not page.locator(
        "[data-testid='stSidebar']").is_visible()
    assert f"step {k} of {n}" in page.locator("[data-testid='stCaptionContainer']").first.inner_text()
    number = page.locator("[data-testid='talk-number']")
    box = number.bounding_box()
    assert box is not None and box["y"] + box["height"] <= 768, "the highlighted number is below the first screen"
    return number.inner_text().strip()


def _ready(t) -> bool:
    from conftest import zoo_model_ready

    return all(zoo_model_ready(s.preset_value().model) for s in t.steps)


@pytest.mark.parametrize("name", [t.name for t in talks.all_talks()])
def test_every_step_opens_with_its_number_walked_by_keys(browser_page, expected, name):
    base, page = browser_page
    t = talks.load(name)
    if not _ready(t):
        pytest.skip("a real model of this talk is not converted here")
    OUTSIDE.clear()
    page.goto(f"{base}/?talk={name}")
    n = len(t.steps)
    for k, step in enumerate(t.steps, 1):
        move = None if k == 1 else (lambda: page.keyboard.press("ArrowRight"))
        assert _screen(page, k, n, move) == expected(step), f"{name} step {k}"
        if k == 1:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"talk-{name}.png"))
    assert _screen(page, n - 1, n, lambda: page.keyboard.press("ArrowLeft")) == expected(t.steps[n - 2])
    assert OUTSIDE == [], f"the talk asked other hosts: {sorted(set(OUTSIDE))}"


def test_buttons_walk_and_explore_links_to_the_presets_page(browser_page, expected):
    base, page = browser_page
    t = talks.load("kv-cache")
    page.goto(f"{base}/?talk=kv-cache")
    _screen(page, 1, len(t.steps))
    assert _screen(page, 2, len(t.steps), page.get_by_role("button", name="Next").click) == expected(t.steps[1])
    assert _screen(page, 1, len(t.steps), page.get_by_role("button", name="Previous").click) == expected(t.steps[0])
    href = page.get_by_role("link", name="Explore this").get_attribute("href")
    assert href.startswith("/kv-cache?") and "preset=needle-streaming" in href


def test_the_html_export_opens_offline_with_every_step(browser_page, tmp_path):
    """The audience's copy: opened from a file, it draws every step's figure and asks no host at all."""
    _, page = browser_page
    t = talks.load("six-findings")
    if not _ready(t):
        pytest.skip("a real model of this talk is not converted here")
    path = tmp_path / "talk.html"
    path.write_text(T.export_html(t, "http://127.0.0.1/?talk=six-findings"))
    OUTSIDE.clear()
    page.goto(path.as_uri())
    page.wait_for_function(f"() => document.querySelectorAll('.figure .main-svg').length >= {len(t.steps)}",
                           timeout=60_000)
    assert OUTSIDE == [], f"the export asked other hosts: {sorted(set(OUTSIDE))}"
    text = page.locator("body").inner_text()
    for step in t.steps:
        assert step.narration in text
    page.locator("summary").first.click()
    assert t.steps[0].preset_value().finding[:60] in page.locator("details").first.inner_text()

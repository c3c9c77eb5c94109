"""The model picker in a real browser (issue 47): after a preset switches the model, after Load model and after
a back navigation, the sidebar's select box, its "Loaded:" line and the URL name the same model. AppTest
cannot show this: the stale select box lived in the browser (the preset forgot the widget's state on the
server, the browser kept drawing its old value, and Load model sent that value back)."""
from __future__ import annotations

import os
import re
import shutil
import sys
from urllib.parse import parse_qs, urlparse

import pytest

from analysis.framework.paths import ROOT
from analysis.model_access.models import zoo_models

sys.path.insert(0, str(ROOT / "scripts"))
import screenshot  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
pytestmark = [pytest.mark.skipif(not shutil.which(CHROMIUM), reason="Debian chromium is not installed"),
              pytest.mark.skipif(not {"shapes-lm", "shapes-vlm"} <= set(zoo_models()), reason="needs the demo zoo")]


@pytest.fixture
def browser_page(app_server, chromium):
    """A 1280x768 window of the process's Chromium on the process's app server (tests/conftest.py): wide enough for
    the sidebar, where the picker is, to start open (it folds below 1100 px: components/narrow_sidebar.py)."""
    context = chromium.new_context(viewport={"width": 1280, "height": 768})
    try:
        yield app_server.base, context.new_page()
    finally:
        context.close()


def _named(page) -> dict[str, str]:
    picker = page.locator(".st-key-picker_zoo")
    field = picker.locator("input")  # the select box's text: its input's value, or the text drawn in it
    shown = field.first.input_value() if field.count() else ""
    shown = shown or [t.strip() for t in picker.inner_text().splitlines() if t.strip()][-1]
    assert shown != "Zoo model", picker.inner_html()[:3000]
    box = shown.removesuffix(" (real)")
    loaded = re.search(r"Loaded: (\S+)", page.locator("[data-testid='stSidebar']").inner_text())
    url = parse_qs(urlparse(page.url).query).get("model", [""])[0]
    return {"picker": f"zoo:{box}", "loaded": loaded.group(1) if loaded else "", "url": url}


def _agree(page, model: str | None = None) -> None:
    named = _named(page)
    assert len(set(named.values())) == 1 and (model is None or named["picker"] == model), named


def test_picker_loaded_and_url_agree_after_a_preset_load_and_back(browser_page):
    base, page = browser_page
    page.goto(f"{base}/prompt-reconstruction?model=zoo:shapes-vlm")
    screenshot.wait_rendered(page)
    _agree(page, "zoo:shapes-vlm")
    preset = page.locator(".st-key-preset_prompt-reconstruction_noise-defeats button").first
    screenshot.wait_rendered(page, action=preset.click)
    _agree(page, "zoo:shapes-lm")  # before: the box still showed shapes-vlm
    screenshot.wait_rendered(page, action=page.locator(".st-key-picker_load button").first.click)
    _agree(page, "zoo:shapes-lm")  # before: Load model switched back to shapes-vlm
    screenshot.wait_rendered(page, action=page.go_back)
    _agree(page)
    assert page.locator("[data-testid='stException']").count() == 0

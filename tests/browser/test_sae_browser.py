"""Real browser: the SAE-V Data ranking view on the demo VLM shows the committed data-filtering result
(benchmarks/results/sae_v_filtering.json), its chart drawn, with no request to another host."""
from __future__ import annotations

import sys

import pytest

from analysis.framework import paths
from analysis.model_access.models import zoo_models

sys.path.insert(0, str(paths.SCRIPTS))
import screenshot  # noqa: E402

pytestmark = [pytest.mark.skipif("shapes-vlm" not in zoo_models(), reason="the demo VLM is not built")]


def test_the_ranking_view_shows_the_committed_filtering_result(chromium, app_server, tmp_path):
    import json

    results = json.loads(paths.result_file("sae_v_filtering.json").read_text())
    outside = []
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        page.on("request", lambda r: outside.append(r.url) if "127.0.0.1" not in r.url
                and not r.url.startswith(("data:", "blob:", "about:")) else None)
        page.goto(f"{app_server.base}/sae-features?model=zoo:shapes-vlm&view=ranking")
        screenshot.wait_rendered(page, timeout_ms=300_000)
        page.get_by_text("Does filtering by s_i train a better model?").wait_for(timeout=120_000)
        screenshot.wait_rendered(page, timeout_ms=300_000)
        body = page.locator("body").inner_text()
        assert "has not been run yet" not in body
        assert f"Stored results of benchmarks/sae_v_filtering.py (model {results['model']}" in body
        heading = page.get_by_text("Does filtering by s_i train a better model?")
        assert heading.is_visible()
        # the experiment's chart is drawn below its heading
        charts = page.locator("[data-testid='stPlotlyChart']")
        below = [c for c in charts.all() if c.bounding_box() and heading.bounding_box()
                 and c.bounding_box()["y"] > heading.bounding_box()["y"]]
        assert below, "no chart below the filtering heading"
        assert page.locator("[data-testid='stException']").count() == 0
        page.screenshot(path=str(tmp_path / "sae-ranking.png"), full_page=True)
    finally:
        context.close()
    assert outside == []

"""The contribution graph's section on the Residual stream page (under the lens view, on request)."""
from __future__ import annotations

import json

from analysis.model_access.models import ModelSpec
from conftest import app_with_model, table_with

PAGE = "views/residual_stream.py"


def test_the_contribution_graph_opens_under_the_lens_and_names_the_needle():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, query={"pair": "needle-0"})
    assert not at.exception and not at.error
    charts = len(at.get("plotly_chart"))
    at.toggle(key="rs_graph_on").set_value(True).run(timeout=60)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert len(at.get("plotly_chart")) == charts + 1
    rows = table_with(at, "attention hops (largest head)").to_dict("records")
    assert rows[0]["position"] == 15 and rows[0]["token"] == "84"  # the needle's value: the strongest path
    assert any("max(0, ‖y‖₁ − ‖y − part‖₁)" in c.value for c in at.caption)
    at.slider(key="rs_graph_tau").set_value(0.3).run(timeout=60)
    assert not at.exception
    title = json.loads(at.get("plotly_chart")[-1].proto.spec)["layout"]["title"]["text"]
    assert "τ = 0.3" in title and "nodes kept" in title

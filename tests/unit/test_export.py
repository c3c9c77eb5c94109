"""Exports: HTML reports are self-contained and never execute user text; CSV is safe."""
from __future__ import annotations

import csv
import io
import json
import re

import plotly.graph_objects as go

from analysis.hosting.export import ReportSection, html_report, result_json, rows_to_csv, safe_json_for_script

EVIL = "<script>alert('x')</script><img src=x onerror=alert(1)>"


def _report() -> str:
    fig = go.Figure(go.Bar(x=[EVIL, "b"], y=[1, 2]), layout={"title": {"text": EVIL}})
    return html_report(
        f"Prompt {EVIL}", [ReportSection(EVIL, text=EVIL, figure=fig, table=[{"prompt": EVIL, "n": 1}])],
        model=EVIL, note=EVIL, params={"prompt": EVIL}, url="?prompt=" + EVIL,
        headline=[{"metric": EVIL, "value": EVIL, "change": EVIL}], notes=[EVIL],
    )


def test_html_report_opens_on_the_headline_numbers_and_carries_the_notes():
    """Before, a report held the parameters and the figures but not the numbers the page led with (+7.31 /
    -6.02) nor the "What am I looking at?" notes."""
    fig = go.Figure(go.Bar(x=["a"], y=[1]))
    page = html_report("Activation patching on zoo:shapes-lm: your own two prompts",
                       [ReportSection("Residual", figure=fig)], model="zoo:shapes-lm", params={"pair": "own"},
                       headline=[{"metric": "Clean: logit(target) − logit(foil)", "value": "+7.31"},
                                 {"metric": "Corrupted", "value": "-6.02", "change": "vs clean"}],
                       notes=["The corrupted prompt is run with one activation replaced."])
    body = page.split("</head>", 1)[1]
    first = {k: body.index(k) for k in ("+7.31", "-6.02", "id='fig0'", "What am I looking at?",
                                        "The corrupted prompt is run", "Parameters")}
    assert first["+7.31"] < first["-6.02"] < first["id='fig0'"]  # the numbers first
    assert first["id='fig0'"] < first["What am I looking at?"] < first["The corrupted prompt is run"]
    assert first["The corrupted prompt is run"] < first["Parameters"]  # the parameters last
    assert "vs clean" in body


def test_html_report_contains_no_executable_user_script():
    page = _report()
    # exactly our three script elements: plotly.js, the figure JSON and the bootstrap
    assert len(re.findall(r"<script\b", page, flags=re.I)) == 3
    assert "<script>alert" not in page
    assert "<img src=x" not in page
    assert "&lt;script&gt;alert" in page  # escaped, still readable


def test_html_report_embeds_plotly_and_figure_data():
    page = _report()
    assert "Plotly.newPlot" in page and len(page) > 1_000_000  # plotly.js inlined: works offline
    blob = re.search(r"<script type='application/json' id='figures'>(.*?)</script>", page, flags=re.S).group(1)
    figs = json.loads(blob)
    assert figs[0]["data"][0]["x"][0] == EVIL  # the figure keeps the exact text, as data
    assert "http://" not in page.split("<script type='text/javascript'>", 2)[-1]


def test_safe_json_for_script_round_trips():
    data = {"a": "</script><!-- & >", "b": [1.5, None]}
    text = safe_json_for_script(data)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == data


def test_csv_neutralises_formulas_and_keeps_values():
    text = rows_to_csv([{"token": "=1+2", "score": -0.5, "note": "-3"}, {"token": "plain", "extra": [1, 2]}])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows[0]["token"] == "'=1+2" and rows[0]["score"] == "-0.5" and rows[0]["note"] == "-3"
    assert rows[1]["extra"] == "[1, 2]"


def test_result_json_serialises_dataclasses_and_tensors():
    import torch

    from analysis.model_access.models import ModelSpec

    assert json.loads(result_json({"spec": ModelSpec("zoo", "x"), "t": torch.tensor([1.0, 2.0])})) == {
        "spec": {"source": "zoo", "name": "x", "revision": None, "dtype": "float32"}, "t": [1.0, 2.0]}

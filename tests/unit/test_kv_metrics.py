"""The KV panel's metrics are data (analysis/kv/metrics.py): one entry in METRICS appears in the page's table
of policies, the command line's tables, the budget sweep's points and chart, the page's choice of what the
chart plots, and saved results."""
from __future__ import annotations

import dataclasses
import json

import pytest

from analysis import kv
from analysis.kv import metrics as M
from analysis.framework.settings import choices_of
from components.params_form import labeller
from components.figures import kv as F

FIRST_KL = kv.Metric("first_kl", "first-token KL", lambda r: r.kl[0] if r.kl else None,
                     column="first-token KL (nats)", title="KL at the first predicted token", axis="KL (nats)",
                     digits=4)
PARAMS = kv.KvParams(policy="h2o", budget=20, context=48, pairs=2, new_tokens=4, sweep=[0.5])


@pytest.fixture(scope="module")
def result(tiny_llama):
    return kv.analyze(tiny_llama, PARAMS)  # its runs do not depend on the metrics: those read them


@pytest.fixture
def first_kl(monkeypatch):
    monkeypatch.setattr(M, "METRICS", [*M.METRICS, FIRST_KL])
    return FIRST_KL


def test_a_new_metric_is_one_entry_and_appears_everywhere(first_kl, result, tiny_llama, tiny_llama_dir, capsys):
    from analysis.__main__ import main

    # the page's table of policies
    rows = F.summary_rows(result) + F.summary_rows(result, variants=True)
    by_label = {r.label: r for r in result.runs}
    assert [row["first-token KL (nats)"] for row in rows] == [round(by_label[row["policy"]].kl[0], 4) for row in rows]
    # the budget sweep: its points, their saved layout, its chart
    sweep = kv.budget_sweep(tiny_llama, PARAMS, names=["h2o", "tova"])
    assert all(isinstance(p.values["first_kl"], float) for p in sweep.points)
    saved = json.loads(sweep.to_json())
    assert [p["first_kl"] for p in saved["points"]] == [p.values["first_kl"] for p in sweep.points]
    assert kv.SweepResult.from_dict(saved) == sweep
    fig = F.sweep_figure(sweep, "first_kl")
    assert fig.layout.yaxis.title.text == "KL (nats)" and fig.layout.title.text.startswith("KL at the first")
    assert [list(t.y) for t in fig.data] == [[p.values["first_kl"]] for p in sweep.points]
    # the page's choice of what the sweep chart plots
    field = next(f for f in dataclasses.fields(kv.KvState) if f.name == "metric")
    assert "first_kl" in choices_of(field) and labeller(field)("first_kl") == "first-token KL"
    # the command line's two tables
    model = ["--model", f"local:{tiny_llama_dir}", "--budget", "20", "--context", "48", "--new-tokens", "4"]
    assert main(["kv", *model]) == 0
    assert "| first-token KL (nats) |" in capsys.readouterr().out
    assert main(["kv", *model, "--sweep", "0.5"]) == 0
    assert "| first-token KL (nats) |" in capsys.readouterr().out


def test_every_metric_reads_a_run_and_names_are_unique(result):
    assert len({m.name for m in kv.METRICS}) == len(kv.METRICS)
    for m in kv.METRICS:
        for run in result.runs:
            value = m.read(run)
            assert value is None or isinstance(value, float), (m.name, run.policy, value)
    assert [m.name for m in M.sweep_metrics()][:5] == ["accuracy", "mean_kl", "agreement", "recall", "cache"]


def test_a_sweep_point_saved_before_metrics_were_data_reads_the_same():
    old = {"policy": "h2o", "share": 0.5, "budget": 24, "accuracy": 0.5, "mean_kl": 0.1, "agreement": 0.9,
           "recall": 0.8, "cache": 24.0, "claimed": 24.0}
    point = kv.SweepPoint.from_dict(old)
    assert point.values["cache"] == 24.0 and point.to_dict() == old

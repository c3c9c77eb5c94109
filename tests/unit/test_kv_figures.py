"""Figure builders of the KV-cache panel: pure functions of a KvResult."""
from __future__ import annotations

import pytest

from analysis import kv
from components.figures import kv as F


@pytest.fixture(scope="module")
def result(tiny_llama):
    return kv.analyze(tiny_llama, kv.KvParams(policy="h2o", budget=20, context=48, pairs=3, new_tokens=6, policies=kv.policy_settings(snap_window=4, morph_window=4)))


def test_kept_matrix_marks_exactly_the_kept_positions(result):
    for layer_index in range(len(result.layers)):
        for head in range(result.kv_heads):
            z = F.kept_matrix(result, layer_index, head)
            for step, row in enumerate(z):
                newest = result.task.prefill_len + step
                kept = set(result.kept[layer_index][head][step])
                assert {j for j, v in enumerate(row) if v == 1.0} == kept
                assert all(v is None for v in row[newest + 1:])
                assert len(kept) == 20



def test_retained_heatmap_labels_stay_inside_the_plot(result):
    """The prefill and question lines' labels sit inside the plot's top edge: placed above it, "end of prefill"
    ran into the subtitle where the figure has a smaller top margin (the talk's step 1, issue #47)."""
    fig = F.retained_heatmap(result, 0, 0)
    labels = {a.text: a for a in fig.layout.annotations if a.text in ("end of prefill", "questions")}
    assert set(labels) == {"end of prefill", "questions"}
    for a in labels.values():
        assert a.yref == "paper" and a.y <= 1 and a.yanchor == "top", a


def test_retained_heatmap_sends_the_kept_cells_once_and_each_token_once(result):
    """The cells travel as one binary float32 array (NaN = not read yet) and each column's token as its
    x category; with a hover text per cell the default view's figure was 452 KB."""
    import dataclasses
    import html
    import json
    import math

    import numpy as np
    import plotly.io as pio

    for layer_index, head in [(0, 0), (len(result.layers) - 1, result.kv_heads - 1)]:
        fig = F.retained_heatmap(result, layer_index, head)
        cells = fig.data[0]
        assert isinstance(cells.z, np.ndarray) and cells.z.dtype == np.float32 and cells.customdata is None
        for step, row in enumerate(cells.z):
            newest = result.task.prefill_len + step
            kept = set(result.kept[layer_index][head][step])
            for j, v in enumerate(row):
                assert (math.isnan(v) if j > newest else v == (1.0 if j in kept else 0.0)), (step, j)
        assert list(cells.x) == [f"{j} · {html.escape(t, quote=False)}" for j, t in enumerate(result.token_text)]
        spec = json.loads(pio.to_json(fig, validate=False))
        assert "bdata" in spec["data"][0]["z"]  # binary, not a list of numbers
        n_tokens = sum(len(t) for t in result.token_text)
        assert len(pio.to_json(fig, validate=False)) < 20_000 + 8 * cells.z.size + 4 * n_tokens
    # a token is escaped before Plotly's label markup reads it
    odd = dataclasses.replace(result, token_text=["<b>x</b>"] + list(result.token_text[1:]))
    assert F.retained_heatmap(odd, 0, 0).data[0].x[0] == "0 · &lt;b&gt;x&lt;/b&gt;"

def test_figures_have_titles_and_axis_titles(result):
    sweep = kv.SweepResult(model="m", context=48, full_accuracy=0.5, points=[
        kv.SweepPoint(policy="h2o", share=s, budget=int(48 * s),
                      values={"accuracy": s, "mean_kl": 1 - s, "agreement": s, "recall": s})
        for s in (0.25, 0.5, 0.75)])
    figs = [F.retained_heatmap(result, 0, 1), F.step_metric_figure(result, "kl"), F.step_metric_figure(result, "dnll"),
            F.memory_figure(result), F.sweep_figure(sweep, "accuracy"), F.sweep_figure(sweep, "mean_kl"),
            F.survival_figure(result.run("h2o"), result.layers)]
    for fig in figs:
        assert fig.layout.title.text and fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    acc = F.sweep_figure(sweep, "accuracy")
    assert list(acc.data[0].x) == [25.0, 50.0, 75.0] and list(acc.data[0].y) == [0.25, 0.5, 0.75]
    memory = F.memory_figure(result)
    assert len(memory.data) == 2 * len(kv.POLICIES)


def test_tables_have_a_row_per_policy(result):
    rows, variants = F.summary_rows(result), F.summary_rows(result, variants=True)
    assert [r["policy"] for r in rows + variants] == [r.label for r in result.runs]
    assert [r["policy"] for r in variants] == [kv.POLICIES.label(n) for n in kv.POLICIES if F.is_variant(n)]
    assert {r["policy"] for r in rows} == {kv.POLICIES.label(n) for n in kv.main_policies()}
    assert rows[0]["mean KL (nats)"] == 0 and rows[0]["top-1 agreement"] == 1
    assert len(F.text_rows(result)) == len(kv.main_policies())  # variants' texts only when chosen
    answers = F.answer_rows(result)
    assert len(answers) == len(result.task.answer_positions)
    assert all(set(r) >= {"asked key", "true value", "Full cache"} for r in answers)


def test_long_per_step_lines_drop_their_markers_and_the_memory_chart_marks_few_analytic_steps(result):
    """A marker is one SVG element in the browser: the default view drew about 900 on each of these two
    charts. Short lines keep a marker per point; long ones are plain lines; the analytic size is marked
    on about a dozen evenly spaced steps, each at its own step with its own value, the last included."""
    import dataclasses

    short = F.step_metric_figure(result, "kl")
    assert all(t.mode == "lines+markers" for t in short.data)  # 6 steps
    steps = F.MARKERS_UP_TO + 40
    runs = [dataclasses.replace(r, kl=[0.01 * i for i in range(steps)],
                                cache_bytes=[1024 * (i + 1) for i in range(steps)],
                                analytic_bytes=[2048 * (i + 1) for i in range(steps)],
                                evicted_bytes=[], evicted_analytic=[]) for r in result.runs]  # every layer evicted
    long = dataclasses.replace(result, runs=runs)
    assert all(t.mode == "lines" and len(t.y) == steps for t in F.step_metric_figure(long, "kl").data)
    memory = F.memory_figure(long)
    for measured, analytic in zip(memory.data[::2], memory.data[1::2]):
        assert measured.mode == "lines" and len(measured.y) == steps
        assert analytic.mode == "markers" and len(analytic.x) <= min(F.ANALYTIC_MARKS + 1, 20)
        assert analytic.x[0] == 0 and analytic.x[-1] == steps - 1 and list(analytic.x) == sorted(set(analytic.x))
        assert list(analytic.y) == [2.0 * (i + 1) for i in analytic.x]


@pytest.fixture(scope="module")
def sliding_result(model_root):
    """Gemma 3 text: layer 0 sliding-window (a window of 128, wider than the 48-token context, so that layer's
    cache grows every step whatever the policy), layer 1 global."""
    from analysis.model_access import tiny_models
    from analysis.model_access.models import ModelSpec, load_model

    model, tok, _ = tiny_models._causal("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=8, sliding_window=128,
                                        layer_types=["sliding_attention", "full_attention"])(0)
    folder = model_root / "gemma3-sliding-128"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    handle = load_model(ModelSpec("local", str(folder)))
    return handle, kv.analyze(handle, kv.KvParams(policy="h2o", budget=20, context=48, pairs=3, new_tokens=6,
                                                  policies=kv.policy_settings(snap_window=4, morph_window=4)))


def test_memory_chart_counts_only_the_layers_a_policy_evicts(sliding_result):
    """Before: the chart summed the sliding-window layer too, so every policy's line grew while its note said
    "flat at the budget". Each main policy's line is now flat at 2 (K and V) · KV heads · head dim · budget ·
    4 bytes of its one evicted layer, and the title names the layer left out."""
    handle, result = sliding_result
    assert result.layers == [1] and result.kept_layers == [0]
    at_budget = 2 * handle.info.kv_heads * 8 * result.params.budget * 4 / 1024
    fig = F.memory_figure(result)
    lines = {trace.name.removesuffix(" (measured)"): trace for trace in fig.data if trace.name.endswith("(measured)")}
    main = [r for r in result.runs if r.policy in kv.main_policies() and r.policy != "full"]
    assert main
    for run in main:
        assert list(lines[run.label].y) == [at_budget] * len(run.cache_bytes), run.label
    full = lines[result.run("full").label].y
    assert full[-1] > full[0]  # the full cache grows
    assert "sliding-window layer 0 not counted" in fig.layout.title.text
    assert "Layer 0 of 2 is sliding-window" in F.not_evicted_note(result)

"""Figure builders of the sharpness panel: titled axes, one colour per n, points on the β(H) curve."""
from __future__ import annotations

import pytest

from analysis import sharpness as S
from components.figures import sharpness as F


@pytest.fixture(scope="module")
def sweep(tiny_llama):
    return S.size_sweep(tiny_llama, S.SweepParams(ns=[4, 8, 16], thetas=[0.5, 2.0], samples=2))


def _axis_titles(fig) -> list[str]:
    layout = fig.to_dict()["layout"]
    return [v["title"]["text"] for k, v in layout.items() if k.startswith(("xaxis", "yaxis")) and "title" in v]


def test_every_figure_has_a_title_and_titled_axes(sweep, tiny_llama):
    prompt = S.analyse_prompt(tiny_llama, S.PromptParams("w1 w9 w4 w7", "w9"))
    figs = [F.lemma_figure(S.lemma_demo()), F.size_figure(sweep, 1, 2), F.theta_sweep_figure(sweep, 0, 1, sink=False),
            F.beta_figure(sweep, 8), F.heatmap_figure(sweep, 16), F.accuracy_figure(sweep),
            F.prompt_weights_figure(prompt, 1, 3)]
    for fig in figs:
        assert fig.layout.title.text
        titles = _axis_titles(fig)
        assert titles and all(titles), fig.layout.title.text


def test_theta_sweep_uses_one_colour_per_n_across_panels(sweep):
    fig = F.theta_sweep_figure(sweep, 0, 0)
    colours: dict[str, set] = {}
    for tr in fig.data:
        colours.setdefault(tr.legendgroup, set()).add(tr.line.color)
    assert len(colours) == 3 and all(len(c) == 1 for c in colours.values())
    assert len({next(iter(c)) for c in colours.values()}) == 3
    assert list(fig.data[0].x)[-1] == "adaptive"


def test_beta_figure_places_heads_on_the_rule_curve(sweep):
    fig = F.beta_figure(sweep, 16)
    points = [tr for tr in fig.data if tr.mode == "markers" and tr.name.startswith("layer ")]
    assert len(points) == sweep.layers and all(len(tr.x) == sweep.heads for tr in points)
    for tr in points:
        import torch
        assert list(tr.y) == pytest.approx(S.adaptive_beta(torch.tensor(tr.x, dtype=torch.float64)).tolist())


def test_heatmap_shows_softmax_and_adaptive_on_one_scale(sweep):
    fig = F.heatmap_figure(sweep, 8, sink=False)
    heat = [tr for tr in fig.data if tr.type == "heatmap"]
    assert len(heat) == 2 and all((tr.zmin, tr.zmax) == (0, 1) for tr in heat)
    assert [list(r) for r in heat[0].z] == sweep.points[1].run("softmax").without_sink.entropy_norm


def test_lemma_figure_gives_each_curve_one_colour_on_both_panels():
    """Each temperature's p_max (left) and entropy (right) share the colour its legend entry shows, and
    no two curves share one (left to Plotly's colour cycle, the right panel took the next trace's)."""
    fig = F.lemma_figure(S.lemma_demo())
    colours: dict[str, set] = {}
    for tr in fig.data:
        if tr.legendgroup:
            colours.setdefault(tr.legendgroup, set()).add(tr.line.color)
    assert len(colours) >= 3 and all(len(c) == 1 and None not in c for c in colours.values())
    assert len({next(iter(c)) for c in colours.values()}) == len(colours)

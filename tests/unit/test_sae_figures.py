"""SAE-V figure builders, tables, HTML escaping and upload checks (pure functions)."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from analysis.framework import images
from analysis import sae_v
from components.figures import sae as figs


def _card(index, label, omega, density, both=None):
    return sae_v.FeatureCard(
        index=index, label=label, omega=omega, density=density, density_text=density, density_image=density,
        max_act=1.0, mean_act=0.5, n_text_top=0, n_image_top=0, top_text=[], top_images=[], quantiles=[],
        hist_edges=[0.0, 0.5, 1.0], hist_counts=[3, 1], neighbours=[], coactive=[], logit_tokens=[],
        concept_both=both)


def _ranking(scores_and_flags):
    rows = [sae_v.PairScore(pair=i, text=f"<b>{i}</b>", corrupted=c, kind="swapped" if c else "clean", score=s,
                            weighted=s / 10, shared=1, rank=i + 1) for i, (s, c) in enumerate(scores_and_flags)]
    clean = [r.score for r in rows if not r.corrupted]
    bad = [r.score for r in rows if r.corrupted]
    return sae_v.Ranking(model="m", layer=0, by="sum", threshold=0.0, rows=rows, roc_auc=sae_v.roc_auc(clean, bad),
                         roc_auc_weighted=None, precision=None, recall=None)


def test_sort_rows_orders_by_omega_and_filters_modality():
    cards = [_card(0, "text-only", 0.2, 0.1), _card(1, "cross-modal", 0.9, 0.01),
             _card(2, "cross-modal", 0.5, 0.3, sae_v.Concept("colour:red", 0.95, 20)), _card(3, "dead", 0.0, 0.0)]
    store = sae_v.FeatureStore(meta=None, params=sae_v.StoreParams(), pairs=None, tokens=[], grid=0, features=cards)
    rows = figs.feature_rows(store)
    assert [r["feature"] for r in figs.sort_rows(rows, "omega")] == [1, 2, 0, 3]
    assert [r["feature"] for r in figs.sort_rows(rows, "density", ["cross-modal"])] == [2, 1]
    by_precision = figs.sort_rows(rows, "concept precision")
    assert by_precision[0]["feature"] == 2 and by_precision[0]["concept (both)"] == "colour = red"
    fig = figs.feature_scatter(store)
    assert fig.layout.xaxis.type == "log" and fig.layout.title.text
    assert sum(len(t.x) for t in fig.data) == 3  # the dead feature has no density to plot


def test_highlighted_tokens_escape_model_text():
    out = figs.highlighted_tokens_html(["<script>", "ok"], [1.0, 0.0], focus=0)
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert out.count("outline") == 1


def test_roc_figure_runs_from_origin_to_one_and_matches_auc():
    ranking = _ranking([(3.0, False), (2.0, True), (1.0, False), (0.5, True)])
    fig = figs.roc_figure(ranking)
    xs, ys = list(fig.data[0].x), list(fig.data[0].y)
    assert (xs[0], ys[0]) == (0.0, 0.0) and (xs[-1], ys[-1]) == (1.0, 1.0)
    area = sum((xs[i + 1] - xs[i]) * (ys[i + 1] + ys[i]) / 2 for i in range(len(xs) - 1))
    assert area == pytest.approx(ranking.roc_auc)
    assert "0.750" in figs.score_distribution_figure(ranking).layout.title.text


def test_image_heatmap_marks_selected_patch_and_hides_inactive_patches():
    image = np.zeros((64, 64, 3), dtype=np.uint8)
    heat = [0.0] * 64
    heat[9] = 2.0
    fig = figs.image_heatmap_figure(image, heat, 8, "t", selected=9)
    z = np.asarray(fig.data[1].z, dtype=float)
    assert z[1, 1] == 2.0 and np.isnan(z[0, 0])
    shape = fig.layout.shapes[0]
    assert (shape.x0, shape.y0) == (8.0, 8.0)


def _png(size) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


def test_upload_check_accepts_images_and_refuses_others(monkeypatch):
    image, error = figs.read_image_upload(_png((40, 30)), "a.png")
    assert error is None and image.size == (40, 30)
    image, error = figs.read_image_upload(b"hello, not an image", "notes.txt")
    assert image is None and "not an image" in error
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 100)
    image, error = figs.read_image_upload(_png((40, 30)), "big.png")
    assert image is None and "40 x 30 pixels" in error
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 10)
    assert "MB" in figs.read_image_upload(_png((4, 4)), "x.png")[1]


def test_kind_summary_averages_per_kind():
    summary = figs.kind_summary(_ranking([(3.0, False), (1.0, False), (2.0, True)]))
    assert summary[0]["kind"] == "clean" and summary[0]["mean s_i"] == pytest.approx(2.0)
    assert summary[1] == {"kind": "swapped", "pairs": 1, "mean s_i": 2.0, "mean weighted ω": 0.2,
                          "mean shared features": 1.0, "mean rank": 3.0, "ROC AUC vs clean": 0.5}  # 3 > 2 > 1
    assert summary[0]["ROC AUC vs clean"] is None


def test_ranking_rows_keep_caption_text_and_order():
    rows = figs.ranking_rows(_ranking([(3.0, False), (2.0, True)]))
    assert [r["rank"] for r in rows] == [1, 2] and rows[1]["corrupted"] is True
    assert rows[0]["caption"] == "<b>0</b>"  # raw text: tables are not HTML


# ---------------------------------------------------------------------------------------------
# Keep fraction and the data-filtering experiment


def test_keep_curve_matches_a_direct_count_at_every_share():
    ranking = _ranking([(5.0, False), (4.0, True), (3.0, False), (2.0, True), (1.0, True), (0.5, False)])
    fig = figs.keep_curve_figure(ranking, keep=0.5, steps=6)
    precision, recall = fig.data[0], fig.data[1]
    flags = [r.corrupted for r in ranking.rows]
    for keep, p, r in zip(precision.x, precision.y, recall.y):
        n_keep = round(keep * len(flags))
        removed = flags[n_keep:]
        assert p == (pytest.approx(sum(removed) / len(removed)) if removed else None)
        assert r == pytest.approx(sum(removed) / sum(flags))
    assert fig.data[2].y[0] == pytest.approx(0.5)  # random removal: the corrupted base rate
    summary = figs.keep_summary(ranking, 0.5)
    assert (summary["precision"], summary["recall"]) == (pytest.approx(2 / 3), pytest.approx(2 / 3))


FILTERING = {
    "model": "shapes-vlm", "scale": "demo",
    "conditions": {
        "whole_pool": {"yes_no": [0.9, 0.92], "factuality": [0.8, 0.82], "coverage": [0.7, 0.7], "kept": 200,
                       "kept_corrupted": [80, 80], "steps": 50,
                       "summary": {"yes_no": {"mean": 0.91, "std": 0.0141}, "factuality": {"mean": 0.81, "std": 0.0141},
                                   "coverage": {"mean": 0.7, "std": 0.0}}},
        "top_half_by_s_i": {"yes_no": [0.95, 0.93], "factuality": [0.9, 0.9], "coverage": [0.75, 0.77], "kept": 100,
                            "kept_corrupted": [10, 10], "steps": 25},
    },
    "starting_checkpoint": {"yes_no": 0.95, "factuality": 1.0, "coverage": 1.0},
    "training": {"seeds": 2},
    "pool": {"pairs": 200, "corrupted": 80, "s_i_roc_auc_clean_vs_corrupted": 0.8},
    "verdict": {"top_half_beats_random_half_yes_no": True, "top_half_at_least_whole_pool_yes_no": True},
}


def test_filtering_table_and_figure_show_mean_and_spread_per_condition(tmp_path):
    import json

    path = tmp_path / "sae_v_filtering.json"
    path.write_text(json.dumps(FILTERING))
    results, why = figs.filtering_results(path)
    assert why is None
    rows = {r["condition"]: r for r in figs.filtering_rows(results)}
    assert rows["whole pool"]["yes/no accuracy"] == "0.910 ± 0.014"
    # no stored summary: mean and sample std computed from the per-seed values
    assert rows["top share by s_i (SAE-V)"]["yes/no accuracy"] == "0.940 ± 0.014"
    assert rows["top share by s_i (SAE-V)"]["corrupted kept"] == 10
    assert rows["starting checkpoint (no fine-tune)"]["caption factuality"] == "1.000"
    fig = figs.filtering_figure(results)
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert list(bars["top share by s_i (SAE-V)"].y) == pytest.approx([0.94, 0.9, 0.76])
    assert "2 seeds" in fig.layout.title.text


def test_filtering_results_absent_or_broken_say_why(tmp_path):
    assert figs.filtering_results(tmp_path / "missing.json") == (None, "absent")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert figs.filtering_results(bad)[0] is None and "unreadable" in figs.filtering_results(bad)[1]
    empty = tmp_path / "empty.json"
    empty.write_text('{"conditions": {}}')
    assert figs.filtering_results(empty) == (None, "it holds no conditions")


def test_shared_features_count_only_those_with_omega_above_the_threshold():
    cards = [_card(0, "cross-modal", 0.4, 0.1), _card(1, "text-only", 0.0, 0.1), _card(2, "cross-modal", 0.3, 0.1)]
    for c, has in zip(cards, (True, False, True)):
        c.has_omega = has
    store = sae_v.FeatureStore(meta=None, params=sae_v.StoreParams(), pairs=None, tokens=[], grid=0, features=cards)
    result = sae_v.InputExplanation(model="m", layer=0, tokens=[], grid=0, positions=[], totals=[],
                                    text_max={0: 2.0, 1: 3.0, 2: 0.5}, image_max={0: 1.5, 1: 3.0, 2: 4.0})
    shared, counted = figs.shared_features(result, store, active_above=1.0)
    assert shared == [0, 2, 1] and counted == [0]


def test_score_axis_says_which_s_i_the_rule_computes():
    def axis(rule):
        ranking = _ranking([(0.9, False), (0.2, True)])
        ranking.rule = rule
        return figs.score_distribution_figure(ranking).layout.xaxis.title.text

    assert axis("official") == "s_i = Σ ω over shared features"
    assert "÷" in axis("normalised")
    assert axis("a-rule-since-unregistered") == axis("official")

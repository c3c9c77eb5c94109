"""AppTest: the SAE-V page on the demo model (when present) and on a tiny LLaVA with a pre-built SAE."""
from __future__ import annotations

import pytest

from analysis import sae_v
from analysis.model_access.models import ModelSpec, zoo_models
from conftest import app_with_model, as_the_app_names, table_with

PAGE = "views/sae_features.py"
HAS_DEMO = "shapes-vlm" in zoo_models() and bool(list((sae_v.SAE_ROOT / "shapes-vlm").glob("layer*/" + sae_v.STORE_FILE)))


@pytest.fixture(scope="module")
def tiny_sae(tiny_llava, tmp_path_factory):
    """An SAE + store for the tiny LLaVA, in a private cache folder the page finds (under the model's name on
    the page, local:tiny-llava: the cache is keyed by it)."""
    old = sae_v.types.CACHE_ROOT
    sae_v.types.CACHE_ROOT = tmp_path_factory.mktemp("sae-cache")
    params = sae_v.BuildParams(layer=1, dataset="noise", train_pairs=16, eval_pairs=8,
                               train=sae_v.TrainParams(d_sae=16, k=3, steps=30, batch_size=64),
                               store=sae_v.StoreParams(top_n=4, top_images=3))
    folder = sae_v.build(as_the_app_names(tiny_llava), params)
    yield folder
    sae_v.types.CACHE_ROOT = old


def _errors(at) -> list[str]:
    """The error lines as a visitor reads them (messages are Markdown-escaped where they are shown)."""
    return [e.value.replace("\\", "") for e in at.error]


def test_feature_list_renders_with_all_features(tiny_llava_dir, tiny_sae):
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE)
    assert not at.exception, at.exception
    assert not _errors(at)
    table = table_with(at, "omega")
    assert set(table["feature"]) <= set(range(16)) and len(table) >= 1
    assert any("What am I looking at?" in c.value for c in at.caption)
    assert at.query_params["view"] == ["list"] or at.query_params["view"] == "list"


def _url(at, name: str) -> str:
    value = at.query_params[name]
    return value[0] if isinstance(value, list) else str(value)


def test_modality_filter_is_one_click_and_travels_in_the_url(tiny_llava_dir, tiny_sae):
    store = sae_v.load_store(tiny_sae)
    modality = {f.index: f.label for f in store.features}
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE)
    pills = at.button_group(key="sae_labels")
    assert list(pills.value) == ["cross-modal", "text-only", "image-only"] and _url(at, "labels") == \
        "cross-modal,text-only,image-only"
    assert {modality[f] for f in table_with(at, "omega")["feature"]} <= {"cross-modal", "text-only", "image-only"}
    at = pills.set_value(["dead", "text-only"]).run()
    assert _url(at, "labels") == "text-only,dead"  # in the labels' own order
    expected = sorted(i for i, m in modality.items() if m in ("text-only", "dead"))
    assert sorted(table_with(at, "omega")["feature"]) == expected
    # a shared link opens with its filter; every label off says so and lists nothing
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"labels": "text-only"})
    assert list(at.button_group(key="sae_labels").value) == ["text-only"]
    assert sorted(table_with(at, "omega")["feature"]) == sorted(i for i, m in modality.items() if m == "text-only")
    at = at.button_group(key="sae_labels").set_value([]).run()
    assert not at.exception and _url(at, "labels") == "none"
    assert [i.value for i in at.info] == ["Choose at least one modality label to list its features."]
    assert not any("omega" in df.value.columns for df in at.dataframe)
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"labels": "none"})
    assert list(at.button_group(key="sae_labels").value) == []  # the emptied filter travels in a link
    assert [i.value for i in at.info] == ["Choose at least one modality label to list its features."]


def test_feature_permalink_opens_that_feature(tiny_llava_dir, tiny_sae):
    store = sae_v.load_store(tiny_sae)
    live = next(f.index for f in store.features if f.top_text and f.index > 0)
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"feature": str(live)})
    assert not at.exception, at.exception
    assert at.number_input(key="sae_feature").value == live
    assert at.subheader[0].value.startswith(f"Feature {live} ·")
    # the page keeps the permalink in the URL
    assert str(at.query_params["feature"]).strip("[]'") == str(live)


def test_out_of_range_feature_in_url_is_a_clear_error(tiny_llava_dir, tiny_sae):
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"feature": "999"})
    assert not at.exception
    assert any("does not exist" in e for e in _errors(at))


def test_non_image_upload_gives_a_clear_message(tiny_llava_dir, tiny_sae):
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"view": "explain"})
    assert not at.exception, at.exception
    at.radio(key="sae_img_source").set_value("Upload").run()
    at.file_uploader(key="sae_upload").set_value(("notes.txt", b"definitely not a picture", "text/plain")).run()
    assert not at.exception
    assert any("not an image" in e for e in _errors(at))


def test_explain_view_lists_features_of_a_dataset_scene(tiny_llava_dir, tiny_sae):
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"view": "explain"})
    assert not at.exception, at.exception
    assert not _errors(at)
    assert len(table_with(at, "token")) >= 1


def test_ranking_of_unlabelled_pairs_shows_no_roc_and_exports_csv(tiny_llava_dir, tiny_sae):
    """The noise pairs carry no corruption labels: no ROC AUC, precision or recall (issue 31)."""
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"view": "ranking"})
    assert not at.exception, at.exception
    assert len(table_with(at, "score s_i")) == 8
    assert "corrupted" not in table_with(at, "score s_i").columns
    labels = {m.label for m in at.metric}
    assert not {"ROC AUC (s_i)", "Precision: corrupted among removed", "Recall: corrupted pairs removed"} & labels
    assert any("no corruption labels" in c.value for c in at.caption)
    assert {b.label for b in at.get("download_button")} >= {"Ranked list (CSV)", "Ranked list (JSONL)"}


def test_ranking_view_keep_fraction_counts_kept_and_removed_pairs(tiny_llava_dir, tiny_sae):
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"view": "ranking", "keep": "0.25"})
    assert not at.exception, at.exception
    assert at.slider(key="sae_rank_keep").value == pytest.approx(0.25)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Pairs kept / removed"] == "2 / 6"  # 8 held-out pairs
    at.slider(key="sae_rank_keep").set_value(1.0).run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["Pairs kept / removed"] == "8 / 0"
    # the variant rule is offered, labelled, and never the default
    assert at.selectbox(key="sae_rank_rule").value == "official"
    at.selectbox(key="sae_rank_rule").set_value("all-shared").run()
    assert not at.exception, at.exception
    assert str(at.query_params["rule"]).strip("[]'") == "all-shared"


def test_a_new_score_rule_is_one_class_and_appears_in_the_ranking_view(tiny_llava_dir, tiny_sae):
    from dataclasses import dataclass
    from typing import ClassVar

    @sae_v.SCORE_RULES.register
    @dataclass
    class EveryFeatureHalf(sae_v.ScoreRule):
        name: ClassVar[str] = "toy-half"
        label: ClassVar[str] = "Toy: ω = 0.5 for every feature"

        def weights(self, acts, codes, modality, omega_top=None, threshold=0.0):
            import torch

            return torch.full((codes.shape[1],), 0.5), torch.ones(codes.shape[1], dtype=torch.bool)

    try:
        at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE,
                            query={"view": "ranking", "rule": "toy-half", "thr": "0"})
        assert not at.exception, at.exception
        box = at.selectbox(key="sae_rank_rule")
        assert "toy-half" in box.options or "Toy: ω = 0.5 for every feature" in box.options
        assert box.value == "toy-half"
        scores = table_with(at, "score s_i")["score s_i"]
        assert all(float(s) * 2 == int(float(s) * 2) for s in scores)  # 0.5 per shared feature
    finally:
        sae_v.SCORE_RULES.unregister("toy-half")


def test_ranking_view_shows_the_committed_filtering_experiment(tiny_llava_dir, tiny_sae):
    """The committed benchmarks/results/sae_v_filtering.json is shown (its table, and the variant's AUC when it
    has one); a missing or broken file fails here instead of the page quietly saying it has not been run."""
    from analysis.framework import paths
    from components.figures import sae as figs

    assert figs.FILTERING_RESULTS == paths.result_file("sae_v_filtering.json")
    results, why = figs.filtering_results(figs.FILTERING_RESULTS)
    assert results is not None, f"the committed filtering result {paths.relative(figs.FILTERING_RESULTS)} is {why}"
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"view": "ranking"})
    assert not at.exception, at.exception
    assert not any("has not been run" in i.value for i in at.info)
    table = table_with(at, "condition")
    assert "top share by s_i (SAE-V)" in set(table["condition"])
    if "top_half_by_normalised_s_i" in results["conditions"]:  # the labelled variant's row and AUC
        assert "top share by normalised s_i (variant)" in set(table["condition"])
        auc = results["pool"]["normalised_s_i"]["roc_auc_clean_vs_corrupted"]
        assert any(f"normalised variant with {auc:.3f}" in c.value for c in at.caption)


def test_ranking_view_says_when_the_filtering_experiment_is_absent(tiny_llava_dir, tiny_sae, tmp_path, monkeypatch):
    from components.figures import sae as figs

    monkeypatch.setattr(figs, "FILTERING_RESULTS", tmp_path / "sae_v_filtering.json")
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"view": "ranking"})
    assert not at.exception, at.exception
    assert any("has not been run" in i.value for i in at.info)


def test_text_only_model_on_image_view_gives_a_clear_message(tiny_llama_dir):
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, query={"view": "ranking"})
    assert not at.exception, at.exception
    # no SAE yet for this model: the page offers training instead of failing
    assert any("no SAE" in i.value for i in at.info)


def test_text_only_model_with_sae_explains_text_and_refuses_the_ranking(tiny_llama, tiny_llama_dir, tmp_path):
    old = sae_v.types.CACHE_ROOT
    sae_v.types.CACHE_ROOT = tmp_path
    try:
        sae_v.build(as_the_app_names(tiny_llama), sae_v.BuildParams(layer=0, dataset="noise", train_pairs=8, eval_pairs=4,
                                                                    train=sae_v.TrainParams(d_sae=8, k=2, steps=10,
                                                                                            batch_size=32)))
        at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, query={"view": "ranking"})
        assert not at.exception, at.exception
        assert any("needs a vision-language model" in e for e in _errors(at)), _errors(at)
        at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, query={"view": "explain"})
        assert not at.exception, at.exception
        assert not _errors(at) and len(table_with(at, "token")) >= 1  # a text input's features, per token
        assert not [r for r in at.radio if r.key == "sae_img_source"]  # no image source on a language model
        at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, query={"view": "feature"})
        assert not at.exception and not _errors(at), _errors(at)
        assert at.text_input(key="sae_steer_feature_prompt").value  # steering continues a text's start
        at = [b for b in at.button if b.label.startswith("Run: Generating")][0].click().run()
        assert not at.exception and not _errors(at), _errors(at)
        assert any(m.value == "**Unsteered**" for m in at.markdown)
        at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE)
        assert "modality" not in table_with(at, "omega").columns  # one modality: no modality columns
        assert not [b for b in at.button_group if b.key == "sae_labels"]  # and no modality filter
    finally:
        sae_v.types.CACHE_ROOT = old


@pytest.mark.skipif(not HAS_DEMO, reason="demo model shapes-vlm and its SAE are not built")
def test_demo_feature_list_and_feature_page_render():
    at = app_with_model(ModelSpec("zoo", "shapes-vlm"), PAGE)
    assert not at.exception, at.exception
    assert len(table_with(at, "omega")) > 10
    at = app_with_model(ModelSpec("zoo", "shapes-vlm"), PAGE, query={"feature": "3"})
    assert not at.exception, at.exception
    assert at.subheader[0].value.startswith("Feature 3 ·")
    # the heatmap note names the model's own patch grid (63 px, 3x3 patches of 21 px)
    assert any("21×21-pixel patch (the vision tower's 3×3 grid)" in c.value for c in at.caption)


@pytest.mark.skipif(not HAS_DEMO, reason="demo model shapes-vlm and its SAE are not built")
def test_text_only_model_without_an_sae_opens_on_the_demo_vlm(tiny_llama_dir):
    """Its own model has no SAE: the page opens on the demo VLM's (a training form alone was an empty state)."""
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE)
    assert not at.exception, at.exception
    assert at.session_state["model_spec"] == ModelSpec("zoo", "shapes-vlm")
    assert len(table_with(at, "omega")) > 10

"""AppTest of the attention sharpness page: renders, reacts to θ/layer/head, explains bad input."""
from __future__ import annotations

import pytest

from analysis.model_access.models import ZOO_DIR, ModelSpec
from conftest import app_with_model

PAGE = "views/attention_sharpness.py"
QUERY = {"ns": "4,8,16", "samples": "2"}


CHAPTERS = ["The lemma, without a model", "Temperature sweep", "The adaptive rule β(H)", "Which heads are sharp",
            "Accuracy vs n", "Your own prompt"]


def metrics(at) -> list[str]:
    return [m.value for m in at.metric]


def chapter(at, name: str):
    """Show one of the page's later sections (one at a time: the rest is not drawn)."""
    at.segmented_control(key="sh_chapter").set_value(name).run()
    assert not at.exception, at.exception
    return at


def test_page_renders_all_views_on_demo_model(tiny_llama_dir):
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, QUERY)
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    # the finding first: two headline cards and the head's curves, alone (drawn in <= 3 s, #47); then one section
    # at a time, on demand
    assert len(metrics(at)) == 2 and len(at.get("plotly_chart")) == 1  # the headline's
    assert at.segmented_control(key="sh_chapter").options == CHAPTERS
    assert at.segmented_control(key="sh_chapter").value is None
    charts = 1
    for name in CHAPTERS:
        chapter(at, name)
        assert not at.error, [e.value for e in at.error]
        charts += len(at.get("plotly_chart")) - 1
        assert any("What am I looking at" in c.value for c in at.caption)
    assert charts >= 7
    chapter(at, "Accuracy vs n")
    table = at.dataframe[0].value
    assert list(table["n"]) == [4, 8, 16]
    assert table["softmax accuracy"].between(0, 1).all()
    assert len(metrics(chapter(at, "Your own prompt"))) == 2 + 5
    assert at.query_params["theta"] == ["adaptive"] or at.query_params["theta"] == "adaptive"


def test_page_runs_on_a_vlm_language_model(tiny_llava_dir):
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, {"ns": "4,8", "samples": "2"})
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert len(metrics(chapter(at, "Your own prompt"))) == 2 + 5


def test_changing_theta_layer_and_head_updates_the_values(tiny_llama_dir):
    at = chapter(app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, QUERY), "Your own prompt")
    first = metrics(at)
    at.select_slider(key="sh_theta").set_value("0.125").run()
    cold = metrics(at)
    assert cold != first
    # the page opens at the retrieval head it found; move to another head, then to the other layer
    at.selectbox(key="sh_head").set_value(3 - at.selectbox(key="sh_head").value).run()
    other_head = metrics(at)
    assert other_head != cold
    shown = 1 - at.selectbox(key="sh_layer").value
    at.selectbox(key="sh_layer").set_value(shown).run()
    other_layer = metrics(at)
    assert other_layer != other_head
    at.button_group(key="sh_tlayers").set_value([1 - shown]).run()  # temperature only in the layer not shown
    assert metrics(at) != other_layer
    assert not at.exception
    assert str(at.query_params["head"]).strip("[]'") == str(at.selectbox(key="sh_head").value)
    assert str(at.query_params["layer"]).strip("[]'") == str(shown)
    assert str(at.query_params["tlayers"]).strip("[]'") == str(1 - shown)


def test_item_counts_are_toggles_kept_sorted_in_the_url(tiny_llama_dir):
    """Pills: every n is a one-click toggle; the page and its link list the chosen ones in order."""
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, QUERY)
    pills = at.button_group(key="sh_ns")
    assert pills.options == ["2", "4", "8", "16", "32", "64", "128", "256", "512"]
    assert pills.value == [4, 8, 16]
    pills.unselect(8).select(2).run()
    assert not at.exception and not at.error
    assert str(at.query_params["ns"]).strip("[]'") == "2,4,16"
    assert list(chapter(at, "Accuracy vs n").dataframe[0].value["n"]) == [2, 4, 16]
    at.button_group(key="sh_tlayers").set_value([]).run()  # no layer: plain softmax everywhere
    assert not at.exception and not at.error
    assert str(at.query_params["tlayers"]).strip("[]'") == "none"
    assert at.button_group(key="sh_tlayers").value == []


def test_no_item_count_gives_a_clear_message(tiny_llama_dir):
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, QUERY)
    at.button_group(key="sh_ns").set_value([]).run()
    assert not at.exception
    assert [e.value for e in at.error] == ["Choose at least one item count n to run the model views."]
    assert "The lemma, without a model" in [h.value for h in at.subheader]  # the lemma needs no n
    assert len(at.get("plotly_chart")) == 1


def test_empty_prompt_gives_a_clear_message(tiny_llama_dir):
    at = chapter(app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, QUERY), "Your own prompt")
    at.text_area(key="sh_text").input("").run()
    assert not at.exception
    assert any("prompt is empty" in e.value for e in at.error)
    assert len(metrics(at)) == 2  # the headline still renders


def test_model_without_attention_interface_gives_a_clear_message(tiny_llama_dir, monkeypatch):
    """Llama attention that computes attention itself, bypassing transformers' attention interface."""
    from transformers.models.llama import modeling_llama

    from tests.model.test_sharpness import self_computed_attention

    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", self_computed_attention)
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, {"ns": "4,8", "samples": "3"})
    assert not at.exception
    assert any("attention interface" in e.value for e in at.error)


zoo_lm = pytest.mark.skipif(not (ZOO_DIR / "shapes-lm" / "config.json").is_file(), reason="shapes-lm not built")


@zoo_lm
def test_page_renders_on_shapes_lm_with_training_format():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, {"ns": "8,64", "samples": "16"})
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert any("shapes-world" in c.value for c in at.caption)
    table = chapter(at, "Accuracy vs n").dataframe[0].value
    assert table["softmax accuracy"].iloc[0] >= 0.7  # n = 8 is inside the trained range (n <= 16)


@zoo_lm
def test_a_preset_resets_the_item_count_and_layer_toggles():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, {"ns": "4,8", "samples": "2", "tlayers": "none"})
    assert at.button_group(key="sh_tlayers").value == []  # a link with every layer off opens that way
    at.button_group(key="sh_ns").set_value([2]).run()
    at.button(key="preset_attention-sharpness_dispersion").click().run()
    assert not at.exception, at.exception
    assert at.button_group(key="sh_ns").value == [4, 8, 16, 32, 64, 128]
    assert at.button_group(key="sh_tlayers").value == [0, 1, 2, 3]
    assert str(at.query_params["ns"]).strip("[]'") == "4,8,16,32,64,128"

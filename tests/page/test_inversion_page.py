"""AppTests of the prompt-reconstruction page."""
from __future__ import annotations

import pytest
from conftest import app_with_model

from analysis.model_access.models import ModelSpec, zoo_models

PAGE = "views/prompt_reconstruction.py"
PROMPT = "w3 w17 w42 w8 w99 w5"


def errors(at) -> str:
    return " ".join(e.value for e in at.error)


def metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


@pytest.fixture
def app(tiny_llama_dir):
    def make(**query):
        return app_with_model(ModelSpec("local", str(tiny_llama_dir)), page=PAGE, query={"prompt": PROMPT, **query})
    return make


def test_page_renders_a_reconstruction_with_every_view(app):
    at = app()
    assert not at.exception, at.exception
    assert not errors(at)
    assert metric(at, "Tokens recovered") == "100%"
    subheaders = [s.value for s in at.subheader]
    assert any(c.value == "Original vs recovered" for c in at.caption)  # the headline, above the settings
    for title in ("Accuracy by layer", "Accuracy vs noise, per defence",
                  "Forwards and time vs exhaustive search", "Cascade: sharding the sequence across parties"):
        assert title in subheaders
    assert any("What am I looking at?" in c.value for c in at.caption)
    assert at.query_params["layer"] == "1"
    # The Cascade panel says what it simulates and what it leaves out.
    assert any("not the Cascade protocol" in c.value and "V^(g+1)" in c.value for c in at.caption)
    scope = " ".join(m.value for m in at.markdown)
    assert "Left out (the rest of the protocol)" in scope and "attention nodes" in scope


def test_changing_layer_and_defence_updates_the_reconstruction(app):
    at = app()
    before = metric(at, "Candidates scored")
    at.toggle(key="inv_sweeps").set_value(False).run()  # the sweeps are covered by the test above
    at.number_input(key="inv_layer").set_value(2).run()
    at.selectbox(key="inv_perm").set_value("shuffle_both").run()
    assert not at.exception, at.exception
    assert at.query_params["layer"] == "2" and at.query_params["perm"] == "shuffle_both"
    assert metric(at, "Tokens recovered") == "100%"
    assert metric(at, "Candidates scored") != before
    at.selectbox(key="inv_perturb").set_value("gaussian_noise").run()
    at.number_input(key="inv_sigma").set_value(5.0).run()
    assert not at.exception
    assert metric(at, "Tokens recovered") != "100%"


def test_empty_prompt_gives_a_clear_message(app):
    at = app()
    at.text_input(key="inv_prompt").set_value("  ").run()
    assert not at.exception
    assert "empty" in errors(at)


def test_layer_out_of_range_gives_a_clear_message(app):
    at = app(layer="99", bits="99", parties="999", attacker="-3", sweeps="0", exhaustive="0")
    assert not at.exception, at.exception
    assert "out of range" in errors(at)
    assert metric(at, "Tokens recovered") == "100%"  # falls back to a valid layer


def test_over_long_prompt_gives_a_clear_message(app):
    at = app(prompt=" ".join(["w1"] * 100))
    assert not at.exception
    assert "limit" in errors(at)


@pytest.mark.skipif("shapes-lm" not in zoo_models(), reason="demo model not built yet")
def test_page_renders_on_the_demo_model():
    # The default prompt is a Shapes World caption; sweeps are covered on the tiny model above.
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), page=PAGE, query={"sweeps": "0"}, timeout=180)
    assert not at.exception, at.exception
    assert at.text_input(key="inv_prompt").value.startswith("there is a")
    assert metric(at, "Tokens recovered") == "100%"
    assert any(s.value.startswith("Breakable") for s in at.warning)  # Cascade on a 182-word vocabulary


def test_page_works_on_a_vlm(tiny_llava_dir):
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), page=PAGE,
                        query={"prompt": PROMPT, "layer": "2", "perm": "shuffle_positions", "sweeps": "0",
                               "exhaustive": "0"})
    assert not at.exception, at.exception
    assert metric(at, "Tokens recovered") == "100%"

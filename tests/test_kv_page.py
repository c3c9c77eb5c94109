"""AppTest of the KV-cache eviction page."""
from __future__ import annotations

import pytest
from conftest import app_with_model

from analysis.models import ModelSpec, zoo_models

PAGE = "views/kv_cache.py"
SMALL = {"context": "64", "budget": "24", "window": "4", "examples": "1"}


@pytest.fixture(scope="module")
def demo_spec(tiny_llama_dir):
    """The demo model when the zoo has it, else the tiny random Llama (same code path)."""
    if "shapes-lm" in zoo_models():
        return ModelSpec("zoo", "shapes-lm")
    return ModelSpec("local", str(tiny_llama_dir))


def _metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _errors(at) -> list[str]:
    return [e.value for e in at.error]


def test_page_renders_heatmap_and_tables(demo_spec):
    at = app_with_model(demo_spec, PAGE, query=SMALL)
    assert not at.exception, at.exception
    assert not _errors(at)
    charts = [c for c in at.get("plotly_chart")]
    assert len(charts) >= 4
    # The budget sweep runs on demand: its button, then its chart.
    sweep_button = next(b for b in at.button if b.label.startswith("Run: Sweeping budgets"))
    sweep_button.click().run()
    assert not at.exception, at.exception
    assert len(at.get("plotly_chart")) == len(charts) + 1
    heat = charts[0].proto.spec
    assert '"type":"heatmap"' in heat.replace(" ", "") and "cached tokens per decode step" in heat
    assert at.query_params["policy"] == ["morphkv"] or at.query_params["policy"] == "morphkv"
    assert "Key-value accuracy" in _metrics(at)
    assert at.caption  # explain notes present


def test_switching_policy_and_budget_updates_numbers(demo_spec):
    at = app_with_model(demo_spec, PAGE, query=SMALL)
    before = _metrics(at)
    at.selectbox(key="kv_policy").set_value("streaming_llm").run()
    assert not at.exception and not _errors(at)
    after_policy = _metrics(at)
    assert after_policy["Mean KL vs full (nats)"] != before["Mean KL vs full (nats)"]
    at.number_input(key="kv_budget").set_value(48).run()
    assert not at.exception and not _errors(at)
    after_budget = _metrics(at)
    assert after_budget["Mean KL vs full (nats)"] != after_policy["Mean KL vs full (nats)"]
    assert "48 entries/head" in str(at.metric[4].proto.delta)
    assert at.query_params["budget"] in ("48", ["48"])


def test_budget_larger_than_context_gives_clear_message(demo_spec):
    at = app_with_model(demo_spec, PAGE, query={**SMALL, "budget": "500"})
    assert not at.exception
    assert any("nothing would be evicted" in e for e in _errors(at))


def test_bad_url_values_give_messages_not_tracebacks(demo_spec):
    at = app_with_model(demo_spec, PAGE, query={**SMALL, "budget": "-5", "layer": "-3", "head": "99",
                                                "prefill": "7", "kernel": "4"})
    assert not at.exception, at.exception
    assert any("kernel must be a positive odd number" in e for e in _errors(at))


def test_model_whose_cache_cannot_be_evicted_gives_clear_message(tiny_mistral_sliding_dir):
    folder = tiny_mistral_sliding_dir
    at = app_with_model(ModelSpec("local", str(folder)), PAGE)
    assert not at.exception
    assert any("cannot be evicted" in e for e in _errors(at))

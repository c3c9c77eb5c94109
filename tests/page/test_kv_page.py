"""AppTest of the KV-cache eviction page."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from conftest import app_with_model

from analysis import kv
from analysis.model_access.models import ModelSpec, zoo_models

PAGE = "views/kv_cache.py"
SMALL = {"context": "64", "budget": "24", "snap_window": "4", "morph_window": "4", "examples": "1"}


@pytest.fixture(scope="module")
def demo_spec(tiny_llama_dir):
    """The demo model when the zoo has it, else the tiny random Llama (same code path)."""
    if "shapes-lm" in zoo_models():
        return ModelSpec("zoo", "shapes-lm")
    return ModelSpec("local", str(tiny_llama_dir))


def _metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _chapter(at, name: str):
    """Show one of the page's later sections (one at a time: the others are not drawn)."""
    at.segmented_control(key="kv_chapter").set_value(name).run(timeout=600)
    assert not at.exception, at.exception
    return at


def _errors(at) -> list[str]:
    return [e.value.replace("\\", "") for e in at.error]  # as read: messages are shown Markdown-escaped


def test_page_renders_heatmap_and_tables(demo_spec):
    at = app_with_model(demo_spec, PAGE, query=SMALL, timeout=600)
    assert not at.exception, at.exception
    assert not _errors(at)
    charts = [c for c in at.get("plotly_chart")]
    assert len(charts) == 1  # the headline: which tokens stay in the cache
    assert at.segmented_control(key="kv_chapter").options == ["All policies", "Variants and answers",
                                                               "KL and needle survival", "Memory", "Budget sweep",
                                                               "Generated text"]
    assert len(at.dataframe) == 1  # the default section: one table (three took it over 3 s to draw, #47)
    assert len(_chapter(at, "KL and needle survival").get("plotly_chart")) == 3
    assert len(_chapter(at, "Memory").get("plotly_chart")) == 2
    assert len(at.dataframe) == 0  # the tables are drawn in their own sections only
    assert len(_chapter(at, "All policies").dataframe) == 1
    assert len(_chapter(at, "Variants and answers").dataframe) >= 1
    _chapter(at, "Budget sweep")
    charts = [c for c in at.get("plotly_chart")]
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
    at = app_with_model(demo_spec, PAGE, query=SMALL, timeout=600)
    before = _metrics(at)
    at.selectbox(key="kv_policy").set_value("streaming_llm").run(timeout=600)
    assert not at.exception and not _errors(at)
    after_policy = _metrics(at)
    assert after_policy["Mean KL vs full (nats)"] != before["Mean KL vs full (nats)"]
    at.number_input(key="kv_budget").set_value(48).run(timeout=600)
    assert not at.exception and not _errors(at)
    after_budget = _metrics(at)
    assert after_budget["Mean KL vs full (nats)"] != after_policy["Mean KL vs full (nats)"]
    assert "48 entries/head" in str(at.metric[4].proto.delta)
    assert at.query_params["budget"] in ("48", ["48"])


def test_budget_larger_than_context_gives_clear_message(demo_spec):
    at = app_with_model(demo_spec, PAGE, query={**SMALL, "budget": "500"}, timeout=600)
    assert not at.exception
    assert any("nothing would be evicted" in e for e in _errors(at))


def test_bad_url_values_give_messages_not_tracebacks(demo_spec):
    at = app_with_model(demo_spec, PAGE, query={**SMALL, "budget": "-5", "layer": "-3", "head": "99",
                                                "prefill": "7", "kernel": "4"})
    assert not at.exception, at.exception
    assert any("Budget C (entries per head) must be at least 1" in e for e in _errors(at))


@pytest.mark.parametrize("query,message", [
    ({"kernel": "4"}, "kernel must be a positive odd number"),
    ({"morph_window": "-1"}, "MorphKV window W must be at least 2"),
    ({"heavy_share": "1.5"}, "heavy-hitter share must be at most 0.95"),
    ({"prefill": "0"}, "Prefilled share must be at least 0.05"),
])
def test_bad_link_settings_get_the_cli_message(tiny_llama_dir, query, message):
    """The URL goes through the same validation as the CLI (the settings classes), one line each."""
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, query={**SMALL, **query})
    assert not at.exception, at.exception
    assert any(message in e for e in _errors(at)), _errors(at)


@dataclass
class KeepFirst(kv.Policy):
    """A toy policy: keeps the first C entries."""

    name: ClassVar[str] = "toy_keep_first"
    label: ClassVar[str] = "Toy: the first C tokens"
    colour: ClassVar[str] = "#17becf"

    def select(self, layer, attn, state):
        if state.length <= self.budget:
            return None
        return torch.arange(self.budget).expand(1, state.positions.shape[1], -1)


def test_a_registered_policy_appears_in_the_page(tiny_llama_dir):
    """Adding a policy is one class: registered, it is in the selectbox, runs, and is labelled."""
    kv.POLICIES.register(KeepFirst)
    try:
        at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, query=SMALL, timeout=600)
        assert not at.exception, at.exception
        box = at.selectbox(key="kv_policy")
        assert "Toy: the first C tokens" in box.options
        box.set_value("toy_keep_first").run(timeout=600)
        assert not at.exception and not _errors(at), _errors(at)
        assert at.query_params["policy"] in ("toy_keep_first", ["toy_keep_first"])
        assert any("Toy: the first C tokens" in str(df.value) for df in _chapter(at, "All policies").dataframe)
    finally:
        kv.POLICIES.unregister("toy_keep_first")
    assert "toy_keep_first" not in kv.POLICIES


def test_model_whose_cache_cannot_be_evicted_gives_clear_message(tiny_mistral_sliding_dir):
    folder = tiny_mistral_sliding_dir
    at = app_with_model(ModelSpec("local", str(folder)), PAGE)
    assert not at.exception
    assert any("cannot be evicted" in e for e in _errors(at))


def test_long_response_view_renders_its_heatmap_tables_and_charts(demo_spec):
    at = app_with_model(demo_spec, PAGE, query={**SMALL, "task": "long-response", "budget": "16", "response": "12"},
                        timeout=600)
    assert not at.exception, at.exception
    assert not _errors(at), _errors(at)
    charts = [c.proto.spec for c in at.get("plotly_chart")]
    assert len(charts) == 1 and "cached tokens while it writes" in charts[0]  # the headline
    assert "Item recall" in _metrics(at) and "Top-1 agreement (same prefix)" in _metrics(at)
    summary = next(df.value for df in at.dataframe if "identical for (tokens)" in df.value.columns)
    assert len(_chapter(at, "Agreement and memory").get("plotly_chart")) == 3
    assert list(summary["policy"]) == [kv.POLICIES.label(n) for n in kv.main_policies()]
    assert at.query_params["task"] in ("long-response", ["long-response"])
    at.radio(key="kv_position_metric").set_value("kl").run(timeout=600)
    assert not at.exception and "KL(full" in at.get("plotly_chart")[1].proto.spec


@pytest.mark.parametrize("query,message", [
    ({"response": "-5"}, "Response tokens (long response) must be at least 8"),
    ({"budget": "0"}, "Budget C (entries per head) must be at least 1"),
    ({"morph_window": "1"}, "MorphKV window W must be at least 2"),
])
def test_long_response_bad_link_settings_get_the_cli_message(tiny_llama_dir, query, message):
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE,
                        query={**SMALL, "task": "long-response", "response": "8", **query})
    assert not at.exception, at.exception
    assert any(message in e for e in _errors(at)), _errors(at)

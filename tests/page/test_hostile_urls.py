"""Hostile links: every control's URL value out of range, negative, huge, of the wrong type and as script
text, on every page. The page must not raise; values are clamped, replaced by the default, or explained
in one line; script text never reaches the page as HTML."""
from __future__ import annotations

import pytest

from analysis.model_access.models import ModelSpec, zoo_models
from conftest import app_with_model

HOSTILE = {
    "negative": "-1",
    "huge_negative": "-99999999999999999999999",
    "huge": "99999999999999999999999",
    "overflow_float": "1e309",
    "nan": "nan",
    "fraction": "3.5",
    "wrong_type": "abc",
    "empty": "",
    "script": "<script>alert(1)</script>",
    "list_with_script": "1,2,<b>x</b>,-4",
}

def url_names(page: str) -> list[str]:
    """Every URL name a page reads, from its panel's fields (Params and view state, components/view.py),
    read when the test runs: a field added later is fuzzed with no edit here. The home page reads none."""
    from analysis.framework import panels
    from components.view import url_fields

    for analysis in panels.analyses():
        if analysis.page and page == f"views/{analysis.page}":
            return sorted(url_fields(analysis)) + ["preset"]
    return ["preset"]


PAGES = ["views/attention_sharpness.py", "views/kv_cache.py", "views/prompt_reconstruction.py",
         "views/caption_correction.py", "views/sae_features.py", "views/residual_stream.py", "views/overview.py"]

LM_PAGES = ["views/attention_sharpness.py", "views/kv_cache.py", "views/prompt_reconstruction.py",
            "views/residual_stream.py"]
VLM_PAGES = ["views/caption_correction.py", "views/sae_features.py"]
HAS_VLM = "shapes-vlm" in zoo_models()


@pytest.fixture(autouse=True)
def small_sweeps():
    """Valid but large settings (512 prompts per n, a 192-token KV context swept over budgets) are minutes
    of work on a busy machine and prove nothing about URL handling. Serve them from smaller settings of
    the same analysis (settings a model cannot take still reach the real code and its error), and forget
    those results afterwards."""
    import dataclasses

    from analysis import kv
    from analysis import sharpness as S
    from components import runs

    def shrink(key, handle, params, models=None):
        if isinstance(params, S.SweepParams) and params.samples > 2:
            return S.size_sweep(handle, dataclasses.replace(params, samples=2))
        if isinstance(params, kv.KvParams) and not params.prompt.strip():
            limit = handle.info.max_positions or 10**9
            if params.context + 16 + params.new_tokens <= limit and (params.context > 48 or params.examples > 1):
                small = dataclasses.replace(params, context=min(params.context, 48), examples=1)
                return (kv.analyze if key.kind == "analyze" else kv.budget_sweep)(handle, small)
        return None

    runs.add_source(shrink)
    yield
    runs.remove_source(shrink)
    runs.run_store().clear()


def _no_raw_script(at) -> None:
    for element in list(at.markdown) + list(at.caption):
        assert "<script>" not in element.value, element.value
    from components.narrow_sidebar import FOLD_JS

    for element in at.get("html"):
        if element.proto.body == FOLD_JS:
            continue  # the app's own script (the sidebar folds in a narrow window), the same on every page
        assert "<script>" not in element.proto.body


def _check(at, page: str) -> None:
    assert not at.exception, [e.value for e in at.exception]
    _no_raw_script(at)
    for number in at.number_input:  # clamped into the widget's own range
        proto = number.proto
        assert not proto.has_min or number.value >= proto.min, (number.proto.label, number.value)
        assert not proto.has_max or number.value <= proto.max, (number.proto.label, number.value)
    for slider in at.slider:
        assert slider.min <= slider.value <= slider.max if not isinstance(slider.value, tuple) else True


def _query(page: str, value: str, extra: dict | None = None) -> dict[str, str]:
    return {**{name: value for name in url_names(page)}, **(extra or {})}


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("page", LM_PAGES)
def test_lm_page_survives_hostile_url_values(tiny_llama_dir, page, kind):
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), page, query=_query(page, HOSTILE[kind]),
                        timeout=300)
    _check(at, page)


@pytest.mark.skipif(not HAS_VLM, reason="needs the demo VLM")
@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("page", VLM_PAGES)
def test_vlm_page_survives_hostile_url_values(page, kind):
    extra = {"cap": "paste", "ground": "0"} if page.endswith("caption_correction.py") else {}
    at = app_with_model(ModelSpec("zoo", "shapes-vlm"), page, query=_query(page, HOSTILE[kind], extra),
                        timeout=300)
    _check(at, page)


@pytest.mark.skipif(not HAS_VLM, reason="needs the demo VLM")
@pytest.mark.parametrize("view", ["feature", "ranking", "explain"])
def test_sae_views_survive_hostile_values(view):
    page = "views/sae_features.py"
    for kind in ("huge", "negative", "script"):
        at = app_with_model(ModelSpec("zoo", "shapes-vlm"), page,
                            query=_query(page, HOSTILE[kind], {"view": view}), timeout=300)
        _check(at, page)


@pytest.mark.parametrize("kind", ["script", "huge", "wrong_type"])
def test_hostile_model_in_the_url_falls_back_to_a_clear_state(kind):
    at = app_with_model(None, "views/overview.py", query={"model": HOSTILE[kind]})
    assert not at.exception
    _no_raw_script(at)


@pytest.mark.skipif(not HAS_VLM, reason="needs the demo VLM")
def test_caption_page_with_negative_seed_is_clamped():
    """A shared link with ?seed=-1 crashed the caption page (StreamlitValueBelowMinError)."""
    at = app_with_model(ModelSpec("zoo", "shapes-vlm"), "views/caption_correction.py",
                        query={"src": "scene", "seed": "-1", "cap": "paste", "text": "there is a red circle .",
                               "dec": "grammar", "rew": "grammar", "ground": "0"})
    assert not at.exception, [e.value for e in at.exception]
    assert at.number_input(key="cap_seed").value == 0


def test_no_page_reads_a_url_name_of_its_own():
    """Every page is one call (components/view.py): it reads no URL text itself, so every name it reads
    is a field's and is fuzzed above."""
    import ast
    import re

    from conftest import ROOT

    for page in PAGES:
        source = (ROOT / page).read_text()
        assert not re.search(r"url_param|url_list|query_params", source), page
        body = [node for node in ast.parse(source).body[1:] if not isinstance(node, (ast.Import, ast.ImportFrom))]
        assert len(body) == 1 and isinstance(body[0].value, ast.Call), page  # one call, nothing else


def test_no_two_fields_of_a_page_share_a_url_name():
    """One URL name, one meaning: a panel's Params and view state never name two fields alike."""
    from analysis.framework import panels
    from components.view import params_fields, state_fields
    from analysis.framework.settings import url_name

    for analysis in panels.analyses():
        names = [url_name(f) for f, _ in params_fields(analysis) + state_fields(analysis) if url_name(f)]
        assert len(names) == len(set(names)), (analysis.name, sorted(n for n in names if names.count(n) > 1))

"""Hostile links: every control's URL value out of range, negative, huge, of the wrong type and as script
text, on every page. The page must not raise; values are clamped, replaced by the default, or explained
in one line; script text never reaches the page as HTML."""
from __future__ import annotations

import pytest

from analysis.models import ModelSpec, zoo_models
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

def _fields_of(page: str) -> list[str] | None:
    """The URL names of a page declared through components/view.py: its panel's fields."""
    from analysis import panels
    from components.view import url_fields

    for analysis in panels.analyses():
        if analysis.page and page == f"views/{analysis.page}" and analysis.params is not None:
            return sorted(url_fields(analysis))
    return None


# Every parameter each page reads from its URL (a declared page: from its fields).
PAGES = {
    "views/attention_sharpness.py": ["ns", "samples", "theta", "layer", "head", "sink", "tlayers", "spread", "min_entropy",
                                     "prompt", "target", "n_view"],
    "views/kv_cache.py": [],
    "views/prompt_reconstruction.py": ["prompt", "layer", "perm", "perturb", "order", "noise", "bits", "seed",
                                       "gradient_steps", "gradient_min_vocab", "gradient_after",
                                       "gradient_after_start", "sweeps", "exhaustive", "parties", "sharding",
                                       "attacker", "budget"],
    "views/caption_correction.py": ["src", "seed", "cap", "text", "lm", "dec", "ver", "rew", "pi", "prob", "ground",
                                    "dec_tokens", "rew_tokens", "rew_checked", "batch"],
    "views/sae_features.py": ["sae", "view", "sort", "labels", "feature", "by", "thr", "rule", "keep", "data", "slayer",
                              "spair", "img", "steer", "mode", "at", "tokens", "sprompt"],
    "views/residual_stream.py": [],
    "views/overview.py": [],
}
PAGES.update({page: names for page in PAGES if (names := _fields_of(page)) is not None})
for page_params in PAGES.values():
    page_params.append("preset")

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
    for element in at.get("html"):
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
    return {**{name: value for name in PAGES[page]}, **(extra or {})}


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


def test_every_url_parameter_of_every_page_is_tried():
    """A control added to a page later must be added above, so hostile values reach it too."""
    import re

    from conftest import ROOT

    for page, names in PAGES.items():
        source = (ROOT / page).read_text()
        if _fields_of(page) is not None:  # declared: one call, no URL name of its own
            assert not re.search(r"url_param|url_list|query_params", source), page
            continue
        read = set(re.findall(r"(?:url_param|url_list|checked)\(\s*\"(\w+)\"", (ROOT / page).read_text()))
        assert read <= set(names), f"{page}: add {sorted(read - set(names))} to PAGES"

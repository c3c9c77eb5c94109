"""One source of truth for the model (issue 47): the sidebar's picker, its "Loaded:" line, the URL and the
page always name the same model, after a preset or a link switched it and after leaving the preset."""
from __future__ import annotations

import pytest

from analysis.model_access.models import ModelSpec, zoo_models
from conftest import app_with_model

HAS_ZOO = {"shapes-lm", "shapes-vlm"} <= set(zoo_models())
pytestmark = pytest.mark.skipif(not HAS_ZOO, reason="needs the demo zoo")


def _url(at, key: str) -> str:
    value = at.query_params.get(key)
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _named(at) -> dict[str, str]:
    """The model as each place names it: the select box, the "Loaded:" line, the URL, the session."""
    loaded = [c.value for c in at.sidebar.caption if c.value.startswith("Loaded:")]
    return {"picker": at.sidebar.selectbox(key="picker_zoo").value,
            "loaded": loaded[0].split("**")[1] if loaded else "",
            "url": _url(at, "model"),
            "session": at.session_state["model_spec"].label}


def _agree(at, name: str) -> None:
    named = _named(at)
    assert named == {"picker": name, "loaded": f"zoo:{name}", "url": f"zoo:{name}",
                     "session": f"zoo:{name}"}, named


def _said(at) -> list[str]:
    return [i.value.replace("\\", "") for i in at.info]  # the page escapes Markdown in model names


def test_a_preset_that_switches_the_model_moves_the_picker_and_load_keeps_it():
    """Before: the preset forgot the select box's state, which the browser kept showing (and AppTest could
    not see); now the picker's state is written, so every place names the preset's model."""
    at = app_with_model(ModelSpec("zoo", "shapes-vlm"), "views/prompt_reconstruction.py", timeout=300)
    assert not at.exception
    _agree(at, "shapes-vlm")
    at.button(key="preset_prompt-reconstruction_noise-defeats").click().run()
    assert not at.exception, [e.value for e in at.exception]
    _agree(at, "shapes-lm")
    assert any("noise" in c.value.lower() and "shapes-vlm" in c.value.replace("\\", "")
               for c in at.sidebar.caption), [c.value for c in at.sidebar.caption]  # whose model it is
    at.sidebar.button(key="picker_load").click().run()  # Load model with what the picker shows: no switch back
    assert not at.exception
    _agree(at, "shapes-lm")


def test_leaving_a_preset_returns_to_the_visitors_model_and_says_so():
    at = app_with_model(ModelSpec("zoo", "shapes-vlm"), "views/prompt_reconstruction.py", timeout=300)
    at.button(key="preset_prompt-reconstruction_noise-defeats").click().run()
    _agree(at, "shapes-lm")
    at.switch_page("views/caption_correction.py").run()
    assert not at.exception, [e.value for e in at.exception]
    _agree(at, "shapes-vlm")
    assert any("Back on your model, zoo:shapes-vlm" in line for line in _said(at)), _said(at)


@pytest.mark.parametrize("page,title", [("views/caption_correction.py", "Caption correction"),
                                        ("views/sae_features.py", "SAE-V features")])
def test_a_panel_the_default_model_cannot_show_opens_on_its_demo_model_with_one_line(page, title):
    """Before: Caption correction opened on a red "needs a vision-language model" above a button, SAE-V on a
    training form only (no SAE for shapes-lm). Now both open on shapes-vlm, saying why, with no error."""
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), page, timeout=300)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    _agree(at, "shapes-vlm")
    why = [line for line in _said(at) if line.startswith("Showing zoo:shapes-vlm")]
    assert len(why) == 1 and title in why[0] and "zoo:shapes-lm" in why[0], _said(at)
    assert at.get("plotly_chart") or at.dataframe, "the page shows no result"
    at.switch_page("views/prompt_reconstruction.py").run()  # the visitor's model comes back elsewhere
    _agree(at, "shapes-lm")


def test_the_sidebar_lists_the_panels_in_the_readmes_order():
    import re

    from analysis.framework.paths import ROOT
    from components.registry import panel_pages

    table = (ROOT / "README.md").read_text().split("## Tour of the panels", 1)[1].split("\n## ", 1)[0]
    titles = [p.title for p in panel_pages() if p.paper]
    readme = [t for t in dict.fromkeys(re.findall(r"^\| ([^|]+?) \|", table, re.M)) if t in titles]  # the first table
    assert titles == readme

"""AppTest: saving from the share bar, the gallery, reopening by id, and deleting."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from analysis.model_access.models import ModelSpec
from analysis.hosting.store import AnalysisStore, SavedAnalysis
from conftest import app_with_model

SHARE_PAGE = """
import plotly.graph_objects as go
import streamlit as st
from components.share import share_bar
fig = go.Figure(go.Bar(x=["a", "b"], y=[3, 4]), layout={"title": {"text": "demo figure"}})
share_bar("demo", title="Demo <b>analysis</b>", params={"n": 3}, result={"values": [3, 4]},
          model="zoo:test", figures={"Demo figure": fig}, tables={"rows": [{"x": "a", "y": 3}]})
"""


@pytest.fixture()
def store_path(tmp_path, monkeypatch):
    path = tmp_path / "store.db"
    monkeypatch.setenv("MODEL_INSPECTOR_STORE", str(path))
    return path


def open_share_bar(key: str = "share_demo") -> AppTest:
    """The demo page with its share bar opened (as a click on it does: the expander's state, then a rerun)."""
    at = AppTest.from_string(SHARE_PAGE, default_timeout=30)
    at.session_state[f"{key}_open"] = True
    at.run()
    return at


def test_share_bar_is_filled_only_while_open(store_path):
    """Closed (as every page opens), the bar sends nothing to draw: no link box, downloads or form."""
    at = AppTest.from_string(SHARE_PAGE, default_timeout=30)
    at.run()
    assert not at.exception and len(at.expander) == 1
    assert not at.code and not at.text_input and not at.get("download_button") and not at.button
    at = open_share_bar()
    assert not at.exception
    assert len(at.code) == 1  # the link box
    assert len(at.get("download_button")) == 3 and at.text_input(key="share_demo_title").value == "Demo <b>analysis</b>"


def test_share_bar_saves_analysis(store_path):
    at = open_share_bar()
    assert not at.exception
    at.text_input(key="share_demo_title").set_value("My saved demo")
    at.text_area(key="share_demo_note").set_value("look at bar b")
    assert len(at.button) == 1  # the form's Save button (downloads are not buttons here)
    at.button[0].click().run()
    saved = AnalysisStore(store_path).list()
    assert len(saved) == 1
    a = saved[0]
    assert (a.title, a.note, a.panel, a.params, a.result) == ("My saved demo", "look at bar b", "demo", {"n": 3},
                                                              {"values": [3, 4]})
    assert a.figures[0]["name"] == "Demo figure" and a.tables == {"rows": [{"x": "a", "y": 3}]}
    assert any("Saved" in s.value for s in at.success)


def test_save_confirmation_is_shown_outside_the_closed_expander_with_the_title_escaped(store_path):
    at = open_share_bar()
    at.text_input(key="share_demo_title").set_value("<script>alert(1)</script> *bold* [x](javascript:1)")
    at.button[0].click().run()
    assert not at.exception
    saved_id = AnalysisStore(store_path).list()[0].id
    assert not at.expander[0].success  # below the bar, where it is seen whether the bar is open or not
    notice = [s.value for s in at.success]
    assert len(notice) == 1 and f"saved-analyses?id={saved_id}" in notice[0]
    assert "<script>" not in notice[0] and "*bold*" not in notice[0] and "](" not in notice[0]
    assert "&lt;script&gt;alert\\(1\\)&lt;\\/script&gt;" in notice[0]
    assert [t.value for t in at.toast] and "Saved" in at.toast[0].value
    at.run()  # a later rerun of the same view keeps the line
    assert len(at.success) == 1


def test_gallery_lists_and_permalink_reopens_without_model(store_path, tiny_llama_dir):
    store = AnalysisStore(store_path)
    saved_id = store.save(SavedAnalysis(
        title="KV run", panel="kv", model="zoo:shapes-lm", params={"budget": 16}, result={"acc": 0.75},
        note="budget 16 keeps the needle",
        figures=[{"name": "fig", "figure": {"data": [{"type": "scatter", "y": [1, 2, 3]}], "layout": {}}}],
        tables={"policies": [{"policy": "morphkv", "acc": 0.75}]},
    ))
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), page="views/saved_analyses.py")
    assert not at.exception
    assert "KV run" in " ".join(m.value for m in at.markdown)
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), page="views/saved_analyses.py",
                        query={"id": saved_id})
    assert not at.exception
    assert at.subheader[0].value == "KV run"
    assert at.info[0].value == "budget 16 keeps the needle"
    assert at.dataframe[0].value["acc"].tolist() == [0.75]
    assert len(at.get("plotly_chart")) == 1


def test_unknown_id_gives_clear_message(store_path, tiny_llama_dir):
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), page="views/saved_analyses.py",
                        query={"id": "nope"})
    assert not at.exception
    assert "No saved analysis with id 'nope'" in at.error[0].value


def test_delete_with_confirmation(store_path, tiny_llama_dir):
    store = AnalysisStore(store_path)
    from analysis.framework.uploads import owner_key

    # saved by this visitor (AppTest has no connection: every session is the visitor "local")
    saved_id = store.save(SavedAnalysis(title="to delete", panel="kv", model="m", owner=owner_key("ip:local")))
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), page="views/saved_analyses.py",
                        query={"id": saved_id})
    at.button(key="confirm_delete").click().run()
    assert store.get(saved_id) is None

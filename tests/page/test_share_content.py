"""Shared results keep their meaning (issue 47): the share bar's HTML report and the saved snapshot carry the
metric cards the page led with and its "What am I looking at?" notes, not only parameters and figures."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest


def _page():
    import streamlit as st

    from components import share
    from components.common import explain, metric_row, page_record

    page_record(reset=True)  # a page starts (components/presets.py's preset bar does this)
    st.session_state["share_residual_open"] = True
    row = metric_row()
    row.metric("Clean: logit(target) − logit(foil)", "+7.31")
    row.metric("Corrupted", "-6.02")
    explain("Each <b>cell</b> restores a share of the difference.")
    share.share_bar("residual", title="Activation patching on zoo:shapes-lm: your own two prompts",
                    params={"pair": "own"}, result={}, model="zoo:shapes-lm", tables={"peak": [{"x": 1}]})
    row = metric_row()  # a second view on the same page: its own bar gets its own numbers only
    row.metric("Later", "1")
    share.share_bar("residual", title="Second", params={}, result={}, model="zoo:shapes-lm", key="second")


def test_the_saved_snapshot_carries_the_headline_metrics_and_the_notes(tmp_path, monkeypatch):
    monkeypatch.setenv("MODEL_INSPECTOR_STORE", str(tmp_path / "analyses.db"))
    at = AppTest.from_function(_page, default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    at.button[0].click().run()  # Save, in the first bar
    assert not at.exception and at.success, [e.value for e in at.exception]
    from components.share import get_store

    saved = get_store().get(at.success[0].value.split("saved-analyses?id=")[1].split("`")[0])
    assert saved.title == "Activation patching on zoo:shapes-lm: your own two prompts"
    assert saved.tables["Headline"] == [{"metric": "Clean: logit(target) − logit(foil)", "value": "+7.31"},
                                        {"metric": "Corrupted", "value": "-6.02"}]
    assert saved.tables["What am I looking at?"] == [{"note": "Each <b>cell</b> restores a share of the difference."}]
    assert saved.tables["peak"] == [{"x": 1}]

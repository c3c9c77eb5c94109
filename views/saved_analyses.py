"""Saved analyses: a gallery, and a permalink (?id=...) that reopens one without recomputing."""
from __future__ import annotations

import datetime as dt

import plotly.graph_objects as go
import streamlit as st

from analysis.export import ReportSection, html_report, result_json
from components.common import explain
from components.share import get_store

st.title("Saved analyses")
store = get_store()
selected = st.query_params.get("id")


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


if selected:
    analysis = store.get(selected)
    if analysis is None:
        st.error(f"No saved analysis with id '{selected}'. It may have been deleted.")
        if st.button("Back to the gallery"):
            del st.query_params["id"]
            st.rerun()
        st.stop()
    st.subheader(analysis.title)
    st.caption(f"{analysis.panel} · {analysis.model} · saved {_when(analysis.created)} · id `{analysis.id}`")
    explain("A stored snapshot: the figures, tables and result exactly as they were saved; nothing is "
            "recomputed. The live view's link is below, to rerun it on the current model.")
    if analysis.note:
        st.info(analysis.note)
    if analysis.url:
        st.code(analysis.url, language=None)
    for item in analysis.figures:
        st.plotly_chart(go.Figure(item["figure"]), key=f"saved_fig_{item['name']}")
    for name, rows in analysis.tables.items():
        st.markdown(f"**{name}**")
        st.dataframe(rows, hide_index=True)
    with st.expander("Parameters and result (JSON)"):
        st.json({"params": analysis.params, "result": analysis.result}, expanded=False)
    cols = st.columns(3)
    cols[0].download_button("JSON result", data=lambda: result_json(analysis.result),
                            file_name=f"{analysis.id}.json", mime="application/json", on_click="ignore")
    cols[1].download_button(
        "HTML report", mime="text/html", file_name=f"{analysis.id}.html", on_click="ignore",
        data=lambda: html_report(
            analysis.title, [ReportSection(f["name"], figure=f["figure"]) for f in analysis.figures]
            + [ReportSection(n, table=r) for n, r in analysis.tables.items()],
            model=analysis.model, note=analysis.note, params=analysis.params, url=analysis.url),
    )
    with cols[2].popover("Delete"):
        st.write("Delete this analysis for everyone? This cannot be undone.")
        if st.button("Yes, delete", type="primary", key="confirm_delete"):
            store.delete(analysis.id)
            del st.query_params["id"]
            st.rerun()
    if st.button("Back to the gallery"):
        del st.query_params["id"]
        st.rerun()
else:
    explain("Analyses saved from any panel's *Share, save and export* bar. Each opens by its own "
            "link (`?id=...`) without recomputing, for anyone with access to this server.")
    analyses = store.list()
    if not analyses:
        st.info("Nothing saved yet. Run a panel and use its *Save this analysis* form.")
    for a in analyses:
        with st.container(border=True):
            left, right = st.columns([5, 1])
            left.markdown(f"**{a.title}**")
            left.caption(f"{a.panel} · {a.model} · {_when(a.created)}" + (f" — {a.note[:120]}" if a.note else ""))
            if right.button("Open", key=f"open_{a.id}"):
                st.query_params["id"] = a.id
                st.rerun()

"""Share, save and export bar: one call at the bottom of any panel.

    share_bar("kv", title="KV eviction on shapes-lm", params=params, result=result,
              figures={"Retained tokens": fig}, tables={"policies": rows})

Gives the permalink (the page URL with its mirrored controls), downloads (JSON result, CSV per
table, self-contained HTML report) and a form that saves the analysis to the SQLite store, to be
reopened from the Saved analyses page without recomputing.
"""
from __future__ import annotations

import re
from typing import Any

import streamlit as st

from analysis.export import ReportSection, html_report, result_json, rows_to_csv
from analysis.results import to_jsonable
from analysis.store import AnalysisStore, SavedAnalysis, default_store_path


@st.cache_resource(max_entries=4)
def _store_at(path: str) -> AnalysisStore:
    return AnalysisStore(path)


def get_store() -> AnalysisStore:
    """The store at $MODEL_INSPECTOR_STORE (default .model_inspector/analyses.db)."""
    return _store_at(str(default_store_path()))


def current_url() -> str:
    """The URL of the current view (path + mirrored query params)."""
    try:
        base = st.context.url or ""
    except Exception:  # AppTest has no browser URL
        base = ""
    query = "&".join(f"{k}={v}" for k, v in st.query_params.to_dict().items())
    base = base.split("?")[0]
    return f"{base}?{query}" if query else base


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "analysis"


def share_bar(panel: str, *, title: str, params: dict, result: Any, model: str,
              figures: dict[str, Any] | None = None, tables: dict[str, list[dict]] | None = None,
              key: str | None = None) -> None:
    figures = figures or {}
    tables = tables or {}
    key = key or f"share_{panel}"
    slug = _slug(title)
    url = current_url()
    with st.expander(":material/share: Share, save and export", expanded=False):
        st.caption("Link that reproduces this view (all controls are in the URL):")
        st.code(url or "(open in a browser to get the link)", language=None)
        cols = st.columns(2 + len(tables))
        cols[0].download_button("JSON result", data=lambda: result_json(result), file_name=f"{slug}.json",
                                mime="application/json", key=f"{key}_json", on_click="ignore")

        def report() -> str:
            sections = [ReportSection(name, figure=fig) for name, fig in figures.items()]
            sections += [ReportSection(name, table=rows) for name, rows in tables.items()]
            return html_report(title, sections, model=model, params=params, url=url)

        cols[1].download_button("HTML report", data=report, file_name=f"{slug}.html", mime="text/html",
                                key=f"{key}_html", on_click="ignore")
        for col, (name, rows) in zip(cols[2:], tables.items()):
            col.download_button(f"CSV: {name}", data=lambda rows=rows: rows_to_csv(rows),
                                file_name=f"{slug}-{_slug(name)}.csv", mime="text/csv",
                                key=f"{key}_csv_{_slug(name)}", on_click="ignore")
        with st.form(f"{key}_save", clear_on_submit=False):
            st.markdown("**Save this analysis** (reopens from *Saved analyses* without recomputing)")
            save_title = st.text_input("Title", value=title, max_chars=200, key=f"{key}_title")
            note = st.text_area("Note", max_chars=5000, key=f"{key}_note")
            if st.form_submit_button("Save"):
                analysis = SavedAnalysis(
                    title=save_title, note=note, panel=panel, model=model, params=to_jsonable(params),
                    result=to_jsonable(result),
                    figures=[{"name": n, "figure": f.to_plotly_json() if hasattr(f, "to_plotly_json") else f}
                             for n, f in figures.items()],
                    tables=tables, url=url,
                )
                try:
                    saved_id = get_store().save(analysis)
                except Exception as exc:  # disk full, read-only folder, ...
                    st.error(f"Could not save: {exc}")
                else:
                    st.session_state[f"{key}_saved"] = saved_id
        if st.session_state.get(f"{key}_saved"):
            st.success(f"Saved. Open it any time at `saved-analyses?id={st.session_state[f'{key}_saved']}`.")

"""The saved-analyses page (views/saved_analyses.py): a gallery, a permalink (?id=...) that reopens one
without recomputing, and its embed (?id=...&embed=true: the title, figures and tables alone, for an iframe).
Everything a saver typed (title, note, name) is shown as plain text; only the one who saved an analysis is
offered its Delete."""
from __future__ import annotations

import datetime as dt

import plotly.graph_objects as go
import streamlit as st

from analysis.hosting.export import ReportSection, html_report, result_json
from analysis.hosting.store import StoreError
from components import hosting, own_talk
from components.common import explain, one_line
from components.share import current_url, escape_markdown, get_store, owner

GALLERY_SIZE = 200


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _byline(a) -> str:
    by = f" · saved by {escape_markdown(a.saved_by)}" if a.saved_by else ""
    return f"{escape_markdown(a.panel)} · {escape_markdown(a.model)} · {_when(a.created)}{by}"


def _back() -> None:
    if st.button("Back to the gallery"):
        del st.query_params["id"]
        st.rerun()


def render() -> None:
    """The gallery, or one saved analysis (`?id=`), alone in an iframe with `&embed=true`."""
    embedded = hosting.is_embedded()
    try:
        store = get_store()
    except StoreError as exc:
        st.error(f"The saved analyses cannot be reached: {hosting.visible_markdown(one_line(exc))}",
                 icon=":material/error:")
        return
    selected = st.query_params.get("id")
    if selected:
        show_saved(store, selected, embedded)
    else:
        gallery(store)


def show_saved(store, selected: str, embedded: bool) -> None:
    analysis = store.get(selected)
    if analysis is None:
        st.title("Saved analyses")
        st.error(f"No saved analysis with id '{escape_markdown(selected[:80])}'. It may have been deleted.")
        if not embedded:
            _back()
        return
    if embedded:  # the view alone, sized by the iframe
        st.subheader(escape_markdown(analysis.title))
        st.caption(_byline(analysis))
        for item in analysis.figures:
            st.plotly_chart(go.Figure(item["figure"]), key=f"saved_fig_{item['name']}")
        for name, rows in analysis.tables.items():
            st.markdown(f"**{escape_markdown(name)}**")
            st.dataframe(rows, hide_index=True)
        return
    st.title("Saved analyses")
    st.subheader(escape_markdown(analysis.title))
    st.caption(f"{_byline(analysis)} · id `{analysis.id}`")
    if analysis.panel == own_talk.PANEL:  # a talk made in the gallery: its steps are below, as JSON
        st.link_button("Present this talk", f"/?talk={analysis.id}", icon=":material/slideshow:")
    explain("A stored snapshot: the figures, tables and result exactly as they were saved; nothing is "
            "recomputed. The live view's link is below, to rerun it on the current model.")
    if analysis.note:
        st.info(escape_markdown(analysis.note))
    if analysis.url:
        st.code(analysis.url, language=None)
    for item in analysis.figures:
        st.plotly_chart(go.Figure(item["figure"]), key=f"saved_fig_{item['name']}")
    for name, rows in analysis.tables.items():
        st.markdown(f"**{escape_markdown(name)}**")
        st.dataframe(rows, hide_index=True)
    with st.expander("Parameters and result (JSON)"):
        st.json({"params": analysis.params, "result": analysis.result}, expanded=False)
    with st.expander("Embed this analysis", icon=":material/code:"):
        st.caption("Paste into a page or slide deck: the figures and tables, without sidebar or controls.")
        st.code(hosting.embed_snippet(current_url() or f"saved-analyses?id={analysis.id}", analysis.title),
                language="html")
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
    allowed, why_not = hosting.may_save()
    if allowed and analysis.owner and analysis.owner == owner():  # only its saver deletes it
        with cols[2].popover("Delete"):
            st.write("Delete this analysis for everyone? This cannot be undone.")
            if st.button("Yes, delete", type="primary", key="confirm_delete"):
                if hosting.may_save()[0]:
                    store.delete(analysis.id, owner=owner())
                del st.query_params["id"]
                st.rerun()
    _back()


def gallery(store) -> None:
    st.title("Saved analyses")
    allowed, why_not = hosting.may_save()
    explain("Analyses saved from any panel's *Share, save and export* bar. Each opens by its own "
            "link (`?id=...`) without recomputing, for anyone with access to this server; add "
            "`&embed=true` to embed it." + ("" if allowed else f" {why_not}"))
    analyses = store.summaries(GALLERY_SIZE)
    own_talk.section(store, analyses)  # the talks saved here, and *Make a talk* from these analyses
    analyses = [a for a in analyses if a.panel != own_talk.PANEL]
    if not analyses:
        st.info("Nothing saved yet. Run a panel and use its *Save this analysis* form."
                if allowed else "Nothing saved yet.")
    elif len(analyses) == GALLERY_SIZE:
        st.caption(f"The newest {GALLERY_SIZE} of {store.count():,} saved analyses.")
    for a in analyses:
        with st.container(border=True):
            left, right = st.columns([5, 1])
            left.markdown(f"**{escape_markdown(a.title)}**")
            left.caption(_byline(a) + (f" — {escape_markdown(a.note[:120])}" if a.note else ""))
            if right.button("Open", key=f"open_{a.id}"):
                st.query_params["id"] = a.id
                st.rerun()

"""Share, save and export bar: one call at the bottom of any panel.

    share_bar("kv", title="KV eviction on shapes-lm", params=params, result=result,
              figures={"Retained tokens": fig}, tables={"policies": rows})

Gives the permalink (the page URL with its mirrored controls), the <iframe> snippet that embeds the
view (`?embed=true`: no sidebar, controls or share bar), downloads (JSON result, CSV per table,
self-contained HTML report) and a form that saves the analysis to the store (`analysis/hosting/store.py`:
SQLite, or PostgreSQL shared by several servers), to be reopened from the Saved analyses page without
recomputing. In an embed the bar is not drawn; on a read-only gallery, or for a signed-out visitor
where sign-in is on, the form says why it is not there.

A save records its owner (a hash of the visitor's id: only they may delete it) and a token made of who
saves which view with which title and note: pressing Save again after a lost confirmation returns the
same saved analysis instead of a copy. Saves count against `limits.saves_per_minute`.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any
from urllib.parse import quote, urlencode

import streamlit as st
from streamlit.errors import StreamlitAPIException

from analysis.hosting.export import ReportSection, html_report, result_json, rows_to_csv
from analysis.framework.results import to_jsonable
from analysis.hosting.store import RefusedAnalysis, SavedAnalysis, Store, open_store, store_location
from analysis.framework.uploads import owner_key
from components import hosting, limits
from analysis.hosting.export import HEADLINE, NOTES
from components.common import one_line, page_record
from components.hosting import escape_markdown  # noqa: F401  (pages import it from here)


@st.cache_resource(max_entries=4, show_spinner=False)
def _store_at(location: str) -> Store:
    return open_store(location)


def get_store() -> Store:
    """The store in force: $MODEL_INSPECTOR_STORE, the configuration's `store`, else
    .model_inspector/analyses.db (one per location and server process)."""
    return _store_at(store_location())


def current_url() -> str:
    """The URL of the current view (path + mirrored query params, URL-encoded)."""
    try:
        base = st.context.url or ""
    except Exception:  # AppTest has no browser URL
        base = ""
    query = urlencode(st.query_params.to_dict(), quote_via=quote, safe=":/,@")
    base = base.split("?")[0]
    return f"{base}?{query}" if query else base


def owner() -> str:
    """This visitor as the store records them (who may delete what they saved)."""
    return owner_key(hosting.visitor_id())


def save_token(who: str, panel: str, url: str, title: str, note: str, params: Any) -> str:
    """The same visitor saving the same view under the same title and note: one saved analysis."""
    text = json.dumps([who, panel, url, title, note, to_jsonable(params)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "analysis"


def share_bar(panel: str, *, title: str, params: dict, result: Any, model: str,
              figures: dict[str, Any] | None = None, tables: dict[str, list[dict]] | None = None,
              key: str | None = None) -> None:
    if hosting.is_embedded():  # an embed shows the view alone
        return
    figures = figures or {}
    shown = page_record()  # the headline numbers and notes drawn above this bar (then the next bar's are new)
    headline, notes = list(shown["metrics"]), list(shown["notes"])
    page_record(reset=True)
    tables = {**({HEADLINE: headline} if headline else {}), **(tables or {}),
              **({NOTES: [{"note": n} for n in notes]} if notes else {})}
    key = key or f"share_{panel}"
    slug = _slug(title)
    url = current_url()
    # Filled only while open: its link box (a syntax highlighter), download buttons and form cost every
    # page's browser 0.1-0.65 CPU s to draw, for a section most visitors never open (opening it reruns
    # the page: about 0.05 s, results being cached).
    bar = st.expander(":material/share: Share, save and export", key=f"{key}_open", on_change="rerun")
    if bar.open:
        with bar:
            _share_contents(panel, key, title, slug, url, params, result, model, figures, tables)
    _saved_notice(st.session_state.get(f"{key}_saved"), url)


def _share_contents(panel: str, key: str, title: str, slug: str, url: str, params: dict, result: Any,
                    model: str, figures: dict[str, Any], tables: dict[str, list[dict]]) -> None:
    st.caption("Link that reproduces this view (all controls are in the URL):")
    st.code(url or "(open in a browser to get the link)", language=None)
    if url:
        st.caption("Embed this view in a page or slide (no sidebar, controls or share bar):")
        st.code(hosting.embed_snippet(url, title), language="html")
    cols = st.columns(2 + len([n for n in tables if n not in (HEADLINE, NOTES)]))
    cols[0].download_button("JSON result", data=lambda: result_json(result), file_name=f"{slug}.json",
                            mime="application/json", key=f"{key}_json", on_click="ignore")

    def report() -> str:
        sections = [ReportSection(name, figure=fig) for name, fig in figures.items()]
        sections += [ReportSection(name, table=rows) for name, rows in tables.items() if name not in (HEADLINE, NOTES)]
        return html_report(title, sections, model=model, params=params, url=url, headline=tables.get(HEADLINE),
                           notes=[row["note"] for row in tables.get(NOTES, [])])

    cols[1].download_button("HTML report", data=report, file_name=f"{slug}.html", mime="text/html",
                            key=f"{key}_html", on_click="ignore")
    for col, (name, rows) in zip(cols[2:], [(n, r) for n, r in tables.items() if n not in (HEADLINE, NOTES)]):
        col.download_button(f"CSV: {name}", data=lambda rows=rows: rows_to_csv(rows),
                            file_name=f"{slug}-{_slug(name)}.csv", mime="text/csv",
                            key=f"{key}_csv_{_slug(name)}", on_click="ignore")
    allowed, why_not = hosting.may_save()
    if not allowed:
        st.caption(f":material/lock: {why_not}")
        return
    with st.form(f"{key}_save", clear_on_submit=False):
        st.markdown("**Save this analysis** (reopens from *Saved analyses* without recomputing)")
        save_title = st.text_input("Title", value=title, max_chars=200, key=f"{key}_title")
        note = st.text_area("Note", max_chars=5000, key=f"{key}_note")
        if st.form_submit_button("Save"):
            allowed, why_not = hosting.may_save()  # again: the visitor may have signed out in another tab
            if not allowed:
                st.session_state[f"{key}_saved"] = {"error": why_not, "url": url}
                return
            refused = limits.save_refusal()
            if refused:
                st.session_state[f"{key}_saved"] = {"error": refused, "url": url}
                return
            who = owner()
            analysis = SavedAnalysis(
                saved_by=hosting.signed_in_user(), owner=who,
                token=save_token(who, panel, url, save_title, note, params),
                title=save_title, note=note, panel=panel, model=model, params=to_jsonable(params),
                result=to_jsonable(result),
                figures=[{"name": n, "figure": f.to_plotly_json() if hasattr(f, "to_plotly_json") else f}
                         for n, f in figures.items()],
                tables=tables, url=url,
            )
            try:
                saved_id = get_store().save(analysis)
            except RefusedAnalysis as exc:  # a NUL character: refused alike by every store
                st.session_state[f"{key}_saved"] = {"error": str(exc), "url": url}
            except Exception as exc:  # disk full, read-only folder, a database gone ...
                st.session_state[f"{key}_saved"] = {"error": one_line(exc), "url": url}
            else:
                st.session_state[f"{key}_saved"] = {"id": saved_id, "title": save_title, "url": url}
                st.toast(f"Saved “{escape_markdown(save_title)}”.", icon=":material/bookmark_added:")


def _saved_notice(saved: dict | None, url: str) -> None:
    """Outside the expander (which closes when Save reruns the page), so the user sees the result."""
    if not saved or saved.get("url") != url:  # the view changed since: the notice is about another view
        return
    if "error" in saved:
        st.error(f"Could not save: {hosting.visible_markdown(saved['error'])}", icon=":material/error:")
        return
    c1, c2 = st.columns([4, 1], vertical_alignment="center")
    c1.success(f"Saved “{escape_markdown(saved['title'])}”. Open it any time at "
               f"`saved-analyses?id={saved['id']}`; embed it with `saved-analyses?id={saved['id']}&embed=true`.",
               icon=":material/bookmark_added:")
    try:
        c2.page_link("views/saved_analyses.py", label="Open saved analysis", icon=":material/bookmarks:",
                     query_params={"id": saved["id"]})
    except StreamlitAPIException:  # a page outside the app's navigation (tests, a bare script)
        c2.markdown(f"[Open saved analysis](saved-analyses?id={saved['id']})")

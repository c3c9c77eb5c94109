"""Make your own talk (#48): in the gallery a speaker picks saved analyses, orders them, writes a sentence for
each and a title, and saves the talk in the store (analysis/talks/own.py); `?talk=<its id>` presents it.

    section(store, analyses)   # the gallery (components/views/saved.py): the talks saved there and *Make a talk*
    present(talk, store)       # components/talk.py, when the link names no shipped talk but a saved one

A step shows the saved analysis as it was saved (its first figure enlarged, or its first table), nothing
recomputed. A step whose analysis this instance's gallery lacks says so on its screen, and every screen names
the missing steps; the others show as usual. Everything the speaker and the savers typed is escaped.
"""
from __future__ import annotations

from html import escape
from typing import Any

import plotly.graph_objects as go
import streamlit as st

from analysis.hosting.store import SavedAnalysis
from analysis.talks import TalkError
from analysis.talks.own import PANEL, SENTENCE_MAX, STEPS_MAX, TITLE_MAX, OwnStep, OwnTalk, check_own
from components import hosting
from components.hosting import escape_markdown

BUILD = "talk_build"  # the builder's widget keys start with it


# --- finding a saved talk and its steps -------------------------------------------------------------------


def find(store, talk_id: str) -> OwnTalk | None:
    """The saved talk of this id, or None (no such row, or a row that is not a talk)."""
    row = store.get(talk_id)
    if row is None or row.panel != PANEL:
        return None
    return OwnTalk.from_row(row.id, row.title, row.params)


def missing_line(k: int, step: OwnStep) -> str:
    """Which step is missing, in one line (Markdown, escaped)."""
    return (f"Step {k + 1} (“{escape_markdown(step.title or step.analysis)}”) is not on this instance: its saved "
            f"analysis `{escape_markdown(step.analysis)}` is not in this gallery.")


def analyses_of(talk: OwnTalk, store) -> list[SavedAnalysis | None]:
    """Each step's saved analysis on this instance, None where it is missing."""
    out = []
    for step in talk.steps:
        row = store.get(step.analysis)
        out.append(row if row is not None and row.panel != PANEL else None)
    return out


# --- presenting ---------------------------------------------------------------------------------------------


def present(talk: OwnTalk, store) -> None:
    """The saved talk one step per screen, as components/talk.py draws a shipped one."""
    from components import talk_screen as T

    k = T.step_index(talk)
    step, found = talk.steps[k], analyses_of(talk, store)
    st.caption(f"{escape_markdown(talk.title)} · step {k + 1} of {len(talk.steps)}")
    st.subheader(escape_markdown(step.title or "Untitled step"), anchor=False)
    missing = [missing_line(i, s) for i, (s, a) in enumerate(zip(talk.steps, found)) if a is None]
    if found[k] is None:
        st.error(f"This step cannot be shown. {missing_line(k, step)}", icon=":material/error:")
    else:
        draw(step, found[k])
    if missing and found[k] is not None:
        st.warning(" ".join(missing) + " The other steps are shown.", icon=":material/warning:")
    explore = f"/saved-analyses?id={step.analysis}"
    T.controls(len(talk.steps), k, explore)
    T.audience_copy(talk, k, lambda link: export_html(talk, store, link))


def _first_figure(analysis: SavedAnalysis) -> dict | None:
    return analysis.figures[0]["figure"] if analysis.figures else None


def draw(step: OwnStep, analysis: SavedAnalysis) -> None:
    st.html(f'<p class="talk-narration" data-testid="talk-narration">{escape(step.sentence)}</p>')
    figure = _first_figure(analysis)
    if figure is not None:
        fig = go.Figure(figure)
        fig.update_layout(height=360, margin=dict(l=10, r=10, t=40, b=10))
        st.plotly_chart(fig, key=f"own_talk_fig_{step.analysis}")
    elif analysis.tables:
        name, rows = next(iter(analysis.tables.items()))
        st.markdown(f"**{escape_markdown(name)}**")
        st.dataframe(rows, hide_index=True)
    with st.expander("The saved analysis"):
        st.markdown(f"**{escape_markdown(analysis.title)}** · {escape_markdown(analysis.panel)} · "
                    f"{escape_markdown(analysis.model)}")
        if analysis.note:
            st.markdown(escape_markdown(analysis.note))
        for item in analysis.figures[1:]:
            st.plotly_chart(go.Figure(item["figure"]), key=f"own_talk_more_{step.analysis}_{item['name']}")
        for name, rows in list(analysis.tables.items())[0 if figure is not None else 1:]:
            st.markdown(f"**{escape_markdown(name)}**")
            st.dataframe(rows, hide_index=True)


def export_html(talk: OwnTalk, store, link: str = "") -> str:
    """The talk as one offline HTML file: each step's sentence, its first figure and table, the note folded."""
    from analysis.hosting.export import ReportSection, html_report

    sections = []
    for k, (step, analysis) in enumerate(zip(talk.steps, analyses_of(talk, store))):
        heading = f"{k + 1}. {step.title or 'Untitled step'}"
        if analysis is None:
            sections.append(ReportSection(heading, f"{step.sentence} This step cannot be shown: its saved analysis "
                                                   f"'{step.analysis}' is not in this gallery."))
            continue
        table = next(iter(analysis.tables.values()), [])
        sections.append(ReportSection(heading, step.sentence, figure=_first_figure(analysis), table=table,
                                      detail=analysis.note))
    return html_report(talk.title, sections, url=link)


# --- the gallery: the saved talks and the builder --------------------------------------------------------


def section(store, analyses: list[SavedAnalysis]) -> None:
    """The talks among `analyses` (each with its link), then *Make a talk* from the others."""
    talks = [a for a in analyses if a.panel == PANEL]
    if talks:
        st.subheader("Talks", anchor=False)
        for a in talks:
            row = st.container(horizontal=True, vertical_alignment="center")
            row.markdown(f"**{escape_markdown(a.title)}**" + (f" · by {escape_markdown(a.saved_by)}"
                                                              if a.saved_by else ""))
            row.link_button("Present", f"/?talk={a.id}", icon=":material/slideshow:")
            row.link_button("Details", f"/saved-analyses?id={a.id}", icon=":material/info:")  # its owner deletes it there
    builder(store, [a for a in analyses if a.panel != PANEL])


def _label(a: SavedAnalysis) -> str:
    return f"{a.title} · {a.panel} · {a.model}"


def _move(k: int, by: int) -> None:
    picked = list(st.session_state.get(f"{BUILD}_steps", []))
    if 0 <= k + by < len(picked):
        picked[k], picked[k + by] = picked[k + by], picked[k]
        st.session_state[f"{BUILD}_steps"] = picked


def builder(store, analyses: list[SavedAnalysis]) -> None:
    """Pick saved analyses, order them, a sentence each and a title; Save puts the talk in the store."""
    allowed, why_not = hosting.may_save()
    choices = {a.id: a for a in analyses}
    with st.expander("Make a talk from saved analyses", icon=":material/slideshow:",
                     expanded=bool(st.session_state.get(f"{BUILD}_steps"))):
        if not allowed:
            st.caption(f":material/lock: {why_not}")
            return
        if not choices:
            st.caption("Save analyses from the panels first: a talk is made of them.")
            return
        st.text_input("Title of the talk", max_chars=TITLE_MAX, key=f"{BUILD}_title")
        st.multiselect("Saved analyses, in the order of the talk", list(choices), key=f"{BUILD}_steps",
                       format_func=lambda i: _label(choices[i]), max_selections=STEPS_MAX)
        picked = [i for i in st.session_state.get(f"{BUILD}_steps", []) if i in choices]
        for k, analysis_id in enumerate(picked):
            row = st.container(horizontal=True, vertical_alignment="bottom")
            row.text_input(f"Step {k + 1}: {escape_markdown(choices[analysis_id].title)}", max_chars=SENTENCE_MAX,
                           key=f"{BUILD}_sentence_{analysis_id}", placeholder="One sentence the room hears")
            row.button("", icon=":material/arrow_upward:", key=f"{BUILD}_up_{analysis_id}", disabled=k == 0,
                       on_click=_move, args=(k, -1), help="Earlier in the talk")
            row.button("", icon=":material/arrow_downward:", key=f"{BUILD}_down_{analysis_id}",
                       disabled=k == len(picked) - 1, on_click=_move, args=(k, 1), help="Later in the talk")
        if st.button("Save the talk", type="primary", key=f"{BUILD}_save", disabled=not picked):
            _save(store, choices, picked)
    _notice()


def _save(store, choices: dict[str, SavedAnalysis], picked: list[str]) -> None:
    from components import limits
    from components.share import owner, save_token

    steps = tuple(OwnStep(i, choices[i].title, st.session_state.get(f"{BUILD}_sentence_{i}", "")) for i in picked)
    try:
        talk = check_own(OwnTalk(st.session_state.get(f"{BUILD}_title", ""), steps))
    except TalkError as exc:
        st.session_state[f"{BUILD}_saved"] = {"error": str(exc)}
        return
    allowed, why_not = hosting.may_save()  # again: the visitor may have signed out in another tab
    refused = why_not if not allowed else limits.save_refusal()
    if refused:
        st.session_state[f"{BUILD}_saved"] = {"error": refused}
        return
    who = owner()
    models = sorted({choices[i].model for i in picked if choices[i].model})
    try:
        talk_id = store.save(SavedAnalysis(
            title=talk.title, panel=PANEL, model=", ".join(models)[:200], params=talk.params(), owner=who,
            saved_by=hosting.signed_in_user(), token=save_token(who, PANEL, "", talk.title, "", talk.params())))
    except Exception as exc:  # disk full, a database gone, a NUL character ...
        from components.common import one_line

        st.session_state[f"{BUILD}_saved"] = {"error": one_line(exc)}
        return
    st.session_state[f"{BUILD}_saved"] = {"id": talk_id, "title": talk.title}


def _notice() -> None:
    saved: dict[str, Any] | None = st.session_state.get(f"{BUILD}_saved")
    if not saved:
        return
    if "error" in saved:
        st.error(f"The talk was not saved: {hosting.visible_markdown(saved['error'])}", icon=":material/error:")
        return
    st.success(f"Saved the talk “{escape_markdown(saved['title'])}”. Present it at `?talk={saved['id']}`.",
               icon=":material/slideshow:")
    st.link_button("Present it", f"/?talk={saved['id']}", icon=":material/slideshow:")

"""The talk's screen, shared by the talks shipped with the app (components/talk.py) and the ones speakers make
in the gallery (components/own_talk.py): which talk and step the link names, the style that hides the sidebar
and enlarges the number, Previous / Next, and the audience's copy (the read-only link, its QR code, the HTML).

    ?talk=NAME&step=K     # K from 1; NAME a shipped talk's name or a saved talk's id
"""
from __future__ import annotations

from typing import Any, Callable

import streamlit as st

TALK_KEY, STEP_KEY = "talk", "step"  # ?talk=NAME&step=K (K from 1)
STYLE = """<style>
section[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], header[data-testid="stHeader"]
  {display: none !important;}
.block-container {padding-top: 1.2rem !important; max-width: 1000px;}
.talk-number {font-size: 4.2rem; font-weight: 700; line-height: 1.05; margin: 0.4rem 0 0.2rem 0;}
.talk-label {font-size: 1.05rem; opacity: 0.8;}
.talk-narration {font-size: 1.45rem; line-height: 1.35; margin: 0.2rem 0 0.6rem 0;}
</style>"""


def requested() -> str | None:
    """The talk a link names (?talk=NAME), or None."""
    name = st.query_params.get(TALK_KEY)
    return name if isinstance(name, str) else None


def step_index(talk: Any) -> int:
    """The link's step (from 1), clamped into the talk; 0-based."""
    try:
        k = int(st.query_params.get(STEP_KEY, "1"))
    except ValueError:
        k = 1
    return min(max(k, 1), len(talk.steps)) - 1


def _go(k: int) -> None:
    st.query_params[STEP_KEY] = str(k + 1)


def controls(n: int, k: int, explore: str) -> None:
    """Previous / Next (Left and Right keys), the step number of `n`, and the step's full page."""
    row = st.container(horizontal=True, vertical_alignment="center", gap="small")
    row.button("Previous", icon=":material/arrow_back:", key="talk_prev", shortcut="Left", disabled=k == 0,
               on_click=_go, args=(k - 1,))
    row.markdown(f"**{k + 1} / {n}**", width="content")
    row.button("Next", icon=":material/arrow_forward:", key="talk_next", shortcut="Right",
               disabled=k == n - 1, on_click=_go, args=(k + 1,))
    row.link_button("Explore this", explore, icon=":material/open_in_new:")


def audience_link(talk: Any) -> str:
    """The talk's read-only link on this instance: the presentation itself (no control, nothing computed)."""
    try:
        base = (st.context.url or "").split("?")[0]
    except Exception:  # AppTest and scripts have no browser URL
        base = ""
    base = base.rstrip("/").removesuffix("/talk")
    return f"{base}/?{TALK_KEY}={talk.name}"


def qr_png(text: str) -> bytes:
    """A QR code of `text` as PNG bytes (segno, pinned in requirements.txt)."""
    import io

    import segno

    buf = io.BytesIO()
    segno.make_qr(text, error="m").save(buf, kind="png", scale=6, border=2)  # never a Micro QR: phones skip those
    return buf.getvalue()


def audience_copy(talk: Any, k: int, export: Callable[[str], str]) -> None:
    """On the first and last step: the read-only link as a QR code, and the talk as one HTML file
    (`export(link)`; `talk` has a `name`, the link's, and its `steps`)."""
    if k not in (0, len(talk.steps) - 1):
        return
    link = audience_link(talk)
    with st.container(horizontal=True, vertical_alignment="center", gap="medium"):
        st.image(qr_png(link), width=130, caption="This talk on your phone")
        with st.container():
            st.code(link, language=None, wrap_lines=True)
            st.download_button("Take the talk home (one HTML file, works offline)", lambda: export(link),
                               file_name=f"talk-{talk.name}.html", mime="text/html", key="talk_export",
                               icon=":material/download:", on_click="ignore")

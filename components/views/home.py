"""The home page: what is loaded, what each panel does, and a tour of the presets for live talks (each a
permalink `<panel>?preset=<name>`, from the panels' own ANALYSIS.presets)."""
from __future__ import annotations

import streamlit as st

from analysis import talks
from analysis.framework import presets as P
from components.hosting import escape_markdown
from components.model_picker import current_handle
from components.registry import panel_pages


def render() -> None:
    st.title("Model Inspector")
    st.write(
        "Load a transformer in the sidebar and look inside it. Five panels each reproduce a 2025 "
        "interpretability paper on the model you load, and Residual stream gives the tools researchers reach for "
        "first (lenses, patching, logit attribution); the demo zoo (Shapes World) works offline "
        "and knows the ground truth, so every panel can also show whether its analysis is right."
    )

    handle = current_handle()
    if handle is None:
        st.info("No model is loaded yet: pick one in the sidebar.")
    else:
        st.subheader(f"Loaded model: {handle.spec.label}")
        st.table({"property": [r[0] for r in handle.info.rows()], "value": [r[1] for r in handle.info.rows()]})

    panels = panel_pages()

    st.subheader("Panels")
    for panel in panels:
        if not panel.available:
            continue
        with st.container(border=True):
            st.page_link(panel.script, label=f"**{panel.title}**", icon=panel.icon)
            works_on = ", ".join({"causal_lm": "language models", "vlm": "vision-language models"}[k]
                                 for k in panel.kinds)
            paper = f" Reproduces *{panel.paper}*; works on {works_on}." if panel.paper else ""
            st.caption(panel.summary + paper)
    missing = [p.title for p in panels if not p.path.is_file()]  # not hidden ones (the configuration's panels.hidden)
    if missing:
        st.caption("Coming next: " + ", ".join(missing) + ".")

    st.subheader("Tour: one finding per click")
    st.markdown("**Give a talk**: " + " · ".join(f"[{escape_markdown(t.title)}](/?talk={t.name})"
                                                 for t in talks.all_talks())
                + " (one finding per screen; make your own from *Saved analyses*).")
    st.caption("Presets for live talks. Each link opens a panel with every control (and the demo model) set to "
               "show one finding of its paper; the link is also the permalink. On a panel, the same presets are "
               "the buttons at the top.")
    for panel in panels:
        presets = P.for_panel(panel.url_path)
        if not panel.available or not presets:
            continue
        with st.container(border=True):
            st.markdown(f"{panel.title} · *{panel.paper}*" if panel.paper else panel.title)
            for preset in presets:
                # the finding under its link, not beside it: a title in a side column is cut at 1024 px
                with st.container(gap=None):
                    st.page_link(panel.script, label=preset.title, icon=":material/slideshow:",
                                 query_params=preset.query())
                    st.caption(preset.finding)

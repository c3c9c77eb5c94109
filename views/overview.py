"""Home: what is loaded, and what each panel does."""
from __future__ import annotations

import streamlit as st

from components.model_picker import current_handle
from components.registry import PANELS

st.title("Model Inspector")
st.write(
    "Load a transformer in the sidebar and look inside it. Each panel reproduces a 2025 "
    "interpretability paper on the model you load; the demo zoo (Shapes World) works offline "
    "and knows the ground truth, so every panel can also show whether its analysis is right."
)

handle = current_handle()
if handle is None:
    st.info("No model is loaded yet: pick one in the sidebar.")
else:
    st.subheader(f"Loaded model: {handle.spec.label}")
    st.table({"property": [r[0] for r in handle.info.rows()], "value": [r[1] for r in handle.info.rows()]})

st.subheader("Panels")
for panel in PANELS:
    if not panel.available:
        continue
    with st.container(border=True):
        st.page_link(f"views/{panel.page}", label=f"**{panel.title}**", icon=panel.icon)
        works_on = ", ".join({"causal_lm": "language models", "vlm": "vision-language models"}[k]
                             for k in panel.kinds)
        paper = f" Reproduces *{panel.paper}*; works on {works_on}." if panel.paper else ""
        st.caption(panel.summary + paper)
missing = [p.title for p in PANELS if not p.available]
if missing:
    st.caption("Coming next: " + ", ".join(missing) + ".")

"""Model Inspector: entry point (page config, model picker, navigation)."""
from __future__ import annotations

import streamlit as st

import components.preload  # noqa: F401  (first: loads every heavy module once, before any page imports it)
from components.favicon import favicon
from components.model_picker import render_sidebar
from components.registry import panel_pages

st.set_page_config(page_title="Model Inspector", page_icon=favicon(), layout="wide")

pages = [st.Page("views/overview.py", title="Home", icon=":material/home:", url_path="home", default=True)]
pages += [st.Page(p.script, title=p.title, icon=p.icon, url_path=p.url_path)
          for p in panel_pages() if p.available]
render_sidebar()
nav = st.navigation(pages)
nav.run()

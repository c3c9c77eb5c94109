"""Model Inspector: entry point (page config, sign-in, model picker, navigation)."""
from __future__ import annotations

import streamlit as st

import components.preload  # noqa: F401  (first: loads every heavy module once, before any page imports it)
from components import hosting
from components.favicon import favicon
from components.model_picker import render_sidebar
from components.narrow_sidebar import fold_sidebar_when_narrow
from components.registry import panel_pages
from components.talk import requested as talk_requested

st.set_page_config(page_title="Model Inspector", page_icon=favicon(), layout="wide")
hosting.sign_in_gate()  # the deployment's sign-in (docs/deploy.md); a no-op for a local run
embedded = hosting.is_embedded()  # ?embed=true: the view alone, for an iframe

pages = [st.Page("views/overview.py", title="Home", icon=":material/home:", url_path="home", default=True)]
pages += [st.Page(p.script, title=p.title, icon=p.icon, url_path=p.url_path)
          for p in panel_pages() if p.available]  # available: the page exists and the configuration shows it
pages += [st.Page("views/glossary.py", title="Glossary", icon=":material/menu_book:", url_path="glossary")]
talking = talk_requested() is not None  # ?talk=NAME: the talk alone, one step per screen (components/talk.py)
if talking:
    pages = [st.Page("views/talk.py", title="Talk", icon=":material/slideshow:", url_path="talk", default=True)]
elif embedded:
    hosting.embed_page()
else:
    render_sidebar()
    fold_sidebar_when_narrow()  # folded under 1100 px (a 1024-px projector), open when wider
nav = st.navigation(pages, position="hidden" if embedded or talking else "sidebar")
nav.run()

"""The sidebar starts folded on a window narrower than NARROW_PX (a 1024-px projector), open on a wider one.

Streamlit's `initial_sidebar_state` is one value per page config and its "auto" folds the sidebar only at phone
widths (768 px); the server never learns the window's width. So the page sends a few lines of JavaScript: on
the first script run of a browser tab, when the window is narrower than NARROW_PX and the visitor has never
opened or closed the sidebar here (Streamlit keeps that choice in localStorage, `stSidebarCollapsed-...`), it
presses the sidebar's own collapse button once and forgets that press (so a wider window later still opens it).
The sidebar's chevron opens it again; what the visitor chooses then is kept by Streamlit as usual.
"""
from __future__ import annotations

import streamlit as st

NARROW_PX = 1100  # at 1024 px the open sidebar took 29 % of the width (issue #47)

FOLD_JS = """<script>
(() => {
  if (window.__sidebarFoldChecked) return;  // once per tab: never fights the visitor's own clicks
  window.__sidebarFoldChecked = true;
  const KEY = 'stSidebarCollapsed-';
  const stored = () => Object.keys(window.localStorage).filter(k => k.startsWith(KEY));
  if (window.innerWidth >= %(narrow)d || stored().length) return;
  let tries = 0;
  const fold = () => {
    const sidebar = document.querySelector("[data-testid='stSidebar']");
    const button = document.querySelector("[data-testid='stSidebarCollapseButton'] button");
    if (sidebar && button) {
      if (sidebar.getAttribute('data-collapsed') !== 'true') button.click();
      stored().forEach(k => window.localStorage.removeItem(k));  // our press is not the visitor's choice
    } else if (++tries < 100) {
      setTimeout(fold, 50);
    }
  };
  fold();
})();
</script>""" % {"narrow": NARROW_PX}


def fold_sidebar_when_narrow() -> None:
    """Send the folding script with the sidebar (it runs in the page, once per tab)."""
    st.sidebar.html(FOLD_JS, unsafe_allow_javascript=True)

"""Small UI helpers every page uses: model gate, progress adapter, URL-mirrored params, notes."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import streamlit as st

from analysis.models import KIND_NAMES, ModelHandle
from components.model_picker import current_handle


def require_model(*kinds: str, panel: str) -> ModelHandle:
    """The session's model if it is of an accepted kind; otherwise explain and stop the page."""
    handle = current_handle()
    if handle is None:
        st.info("Load a model in the sidebar to use this panel.")
        st.stop()
    if kinds and handle.kind not in kinds:
        wanted = " or ".join(KIND_NAMES[k] for k in kinds)
        st.error(f"The {panel} panel needs {wanted}; {handle.spec.label} is "
                 f"{KIND_NAMES.get(handle.kind, handle.kind)}. Pick another model in the sidebar.")
        st.stop()
    return handle


def explain(text: str) -> None:
    """The short 'what am I looking at' note under a view."""
    st.caption(f":material/info: **What am I looking at?** {text}")


@contextlib.contextmanager
def progress(label: str) -> Iterator[Callable[[float, str], None]]:
    """A `progress(fraction, message)` callback drawing an `st.progress` bar, removed when done."""
    bar = st.progress(0.0, text=label)

    def update(fraction: float, message: str = "") -> None:
        bar.progress(min(max(float(fraction), 0.0), 1.0), text=f"{label} {message}".strip())

    try:
        yield update
    finally:
        bar.empty()


def url_param(name: str, default: Any, cast: Callable[[str], Any] | None = None,
              choices: list | None = None) -> Any:
    """Read a control's initial value from the URL, falling back to `default` when absent or bad."""
    raw = st.query_params.get(name)
    if raw is None:
        return default
    try:
        value = (cast or type(default))(raw) if default is not None or cast else raw
    except (TypeError, ValueError):
        return default
    if choices is not None and value not in choices:
        return default
    return value


def set_url_params(**values: Any) -> None:
    """Mirror the page's controls into the URL so the link reproduces the view."""
    for key, value in values.items():
        text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        if st.query_params.get(key) != text:
            st.query_params[key] = text

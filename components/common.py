"""Small UI helpers every page uses: model gate, progress adapter, URL writing, error messages, notes."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import streamlit as st

from analysis.framework.errors import UserError
from analysis.model_access.models import DEMO_MODELS, KIND_NAMES, ModelHandle, ModelSpec, zoo_models
from components import hosting
from components.model_picker import current_handle, try_load


def require_model(*kinds: str, panel: str) -> ModelHandle:
    """The session's model if it is of an accepted kind; otherwise explain and stop the page."""
    handle = current_handle()
    if handle is None:
        st.info("Load a model in the sidebar to use this panel.")
        st.stop()
    if kinds and handle.kind not in kinds:
        wanted = " or ".join(KIND_NAMES[k] for k in kinds)
        demo = demo_model(*kinds)
        st.error(f"The {panel} panel needs {wanted}; {handle.spec.label} is "
                 f"{KIND_NAMES.get(handle.kind, handle.kind)}. Pick another model in the sidebar"
                 + (f", or use the demo model {demo.label}." if demo else "."))
        if demo is not None and st.button(f"Use {demo.label}", key="require_model_demo", type="primary"):
            if try_load(demo) is not None:
                st.rerun()
        st.stop()
    return handle


def stays_local(handle: ModelHandle, panel: str) -> None:
    """Stop the page with one line when `panel` cannot run on this (remote, NDIF) model."""
    from analysis import backends

    message = backends.local_only(handle, panel)
    if message:
        st.info(message, icon=":material/cloud_off:")
        st.stop()


def demo_model(*kinds: str) -> ModelSpec | None:
    """The demo zoo's model of the first of `kinds` that is here and that this deployment allows."""
    for kind in kinds:
        name = DEMO_MODELS.get(kind)
        if name and name in zoo_models() and not hosting.settings().model_refusal("zoo", name):
            return ModelSpec("zoo", name)
    return None


RECORD_KEY = "_share_record"  # what this page showed since its last share bar: metric cards and notes


def page_record(reset: bool = False) -> dict[str, list]:
    """The metric cards and "What am I looking at?" notes drawn since the page started or its last share bar
    took them (components/share.py: the HTML report and the saved snapshot carry them)."""
    if reset or RECORD_KEY not in st.session_state:
        st.session_state[RECORD_KEY] = {"metrics": [], "notes": []}
    return st.session_state[RECORD_KEY]


def _is_change(delta: Any) -> bool:
    """A delta an arrow suits: a number other than zero (not a zero change, not words under the value)."""
    try:
        return float(str(delta).replace("−", "-").split()[0].rstrip("%")) != 0
    except (ValueError, IndexError):
        return False


class _MetricRow:
    """A metric row that also records each card (label, value, delta) for the share bar."""

    def __init__(self, row: Any) -> None:
        self._row = row

    def metric(self, label: str, value: Any, delta: Any = None, **kwargs: Any) -> Any:
        page_record()["metrics"].append({"metric": str(label), "value": str(value),
                                         **({"change": str(delta)} if delta is not None else {})})
        if delta is not None and "delta_arrow" not in kwargs and not _is_change(delta):
            kwargs |= {"delta_arrow": "off", "delta_color": "off"}  # "↑ 0.000", "↑ max |difference|" mean nothing
        return self._row.metric(label, value, delta, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._row, name)

    def __enter__(self) -> Any:
        return self._row.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._row.__exit__(*exc)


def metric_row() -> Any:
    """A row for `st.metric` cards that wraps whole cards onto the next line when the page is narrow
    (a 1024-px projector) rather than cutting their labels and values to an ellipsis, as equal columns do.
    Its cards are recorded for the share bar's report and snapshot."""
    return _MetricRow(st.container(horizontal=True, wrap=True, gap="medium"))


def field_row(gap: str = "small") -> Any:
    """A row for fixed-width input widgets that wraps whole fields onto the next line when the page is
    narrow, inputs aligned at the bottom (equal columns squeeze them: empty select boxes, labels broken
    mid-word at 1024 px)."""
    return st.container(horizontal=True, wrap=True, vertical_alignment="bottom", gap=gap)


def charts_side_by_side(*charts: tuple[Any, str], width: int = 440) -> None:
    """Plotly figures (figure, key) of `width` px side by side, one under the other when the page is too
    narrow for them (two half columns squeeze each to ~260 px at 1024, cutting titles and legends)."""
    row = st.container(horizontal=True, wrap=True, gap="medium")
    for figure, key in charts:
        row.plotly_chart(figure, key=key, width=width)


def table(rows: Any, *, pinned: int = 1, where: Any = None, column_config: dict | None = None, **kwargs: Any) -> None:
    """A table that fits its box or scrolls inside it with its first `pinned` columns fixed, so a reader at
    1024 px sees which row a far-right value belongs to (a plain `st.dataframe` wider than its box scrolls with
    no visible sign: its right columns looked cut off). `rows`: a list of dicts (or a frame); the rest is
    `st.dataframe`'s."""
    where = where if where is not None else st
    names = list(rows[0]) if isinstance(rows, list) and rows else list(getattr(rows, "columns", []))
    config = dict(column_config or {})
    for name in names[:pinned]:
        config[name] = {**(config.get(name) or {}), "pinned": True}
    where.dataframe(rows, hide_index=True, column_config=config, **kwargs)


def explain(text: str) -> None:
    """The short 'what am I looking at' note under a view (recorded for the share bar's report and snapshot)."""
    page_record()["notes"].append(text)
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


URL_TEXT_MAX = 2000  # longest text a link may carry into a control (components/params_form.url_value reads links)


# Errors whose message is meant for the user: every panel's error is one (analysis/framework/errors.py).
USER_ERRORS: tuple[type[BaseException], ...] = (UserError,)


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type when it has none), at most 400 characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 400 else text[:399] + "…"


def show_error(exc: BaseException, prefix: str = "") -> None:
    """An error as one line: its message is shown as plain text (it may carry what a link or a visitor typed:
    no Markdown, links or images of theirs), and on a public instance without operator instructions or
    server paths (hosting.visible). `prefix` is the page's own words."""
    st.error(f"{prefix}{hosting.visible_markdown(one_line(exc))}", icon=":material/error:")


@contextlib.contextmanager
def analysis_errors(*kinds: type[BaseException], prefix: str = "", stop: bool = True) -> Iterator[None]:
    """Turn an analysis error into one `st.error` line (no traceback) and, by default, stop the page.

        with analysis_errors():
            result = cached_run(...)
    """
    try:
        yield
    except USER_ERRORS + kinds as exc:
        show_error(exc, prefix)
        if stop:
            st.stop()


def set_url_params(**values: Any) -> None:
    """Mirror the page's controls into the URL so the link reproduces the view."""
    for key, value in values.items():
        text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        if st.query_params.get(key) != text:
            st.query_params[key] = text

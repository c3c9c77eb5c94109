"""The preset bar at the top of a panel: one click sets every control (and the model) to a preset.

    preset_bar("kv-cache", widget_prefix="kv_")   # before require_model(), so a preset may switch model

A preset is applied by writing its values into the URL (so the URL is its permalink), forgetting the
page's remembered widget values (widgets then start from the URL) and rerunning. A link with `?preset=name`
fills in every control the link does not set itself; explicit values in the link win.
"""
from __future__ import annotations

import streamlit as st

from analysis.framework import presets as P
from analysis.model_access.models import ModelSpec
from components.model_picker import STATE_KEY, try_load

SEEN_KEY = "_presets_seen"  # presets this session already switched the model for


def _switch_model(preset: P.Preset) -> bool:
    """Load the preset's model if another one is loaded; True when it changed."""
    current = st.session_state.get(STATE_KEY)
    if current is not None and current.label == preset.model:
        return False
    if try_load(ModelSpec.parse(preset.model)) is None:
        return False
    for key in ("picker_source", "picker_zoo"):  # the sidebar's widgets follow the new model
        st.session_state.pop(key, None)
    return True


def _forget_widgets(prefix: str) -> None:
    for key in [k for k in st.session_state if isinstance(k, str) and k.startswith(prefix)]:
        del st.session_state[key]


def apply(preset: P.Preset, widget_prefix: str) -> None:
    """Make the URL the preset's permalink, reset the page's widgets to it, and rerun."""
    query = preset.query()
    st.query_params.clear()
    st.query_params.update(query)
    _forget_widgets(widget_prefix)
    _switch_model(preset)
    st.session_state.setdefault(SEEN_KEY, set()).add((preset.panel, preset.name))
    st.rerun()


def _from_url(panel: str) -> P.Preset | None:
    """A `?preset=name` link: fill in the controls the link leaves out; switch model once per session."""
    name = st.query_params.get("preset")
    preset = P.get(panel, name) if isinstance(name, str) else None
    if preset is None:
        if name is not None:
            del st.query_params["preset"]  # unknown or another panel's: drop it, keep the rest of the link
        return None
    for key, value in preset.values().items():
        if key not in st.query_params:
            st.query_params[key] = value
    seen = st.session_state.setdefault(SEEN_KEY, set())
    if (panel, preset.name) not in seen:
        seen.add((panel, preset.name))
        if _switch_model(preset):
            st.rerun()
    return preset


def active(panel: str) -> P.Preset | None:
    """The preset whose every value the URL holds right now (None once the user changed a control)."""
    preset = P.get(panel, st.query_params.get("preset") or "")
    if preset is None:
        return None
    values = {"model": preset.model, **preset.values()}
    return preset if all(st.query_params.get(k) == v for k, v in values.items()) else None


def preset_bar(panel: str, widget_prefix: str, banner=None) -> P.Preset | None:
    """Buttons for the panel's presets, and a line saying what the active one shows (in `banner`, a
    container above the page's headline, when given)."""
    presets = P.for_panel(panel)
    if not presets:
        return None
    linked = _from_url(panel)
    current = active(panel)
    if linked is not None and current is None and st.query_params.get("preset"):
        del st.query_params["preset"]  # the user moved a control away from the preset
    # one wrapping row of buttons as wide as their titles: equal columns cut four titles to "How many fe..."
    row = st.container(horizontal=True, wrap=True, vertical_alignment="center", gap="small")
    row.markdown(":material/slideshow: **Presets**", width="content")
    for preset in presets:
        chosen = current is not None and current.name == preset.name
        if row.button(preset.title, key=f"preset_{panel}_{preset.name}", help=preset.finding,
                      type="primary" if chosen else "secondary", width="content"):
            apply(preset, widget_prefix)
    if current is not None:
        (banner or st).info(f"**{current.title}.** {current.finding}", icon=":material/slideshow:")
    return current

"""The preset bar at the top of a panel: one click sets every control (and the model) to a preset.

    preset_bar("kv-cache", widget_prefix="kv_")   # before require_model(), so a preset may switch model

A preset is applied by writing its values into the URL (so the URL is its permalink), forgetting the
page's remembered widget values (widgets then start from the URL) and rerunning. A link with `?preset=name`
fills in every control the link does not set itself; explicit values in the link win.

The bar also settles which model the page shows (`settle_model`): a preset's model, or the demo model of a
panel the visitor's model cannot show (another kind, or SAE-V with no SAE), stands in for the visitor's
own model (components/model_picker.py: `borrowed`) with one line saying why; on another panel the
visitor's model comes back, and the page says so. The sidebar's picker follows every switch.
"""
from __future__ import annotations

import streamlit as st

from analysis.framework import panels
from analysis.framework import presets as P
from analysis.model_access.models import ModelSpec
from components import hosting
from components.common import page_record
from components.model_picker import LOADED_BY_PICKER, STATE_KEY, borrowed, chosen, current_handle, try_load
from components.registry import opens_on

SEEN_KEY = "_presets_seen"  # presets this session already switched the model for
NOTE_KEY = "_model_note"  # what the last switch did, shown once on the page it led to
KEPT_KEY = "_model_kept"  # (panel, model) the visitor loaded on that panel themselves: it is not replaced there


def _switch_model(preset: P.Preset) -> bool:
    """Load the preset's model if another one is loaded; True when it changed. The visitor's own model is
    remembered (the sidebar's picker shows the preset's while it is loaded, and says whose it is)."""
    current = st.session_state.get(STATE_KEY)
    if current is not None and current.label == preset.model:
        return False
    return try_load(ModelSpec.parse(preset.model), borrowed=(preset.panel, f'Loaded for the preset "{preset.title}"')) \
        is not None


def settle_model(panel: str) -> None:
    """Before the page's model gate: give the visitor's model back on a panel other than the one that borrowed
    another in its place, or put the panel's demo model in place of one it cannot show. Reruns after a switch
    (the sidebar above was drawn with the old model)."""
    analysis = next((a for a in panels.analyses() if a.url_path == panel), None)
    if analysis is None:
        return
    kept = st.session_state.setdefault(KEPT_KEY, set())
    picked = st.session_state.pop(LOADED_BY_PICKER, None)
    if picked is not None:  # the visitor loaded it on this page: keep it here, and say what it can show
        kept.add((panel, picked))
    lent, own = borrowed(), chosen()
    if lent is not None and lent[0] != panel and own is not None and own != st.session_state.get(STATE_KEY):
        was = st.session_state.get(STATE_KEY)
        if try_load(own) is not None:
            st.session_state[NOTE_KEY] = (f"Back on your model, {own.label} ({was.label} was loaded for another "
                                          "page).")
            st.rerun()
    handle = current_handle()
    if handle is None or (panel, handle.spec) in kept:
        return
    if analysis.name == "sae" and st.query_params.get("sae"):  # a link naming an SAE (an outside one: checked
        return  # against this model on the page) has something to show here; the demo model would misread it
    instead = opens_on(analysis, handle)
    if instead is not None:
        demo, why = instead
        if try_load(demo, borrowed=(panel, f"Loaded for {analysis.title}: {why}")) is not None:
            st.session_state[NOTE_KEY] = (f"Showing {demo.label}'s example: {analysis.title} cannot show "
                                          f"{handle.spec.label} ({why}). Your model comes back on the other "
                                          "pages; to stay on it here, load it in the sidebar.")
            st.rerun()


def _note() -> None:
    note = st.session_state.pop(NOTE_KEY, None)
    if note:
        st.info(hosting.escape_markdown(note), icon=":material/swap_horiz:")


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
    container above the page's headline, when given), after settling the page's model: a link's preset,
    the visitor's own model back, or the panel's demo model."""
    page_record(reset=True)  # the page starts: its share bars carry what it draws from here on
    presets = P.for_panel(panel)
    linked = _from_url(panel) if presets else None
    if linked is None:
        settle_model(panel)
    _note()
    if not presets:
        return None
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

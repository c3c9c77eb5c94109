"""Sidebar model picker: demo zoo (default), Hugging Face Hub id, or a local folder.

The loaded model lives in `st.cache_resource` (bounded), keyed on its spec; the session only keeps
the spec. A failed load shows `st.error` and leaves the previous model in place.

The deployment configuration (`analysis/framework/config.py`) decides which sources the picker offers, which
Hub ids (a list to pick from instead of a free box) and which default model a visitor gets. A spec
it does not allow (a shared link's `?model=hub:...`, a local path) is refused here, before the loader
is called: the visitor is told so and gets the default; nothing is read or downloaded.

Remote models: with `[backend] kind = "ndif"` the picker adds an "NDIF (remote)" source listing
`[backend] remote_models`; such a model's config and tokenizer load here, its weights stay on NDIF
(analysis/backends/ndif.py), and the sidebar says where it runs.
"""
from __future__ import annotations

import streamlit as st

from analysis import backends
from analysis.backends import ndif
from analysis.model_access.models import (ModelHandle, ModelLoadError, ModelSpec, all_zoo_models, allowed_roots,
                                          load_model, resolve_folder, zoo_models)
from analysis.model_access import real_models
from components import hosting

SOURCES = {"zoo": "Zoo", "hub": "Hugging Face Hub", "local": "Local folder", "ndif": "NDIF (remote)"}
STATE_KEY = "model_spec"  # the loaded model: what "Loaded:", the URL and every page name
CHOSEN_KEY = "_model_chosen"  # the visitor's own model (the picker's Load, a link, the default)
BORROWED_KEY = "_model_borrowed"  # (panel, why) while a preset or a panel's needs put another model in its place
LOADED_BY_PICKER = "_model_loaded_by_picker"  # set by Load model for the page drawn in the same run
PICKER_SHOWS = "_picker_shows"  # the spec the picker's widgets were last set to


@st.cache_resource(max_entries=2, show_spinner=False)
def _load_cached(spec: ModelSpec) -> ModelHandle:
    if spec.source == "ndif":  # config and tokenizer here, weights on NDIF
        return backends.load(spec)
    return load_model(spec)


def shared_model(spec: ModelSpec) -> ModelHandle:
    """`spec` from the server's one cache of loaded models, loaded on first use: the model a visitor loaded
    and the one a talk or another page needs are one object in memory, never two. No refusal is checked
    here (`try_load` checks the configuration's); raises ModelLoadError."""
    return _load_cached(spec)


def default_spec() -> ModelSpec | None:
    """The configuration's default model (locally: zoo:shapes-lm, else the first demo model)."""
    configured = ModelSpec.parse(hosting.settings().models.default)
    if configured.source != "zoo":
        return configured
    names = zoo_models()  # a demo model: the real ones are offered, never the default
    if not names:
        return None
    return configured if configured.name in names else ModelSpec("zoo", names[0])


def _spec_from_url() -> ModelSpec | None:
    text = st.query_params.get("model")
    if not text:
        return None
    try:
        return ModelSpec.parse(text)
    except Exception:
        return None


def short_local(spec: ModelSpec) -> ModelSpec:
    """A local model by its path under its allowed root (`local:my-model`), not the server's full path, where
    that name finds the same folder again; any other spec as it is."""
    if spec.source != "local":
        return spec
    try:
        path = resolve_folder(spec)
        for root in allowed_roots():
            short = ModelSpec(spec.source, str(path.relative_to(root)), spec.revision, spec.dtype) \
                if root in path.parents else None
            if short is not None and resolve_folder(short) == path:
                return short
    except ModelLoadError:
        pass
    return spec


def try_load(spec: ModelSpec, *, borrowed: tuple[str, str] | None = None) -> ModelHandle | None:
    """Load (or fetch from cache) and make it the session's model; on failure keep the old one.
    A spec the deployment does not allow never reaches the loader.

    `borrowed=(panel, why)`: a preset or a panel loads it in place of the visitor's own model, which is
    remembered (`chosen()`) and comes back when the visitor leaves that panel (components/presets.py)."""
    refusal = _refusal(spec)
    if refusal:
        st.warning(f"{hosting.escape_markdown(spec.label)} was not loaded. {hosting.visible_markdown(refusal)}",
                   icon=":material/block:")
        return None
    spec = short_local(spec)  # a folder by its name under its root: the server's path stays off screen and links
    message = f"Loading {spec.label} ..."
    if spec.source == "zoo" and spec.name in real_models.REAL_MODELS and not real_models.is_built(spec.name):
        message = (f"Converting {spec.label} from its GGUF file (first use on this machine, about 30 s), "
                   "then loading it ...")
    try:
        with st.spinner(message):
            handle = _load_cached(spec)
    except ModelLoadError as exc:
        st.error(f"Could not load {hosting.visible_markdown(f'{spec.label}: {exc}')}", icon=":material/error:")
        return None
    own = chosen()
    st.session_state[STATE_KEY] = spec
    st.query_params["model"] = spec.label
    if borrowed is None or spec == own or own is None:
        st.session_state[CHOSEN_KEY] = spec
        st.session_state.pop(BORROWED_KEY, None)
    else:
        st.session_state[CHOSEN_KEY] = own
        st.session_state[BORROWED_KEY] = borrowed
    return handle


def chosen() -> ModelSpec | None:
    """The visitor's own model: the last one they loaded (or their link's, or the default)."""
    return st.session_state.get(CHOSEN_KEY) or st.session_state.get(STATE_KEY)


def borrowed() -> tuple[str, str] | None:
    """(panel, why) when the loaded model is a preset's or a panel's, not the visitor's own."""
    return st.session_state.get(BORROWED_KEY)


def current_handle() -> ModelHandle | None:
    """The session's model: from session state, else the URL, else the zoo default."""
    spec = st.session_state.get(STATE_KEY)
    if spec is None:
        spec = _spec_from_url() or default_spec()
        if spec is None:
            return None
        handle = try_load(spec)
        if handle is None and spec != default_spec() and default_spec() is not None:
            st.caption(f"Showing the default model, {hosting.escape_markdown(default_spec().label)}, instead.")
            handle = try_load(default_spec())
        return handle
    if spec.source == "local" and short_local(spec) != spec:  # set by a full path: named by its folder from now on
        st.session_state[STATE_KEY] = spec = short_local(spec)
    if _refusal(spec):  # the configuration changed under the session
        st.session_state.pop(STATE_KEY, None)
        return current_handle()
    try:
        return _load_cached(spec)
    except ModelLoadError as exc:  # evicted from cache and no longer loadable
        st.error(f"Could not reload {hosting.visible_markdown(f'{spec.label}: {exc}')}", icon=":material/error:")
        return None


def _refusal(spec: ModelSpec) -> str | None:
    """Why this deployment will not load `spec`: remote models answer to [backend], the rest to [models]."""
    if spec.source == "ndif":
        return ndif.refusal(spec.name)
    return hosting.settings().model_refusal(spec.source, spec.name)


def _remote_note() -> None:
    """Under the box, for a remote model: where it runs and what stays local (never the key itself)."""
    st.caption("Runs on NDIF (ndif.us): only its config and tokenizer load here. Attention sharpness, prompt "
               "reconstruction's targets, SAE-V activations and caption verification run there; KV-cache "
               "eviction and generation need a local model.")
    if not ndif.api_key():
        st.warning("This server has no NDIF API key (NDIF_API_KEY), so remote runs will be refused.",
                   icon=":material/key_off:")


def _zoo_label(name: str) -> str:
    """Demo models by name; a real model marked (short: the box shows about 28 characters at 1024 px)."""
    return f"{name} (real)" if name in real_models.REAL_MODELS else name


def _real_note(name: str) -> None:
    """Under the box, for a real model: what it is, and that the first load converts it."""
    if name in real_models.REAL_MODELS:
        model = real_models.REAL_MODELS[name]
        st.caption(f"A real trained model: {model.upstream} ({model.licence})."
                   + ("" if real_models.is_built(name) else f" Converted from its package on first load (about {real_models.CONVERSION_S:.0f} s)."))


def _pick(source: str, names: list[str], start: ModelSpec, label: str, key: str, none: str,
          format_func=str) -> ModelSpec | None:
    """A select box over a fixed list of models (the zoo, a configured Hub allow-list)."""
    if not names:
        st.warning(hosting.visible(none))  # on a public instance, without the operator's instructions
        return None
    if st.session_state.get(key) not in names:
        st.session_state.pop(key, None)
    start_at = {} if key in st.session_state else {"index": names.index(start.name) if start.name in names else 0}
    name = st.selectbox(label, names, key=key, format_func=format_func, **start_at)
    return ModelSpec(source, name)


def _text(label: str, key: str, value: str, **kw) -> str:
    """A text box that starts at `value` unless the picker already set its state (_show_in_picker)."""
    return st.text_input(label, key=key, **({} if key in st.session_state else {"value": value}), **kw)


def _show_in_picker(spec: ModelSpec, sources: list[str]) -> None:
    """Set the picker's widgets to the loaded model whenever it changed since they were last set (a preset,
    a link, a panel's demo model, Load model). Their state is written, not forgotten: a forgotten widget
    kept showing the old model in the browser, and Load model then switched back to it."""
    if st.session_state.get(PICKER_SHOWS) == spec:
        return
    st.session_state[PICKER_SHOWS] = spec
    if spec.source not in sources:
        return
    state = st.session_state
    state["picker_source"] = spec.source
    if spec.source == "zoo":
        state["picker_zoo"] = spec.name
    elif spec.source == "ndif":
        state["picker_ndif"] = spec.name
    elif spec.source == "hub" and hosting.settings().hub_allow_list() is not None:
        state["picker_hub_list"] = spec.name
    elif spec.source == "hub":
        state["picker_hub"], state["picker_rev"] = spec.name, spec.revision or ""
    else:
        state["picker_local"] = spec.name


def render_sidebar() -> ModelHandle | None:
    """Draw the picker in the sidebar and return the session's current model (or None)."""
    config = hosting.settings()
    with st.sidebar:
        hosting.account_box()
        st.subheader("Model")
        st.session_state.pop(LOADED_BY_PICKER, None)  # a Load on a page without a preset bar (home) is done with
        loaded = current_handle()  # so the widgets start on the model the URL or session names
        start = loaded.spec if loaded is not None else ModelSpec()
        sources = [s for s in SOURCES if s in config.models.sources]
        if config.backend.kind == "ndif":
            sources.append("ndif")
        _show_in_picker(start, sources)
        if st.session_state.get("picker_source") not in sources:
            st.session_state.pop("picker_source", None)
        start_at = {} if "picker_source" in st.session_state else {
            "index": sources.index(start.source) if start.source in sources else 0}
        source = st.radio("Source", sources, format_func=SOURCES.get, key="picker_source", horizontal=True,
                          **start_at)
        spec = None
        if source == "zoo":
            spec = _pick("zoo", all_zoo_models(), start, "Zoo model", "picker_zoo",
                         "No demo models are installed. Build them with `python -m analysis.zoo build`.",
                         format_func=_zoo_label)
            if spec is not None:
                _real_note(spec.name)
        elif source == "ndif":
            spec = _pick("ndif", list(config.backend.remote_models), start, "Remote model", "picker_ndif",
                         "This instance lists no NDIF models.")
            _remote_note()
        elif source == "hub" and config.hub_allow_list() is not None:
            spec = _pick("hub", config.hub_allow_list(), start, "Model", "picker_hub_list",
                         "This instance lists no Hub models.")
        elif source == "hub":
            hub = start.source == "hub"
            repo = _text("Model id", "picker_hub", start.name if hub else "", placeholder="owner/name")
            rev = _text("Revision (optional)", "picker_rev", (start.revision or "") if hub else "",
                        placeholder="main")
            spec = ModelSpec("hub", repo.strip(), rev.strip() or None)
        else:
            path = _text("Folder (save_pretrained layout)", "picker_local",
                         start.name if start.source == "local" else "")
            spec = ModelSpec("local", path.strip())
        if st.button("Load model", key="picker_load", type="primary", disabled=spec is None):
            if spec.source != "zoo" and not spec.name:
                st.error("Enter a model id or folder first.")
            elif try_load(spec) is not None:
                st.session_state[LOADED_BY_PICKER] = spec  # the visitor wants it on this page too
        handle = current_handle()
        if handle is not None:
            if st.query_params.get("model") != handle.spec.label:
                st.query_params["model"] = handle.spec.label  # keep the view's link complete
            where = " · runs on NDIF" if handle.remote is not None else ""
            st.caption(f"Loaded: **{handle.spec.label}** · {handle.info.architecture} · "
                       f"{handle.info.parameters:,} parameters{where}")
            _borrowed_note(handle.spec)
    return handle


def _borrowed_note(loaded: ModelSpec) -> None:
    """Under "Loaded:", while a preset's or a panel's model stands in for the visitor's: say so, and offer it back."""
    why, own = borrowed(), chosen()
    if why is None or own is None or own == loaded:
        return
    st.caption(f"{hosting.escape_markdown(why[1])}. Your model, {hosting.escape_markdown(own.label)}, comes back "
               "on the other pages.")
    if st.button(f"Back to {own.label}", key="picker_back"):
        if try_load(own) is not None:
            st.session_state[LOADED_BY_PICKER] = own
            st.rerun()

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
from analysis.model_access.models import ModelHandle, ModelLoadError, ModelSpec, all_zoo_models, load_model, zoo_models
from analysis.model_access import real_models
from components import hosting

SOURCES = {"zoo": "Zoo", "hub": "Hugging Face Hub", "local": "Local folder", "ndif": "NDIF (remote)"}
STATE_KEY = "model_spec"


@st.cache_resource(max_entries=2, show_spinner=False)
def _load_cached(spec: ModelSpec) -> ModelHandle:
    if spec.source == "ndif":  # config and tokenizer here, weights on NDIF
        return backends.load(spec)
    return load_model(spec)


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


def try_load(spec: ModelSpec) -> ModelHandle | None:
    """Load (or fetch from cache) and make it the session's model; on failure keep the old one.
    A spec the deployment does not allow never reaches the loader."""
    refusal = _refusal(spec)
    if refusal:
        st.warning(f"{hosting.escape_markdown(spec.label)} was not loaded. {hosting.visible_markdown(refusal)}",
                   icon=":material/block:")
        return None
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
    st.session_state[STATE_KEY] = spec
    st.query_params["model"] = spec.label
    return handle


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
    name = st.selectbox(label, names, key=key, format_func=format_func,
                        index=names.index(start.name) if start.name in names else 0)
    return ModelSpec(source, name)


def render_sidebar() -> ModelHandle | None:
    """Draw the picker in the sidebar and return the session's current model (or None)."""
    config = hosting.settings()
    with st.sidebar:
        hosting.account_box()
        st.subheader("Model")
        loaded = current_handle()  # so the widgets start on the model the URL or session names
        start = loaded.spec if loaded is not None else ModelSpec()
        sources = [s for s in SOURCES if s in config.models.sources]
        if config.backend.kind == "ndif":
            sources.append("ndif")
        source = st.radio("Source", sources, format_func=SOURCES.get, key="picker_source", horizontal=True,
                          index=sources.index(start.source) if start.source in sources else 0)
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
            repo = st.text_input("Model id", placeholder="owner/name", key="picker_hub",
                                 value=start.name if hub else "")
            rev = st.text_input("Revision (optional)", placeholder="main", key="picker_rev",
                                value=(start.revision or "") if hub else "")
            spec = ModelSpec("hub", repo.strip(), rev.strip() or None)
        else:
            path = st.text_input("Folder (save_pretrained layout)", key="picker_local",
                                 value=start.name if start.source == "local" else "")
            spec = ModelSpec("local", path.strip())
        if st.button("Load model", key="picker_load", type="primary", disabled=spec is None):
            if spec.source != "zoo" and not spec.name:
                st.error("Enter a model id or folder first.")
            else:
                try_load(spec)
        handle = current_handle()
        if handle is not None:
            if st.query_params.get("model") != handle.spec.label:
                st.query_params["model"] = handle.spec.label  # keep the view's link complete
            where = " · runs on NDIF" if handle.remote is not None else ""
            st.caption(f"Loaded: **{handle.spec.label}** · {handle.info.architecture} · "
                       f"{handle.info.parameters:,} parameters{where}")
    return handle

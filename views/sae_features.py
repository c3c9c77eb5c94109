"""SAE-V feature browser: feature list, feature pages (permalink ?feature=K), explain an input, data ranking
and filtering (the SAE's own pairs or your data), and steering. Any SAE: ours, or one saved by sae-lens.

The page reads its controls (mirrored to the URL) and hands every step that runs the model to the shared
runner (components/runs.py: cost estimate, stored results, Stop); components/sae/ draws the results."""
from __future__ import annotations

import streamlit as st

from analysis import sae_v
from analysis.errors import UserError
from components import hosting  # uploads under the deployment's limits
from components.common import (EMPTY_LIST, analysis_errors, demo_model, field_row, require_model, set_url_params,
                               show_error, url_list, url_param)
from components.figures import sae as figs
from components.model_picker import try_load
from components.params_form import ParamsForm, fields_of
from components.presets import preset_bar
from components.runs import cached_run
from components import sae as sae_components
from components.sae import browse, explained, ranked, steered

VIEWS = {"list": "Feature list", "feature": "Feature page", "explain": "Explain an input", "ranking": "Data ranking"}
OWN = "own"  # the data choice "the SAE's own evaluation pairs" (URL: no `data`)

st.title("SAE-V features")
st.caption("Sparse-autoencoder features over the image and text tokens of a multimodal model (or the text tokens "
           "of a language model), their cross-modal weight ω, data filtering by cross-modal score, and steering "
           "— after *SAE-V* (ICML 2025).")
preset_bar("sae-features", widget_prefix="sae_")
handle = require_model(*sae_v.ANALYSIS.kinds, panel="SAE-V feature browser")
is_vlm = handle.kind == "vlm"
demo_vlm = None if is_vlm else demo_model("vlm")
if demo_vlm is not None:
    c1, c2 = st.columns([4, 1])
    c1.info(f"{handle.spec.label} is a text-only model: its SAE features are text features (no modality "
            "columns, no image–caption ranking). The demo vision-language model has a trained SAE ready.")
    if c2.button(f"Use {demo_vlm.label}", key="sae_use_demo"):
        if try_load(demo_vlm) is not None:
            st.rerun()


# ---------------------------------------------------------------------------------------------
# The runs: each hands one analysis function to the shared runner


def run_store(choice: sae_v.SaeChoice) -> sae_v.FeatureStore:
    return cached_run("store", sae_v.store_for, handle, choice, label="Building the feature store on these data")


def run_rank(params: sae_v.RankParams) -> sae_v.Ranking:
    return cached_run("rank", sae_v.rank, handle, params, label="Scoring every pair")


def run_explain(params: sae_v.ExplainParams) -> sae_v.InputExplanation:
    return cached_run("explain", sae_v.explain, handle, params, label="Running the model on this input")


def run_steer(params: sae_v.SteerParams) -> sae_v.SteeringResult | None:
    return cached_run("steer", sae_v.steer, handle, params, label="Generating with and without steering",
                      on_demand=True)


def run_train(params: sae_v.BuildParams) -> sae_v.Trained:
    return cached_run("train", sae_v.train, handle, params, label="Training the SAE")


@st.cache_resource(max_entries=4, show_spinner="Loading the feature store ...")
def load_feature_store(folder: str, stamp: float):
    return sae_v.load_store(folder)


@st.cache_data(max_entries=32, show_spinner=False)
def pair_image(store_key: str, _store: sae_v.FeatureStore, pair: int, size: int):
    try:
        image = sae_v.pair_image(_store.pairs, pair)
    except UserError:
        return None
    return None if image is None else figs.fit_image(image, size)


# ---------------------------------------------------------------------------------------------
# Which SAE: ours (demo, trained here), or one from elsewhere; train a new one


def _describe(folders: dict, name: str) -> str:
    folder = folders.get(name)
    if folder is None:
        return f"{name} (from elsewhere: sae-lens)"
    try:
        meta = sae_v.SaeMeta.from_json((folder / sae_v.META_FILE).read_text())
    except (OSError, ValueError):
        return folder.name
    where = "demo" if sae_v.SAE_ROOT in folder.parents else "trained here"
    return f"layer {meta.layer} · {meta.kind} · {meta.train.d_sae if meta.train else '?'} features · " \
           f"FVE {meta.fve:.3f} · {where}"


def train_form(has_saes: bool) -> None:
    with st.expander(":material/model_training: Train a new SAE" + ("" if has_saes else " (none yet for this model)"),
                     expanded=not has_saes):
        st.caption("Collects the residual stream after the chosen decoder layer over image and text tokens, trains "
                   "an sae-lens SAE, then builds the feature store the browser reads. On the demo model this takes "
                   "about a minute on CPU.")
        form = ParamsForm("sae_train_")
        row = field_row()
        values = form.draw(row, fields_of(sae_v.BuildParams, ["layer"]),
                           defaults={"layer": handle.info.layers // 2})
        values |= form.draw(row, fields_of(sae_v.TrainParams, ["architecture", "d_sae", "steps"]),
                            defaults={"d_sae": 512}, overrides={"architecture": {"format_func": str}})
        values |= form.draw(row, sae_v.ARCHITECTURES.settings())
        if st.button("Train SAE", key="sae_train_go", type="primary"):
            flat = {k: v for k, v in values.items() if k in ("k", "l1_coefficient", "l0_coefficient")}
            train = sae_v.TrainParams(architecture=values["architecture"], d_sae=int(values["d_sae"]),
                                      steps=int(values["steps"]), architectures=sae_v.architecture_settings(**flat))
            with analysis_errors(prefix="Training failed: "):
                params = sae_v.BuildParams(layer=int(values["layer"]), train=train)
                params.validate()
                trained = run_train(params)
            set_url_params(sae=trained.name, view="list")
            st.session_state.pop("sae_pick", None)
            st.rerun()


def outside_form() -> None:
    with st.expander(":material/upload_file: Use an SAE from elsewhere (saved by sae-lens)"):
        st.caption("A folder on this server under the allowed roots with sae-lens's `cfg.json` and "
                   "`sae_weights.safetensors` (`SAE.save_model` / `save_inference_model`), or "
                   "`sae-lens:RELEASE/SAE_ID` for a pretrained release (needs the machine online). It is checked "
                   "against this model (its hook and width) before anything runs.")
        c1, c2 = st.columns([4, 1])
        where = c1.text_input("SAE folder or sae-lens:RELEASE/SAE_ID", key="sae_outside_path", max_chars=500)
        layer = c2.number_input("Layer (only if its cfg names no hook)", -1, handle.info.layers - 1, -1,
                                key="sae_outside_layer")
        if st.button("Use this SAE", key="sae_outside_go") and where.strip():
            try:
                source = sae_v.locate(handle, where.strip())
                sae_v.open_sae(handle, sae_v.SaeChoice(sae=source.locator, layer=int(layer),
                                                       sae_fingerprint=sae_v.sae_fingerprint(source)))
            except UserError as exc:
                show_error(exc)
            else:
                set_url_params(sae=source.locator, slayer=int(layer), view="list")
                st.session_state.pop("sae_pick", None)
                st.rerun()


folders = {f.name: f for f in sae_v.available_saes(handle)}
train_form(bool(folders))
outside_form()
sae_name = url_param("sae", next(iter(folders), ""), str).strip() or next(iter(folders), "")
options = list(folders) + ([sae_name] if sae_name and sae_name not in folders else [])
if not options:
    st.info("There is no SAE for this model yet: train one above, or use one from elsewhere.")
    st.stop()
sae_name = st.selectbox("SAE", options, index=options.index(sae_name), key="sae_pick",
                        format_func=lambda n: _describe(folders, n))
outside_layer = url_param("slayer", -1, int, lo=-1, hi=handle.info.layers - 1) if sae_name not in folders else -1


# ---------------------------------------------------------------------------------------------
# Which data: the SAE's own pairs, generated pairs, or your own folder / zip


def data_choices(current: str) -> list[str]:
    """The SAE's own pairs (ours) or the model's default generated pairs first, then the others, then yours."""
    first = sae_v.default_dataset(handle)
    generated = [f"dataset:{name}" for name in sorted(sae_v.DATASETS, key=lambda n: n != first)]
    out = ([OWN] if sae_name in folders else []) + generated
    return out + ([current] if current and current not in out else [])


def data_label(value: str) -> str:
    if value == OWN:
        return "The SAE's own evaluation pairs"
    if value.startswith("dataset:"):
        return f"Generated: {sae_v.DATASETS.label(value.partition(':')[2])}"
    return f"Your data: {value.removeprefix('upload:')[:12] + ' (uploaded zip)' if value.startswith('upload:') else value}"


def own_data_form() -> None:
    with st.expander(":material/dataset: Your own data (a folder or a zip)"):
        st.caption("A folder with `captions.jsonl` (`{\"image\": \"a.png\", \"caption\": \"...\"}` per line), "
                   "`captions.csv` (image,caption), a Parquet file or a `datasets` folder (`save_to_disk`) with an "
                   "image and a caption column — for a language model `texts.txt` or `texts.jsonl`. A `label` or "
                   "`corrupted` column adds ROC, precision and recall. Bad rows are reported and left out.")
        c1, c2 = st.columns([3, 2])
        path = c1.text_input("Folder on this server (under the allowed roots)", key="sae_data_path", max_chars=500)
        if c1.button("Use this folder", key="sae_data_go") and path.strip():
            with analysis_errors(stop=False):
                sae_v.userdata.load(path.strip(), handle.kind)
                set_url_params(data=path.strip())
                st.session_state.pop("sae_data", None)  # the picker then starts from the link
                st.rerun()
        if not sae_components.uploads_enabled():
            c2.info("Uploads are turned off on this instance.", icon=":material/block:")
            return
        upload = c2.file_uploader("…or upload a zip (up to 50 MB)", type=["zip"], key="sae_data_zip")
        if upload is not None and c2.button("Use this zip", key="sae_data_zip_go"):
            with analysis_errors(stop=False):
                locator = sae_v.save_zip(upload.getvalue(), name=f"'{upload.name}'")
                sae_v.userdata.load(locator, handle.kind)
                set_url_params(data=locator)
                st.session_state.pop("sae_data", None)
                st.rerun()


own_data_form()
data_url = url_param("data", "", str)
choices = data_choices(data_url)
data_value = data_url if data_url in choices else (OWN if OWN in choices else choices[0])
data_value = st.selectbox("Data", choices, index=choices.index(data_value), format_func=data_label, key="sae_data")
set_url_params(sae=sae_name, data="" if data_value == OWN else data_value)
try:
    choice = sae_v.choose(handle, sae_name, "" if data_value == OWN else data_value, layer=outside_layer)
    if sae_name not in folders:
        sae_v.open_sae(handle, choice)  # an outside SAE: checked against the model before anything runs
except UserError as exc:
    show_error(exc, prefix="This SAE or these data cannot be used: ")
    st.caption("Choose another SAE or other data above (the link's values were refused).")
    st.stop()
if sae_name in folders and data_value == OWN:
    store_file = folders[sae_name] / sae_v.STORE_FILE
    store = load_feature_store(str(folders[sae_name]), store_file.stat().st_mtime)
else:
    with analysis_errors():
        store = run_store(choice)
store_key = choice.to_json()
meta, n_features = store.meta, len(store.features)
if sae_v.is_stale(handle, meta):
    st.warning("This SAE was trained on different weights of this model (the model was rebuilt since). Its "
               "features may no longer match: train a new SAE above.")

feature_from_url = st.query_params.get("feature")
view = st.segmented_control("View", list(VIEWS), format_func=VIEWS.get, key="sae_view",
                            default=url_param("view", "feature" if feature_from_url is not None else "list", str,
                                              list(VIEWS))) or "list"
set_url_params(view=view)


def image_of(pair: int):
    return pair_image(store_key, store, pair, handle.info.image_size or 64) if is_vlm else None


# ---------------------------------------------------------------------------------------------
# Steering (on the feature page and in explain)


def steer_section(default: str, image_ref: str, where: str) -> None:
    st.markdown("#### Steer: add features while the model generates")
    form = ParamsForm(f"sae_steer_{where}_")
    row = field_row()
    text = row.text_input("Features (feature=strength, comma-separated)", url_param("steer", default, str),
                          key=f"sae_steer_{where}", max_chars=200, width=260)
    values = form.draw(row, fields_of(sae_v.SteerParams, ["mode", "positions", "max_new_tokens"] if is_vlm
                                      else ["mode", "max_new_tokens"]))
    first = store.pairs.pairs[0].text.split()[:4] if store.pairs.pairs and not is_vlm else []
    values |= form.draw(st.container(), fields_of(sae_v.SteerParams, ["prompt"]), width="stretch",
                        defaults={"prompt": " ".join(first)})  # a language model continues a text's start
    form.mirror()
    set_url_params(steer=text)
    with analysis_errors():
        features = sae_v.parse_steer([t for t in text.replace(" ", "").split(",") if t])
        params = sae_v.choose(handle, sae_name, choice.data, sae_v.SteerParams, layer=outside_layer,
                              features=features, image=image_ref, **values)
        params.validate()
        result = run_steer(params)
    if result is not None:  # None: not run yet (its button is shown)
        steered.side_by_side(result)


# ---------------------------------------------------------------------------------------------
# The views


def show_list() -> None:
    browse.summary(store)
    c1, c2 = st.columns([1, 2])
    sort_by = c1.selectbox("Sort by", list(figs.SORTS), key="sae_sort",
                           index=list(figs.SORTS).index(url_param("sort", "omega", str, list(figs.SORTS))))
    kinds = list(figs.LABEL_COLOURS)
    labels = kinds
    if not browse.one_modality(store):  # one-click toggles mirrored in the URL (labels=none when every one is off)
        label_default = url_list("labels", ["cross-modal", "text-only", "image-only"], kinds, cast=str,
                                 allow_empty=True)
        chosen = c2.pills("Modality", kinds, selection_mode="multi", wrap=True, default=label_default,
                          key="sae_labels",
                          help="Show the features of these modality labels (dead: never active on these pairs).")
        labels = [k for k in kinds if k in (chosen or [])]
        set_url_params(labels=labels or EMPTY_LIST)
    set_url_params(sort=sort_by)
    rows = figs.sort_rows(figs.feature_rows(store), sort_by, labels)
    if not labels:
        st.info("Choose at least one modality label to list its features.")
    elif not rows:
        st.info(f"No feature of this SAE is {' or '.join(labels)}.")
    else:
        browse.table(store, rows)
    c1, c2 = st.columns([1, 3])
    pick = c1.number_input("Open feature", 0, n_features - 1, int(rows[0]["feature"]) if rows else 0,
                           key="sae_open_pick")
    if c2.button("Open feature page", key="sae_open"):
        set_url_params(view="feature", feature=int(pick))
        st.session_state.pop("sae_view", None)
        st.rerun()
    if not browse.one_modality(store):
        browse.scatter(store)


def show_feature() -> None:
    initial = url_param("feature", 0, int)
    if not 0 <= initial < n_features:
        st.error(f"Feature {initial} does not exist: this SAE has features 0 to {n_features - 1}.")
        initial = 0
    index = int(st.number_input("Feature", 0, n_features - 1, initial, key="sae_feature"))
    set_url_params(feature=index)
    card = store.features[index]
    browse.feature_header(store, index)
    browse.feature_text(store, card)
    if is_vlm and store.grid:
        browse.feature_images(store, card, image_of, handle.info.image_size or 64)
    browse.feature_tables(store, card)
    pair = url_param("spair", 0, int, lo=0, hi=max(len(store.pairs.pairs) - 1, 0))
    if is_vlm:
        pair = int(st.number_input("Steer on the image of pair", 0, max(len(store.pairs.pairs) - 1, 0), pair,
                                   key="sae_steer_pair"))
        set_url_params(spair=pair)
    strength = round(max(2 * card.max_act, 1.0), 1)
    steer_section(f"{index}={strength:g}", f"pair:{pair}" if is_vlm else "", "feature")


def show_explain() -> None:
    image_ref, image = "", None
    pairs = store.pairs.pairs
    default_text = pairs[0].text if pairs else ""
    if is_vlm:
        source = st.radio("Image", ["Dataset scene", "Upload"], horizontal=True, key="sae_img_source")
        if source == "Dataset scene":
            i = int(st.number_input("Scene (pair index)", 0, max(len(pairs) - 1, 0),
                                    url_param("img", 0, int, lo=0, hi=max(len(pairs) - 1, 0)), key="sae_img_pair"))
            set_url_params(img=i)
            image_ref, image, default_text = f"pair:{i}", image_of(i), pairs[i].text if pairs else ""
        else:
            upload = hosting.file_uploader("Upload an image", key="sae_upload")
            if upload is None:
                st.info("Choose an image file to explain.")
                return
            with analysis_errors():
                image_ref = sae_v.save_image(upload.getvalue(), name=f"'{upload.name}'")
                image = figs.fit_image(sae_v.userdata.image_from_ref(image_ref), handle.info.image_size or 64)
    text = st.text_input("Text", value=default_text, max_chars=500, key="sae_text")
    if not text.strip():
        st.error("Enter some text to explain.")
        return
    with analysis_errors():
        params = sae_v.choose(handle, sae_name, choice.data, sae_v.ExplainParams, layer=outside_layer, text=text,
                              image=image_ref)
        result = run_explain(params)
    if not result.totals:
        st.warning("No feature is active on this input.")
        return
    left, right = st.columns([2, 3])
    if is_vlm and image is not None:
        with left:
            explained.image_side(result, store, image)
    with right if is_vlm else left:
        explained.text_side(result, store, image)
    top = ",".join(f"{s.key}={max(2 * s.value, 1.0):.1f}" for s in result.totals[:1])
    steer_section(top, image_ref, "explain")


def show_ranking() -> None:
    if not is_vlm:
        st.error(f"Data ranking scores image–caption pairs, so it needs a vision-language model; "
                 f"{handle.spec.label} is text-only.")
        return
    stored_rule = store.params.score_rule if store.params is not None else "official"
    form = ParamsForm("sae_rank_")
    values = form.draw(st.container(), fields_of(sae_v.RankParams, ["rule"]), width="stretch",
                       defaults={"rule": stored_rule}, overrides={"rule": {"format_func": sae_v.SCORE_RULES.label}})
    rule = values["rule"]
    row = field_row(gap="large")
    values |= form.draw(row, fields_of(sae_v.RankParams, ["by"]), overrides={"by": {"format_func": {
        "sum": sae_v.score_label(rule), "weighted": "activation-weighted mean ω"}.get, "width": 300}})
    rule_form = ParamsForm(f"sae_rank_{rule}_")  # a widget per rule: each starts from the rule's own default
    threshold = rule_form.draw(row, [(f, c) for f, c in sae_v.SCORE_RULES.settings() if f.name == "cooccur_threshold"],
                               defaults={"cooccur_threshold": sae_v.score_rule(rule).cooccur_threshold})
    keep = form.draw(st.container(), fields_of(sae_v.Keep, ["keep"]), width=400)["keep"]
    form.mirror()
    rule_form.mirror()
    with analysis_errors():
        params = sae_v.choose(handle, sae_name, choice.data, sae_v.RankParams, layer=outside_layer, rule=rule,
                              by=values["by"], rules=sae_v.rule_settings(**threshold))
        ranking = run_rank(params)
    ranked.overview(ranking, store)
    keep_fig = ranked.keep_section(ranking, keep)
    figures = ranked.distribution(ranking)
    user_data = bool(choice.data) and not choice.data.startswith("dataset:")
    ranked.extremes(ranking, _user_image if user_data else (lambda r: image_of(r.pair)))
    kept = (lambda: sae_v.kept_subset(choice.data, ranking, keep, handle.kind)) if user_data else None
    rows = ranked.downloads(ranking, keep, kept)
    if not choice.data:
        ranked.filtering_experiment()
    from components.share import share_bar

    share_bar("sae", title=f"SAE-V ranking on {handle.spec.label} layer {meta.layer}",
              params={"sae": sae_name, "data": choice.data, "by": values["by"], "threshold": ranking.threshold,
                      "rule": rule, "keep": keep}, result=ranking, model=handle.spec.label,
              figures={**figures, **({"Keep": keep_fig} if keep_fig is not None else {})}, tables={"ranking": rows})


def _user_image(row: sae_v.PairScore):
    pairs, _, _ = sae_v.data_pairs(handle, choice)
    try:
        return figs.fit_image(sae_v.pair_image(pairs, row.pair), handle.info.image_size or 64)
    except UserError:
        return None


{"list": show_list, "feature": show_feature, "explain": show_explain, "ranking": show_ranking}[view]()

"""SAE-V feature browser: feature list, feature pages (permalink ?feature=K), explain an input, data ranking."""
from __future__ import annotations

import io
from pathlib import Path

import streamlit as st

from analysis import sae_v
from analysis.models import ModelSpec, zoo_models
from analysis.export import rows_to_csv
from components.figures import sae as figs
from components.common import (EMPTY_LIST, charts_side_by_side, explain, field_row, metric_row, progress,
                               require_model, set_url_params, url_list, url_param)
from components.model_picker import try_load
from components.presets import preset_bar

VIEWS = {"list": "Feature list", "feature": "Feature page", "explain": "Explain an input", "ranking": "Data ranking"}

st.title("SAE-V features")
st.caption("Sparse-autoencoder features over the image and text tokens of a multimodal model, their cross-modal "
           "weight ω, and data filtering by cross-modal score — after *SAE-V* (ICML 2025).")
preset_bar("sae-features", widget_prefix="sae_")
handle = require_model("vlm", "causal_lm", panel="SAE-V feature browser")
is_vlm = handle.kind == "vlm"
if not is_vlm and "shapes-vlm" in zoo_models():
    c1, c2 = st.columns([4, 1])
    c1.info(f"{handle.spec.label} is a text-only model: SAE-V is about image and text tokens. The demo "
            "vision-language model has a trained SAE ready.")
    if c2.button("Use zoo:shapes-vlm", key="sae_use_demo"):
        if try_load(ModelSpec("zoo", "shapes-vlm")) is not None:
            st.rerun()


@st.cache_resource(max_entries=4, show_spinner="Loading the feature store ...")
def load_feature_store(folder: str, stamp: float):
    return sae_v.load_store(folder)


@st.cache_resource(max_entries=4, show_spinner="Loading the SAE (sae-lens) ...")
def load_sae(folder: str, stamp: float):
    """Only the views that run the model need the SAE itself (importing sae-lens takes seconds)."""
    return sae_v.load_sae(folder)


@st.cache_data(max_entries=16, show_spinner=False)
def pair_image(folder: str, stamp: float, pair: int, size: int):
    image = load_feature_store(folder, stamp).pairs.image(pair)
    return None if image is None else figs.fit_image(image, size)


def _stamp(folder: Path) -> float:
    return (folder / sae_v.STORE_FILE).stat().st_mtime


# ---------------------------------------------------------------------------------------------
# Which SAE


folders = sae_v.available_saes(handle)
names = [f.name for f in folders]


def _describe(folder: Path) -> str:
    try:
        meta = sae_v.SaeMeta.from_json((folder / sae_v.META_FILE).read_text())
    except (OSError, ValueError):
        return folder.name
    where = "demo" if sae_v.SAE_ROOT in folder.parents else "trained here"
    return (f"layer {meta.layer} · {meta.train.architecture} · {meta.train.d_sae} features · "
            f"FVE {meta.fve:.3f} · {where}")


with st.expander(":material/model_training: Train a new SAE" + ("" if folders else " (none yet for this model)"),
                 expanded=not folders):
    st.caption("Collects the residual stream after the chosen decoder layer over image and text tokens, trains an "
               "sae-lens SAE, then builds the feature store the browser reads. On the demo model this takes about "
               "a minute on CPU.")
    c1, c2, c3, c4, c5 = st.columns(5)
    layer = c1.number_input("Layer", 0, handle.info.layers - 1, handle.info.layers // 2, key="sae_train_layer")
    arch = c2.selectbox("Architecture", sae_v.ARCHITECTURES, key="sae_train_arch")
    d_sae = c3.selectbox("Features", [128, 256, 512, 1024], index=2, key="sae_train_dsae")
    k = c4.number_input("k (TopK)", 1, 64, 8, key="sae_train_k", disabled=arch != "topk")
    steps = c5.number_input("Steps", 100, 20000, 2000, step=100, key="sae_train_steps")
    if st.button("Train SAE", key="sae_train_go", type="primary"):
        params = sae_v.BuildParams(layer=int(layer), train=sae_v.TrainParams(
            architecture=arch, d_sae=int(d_sae), k=int(k), steps=int(steps)))
        try:
            with progress("Training SAE ...") as cb:
                folder = sae_v.build(handle, params, progress=cb)
        except (ValueError, RuntimeError) as exc:
            st.error(f"Training failed: {exc}")
        else:
            set_url_params(sae=folder.name, view="list")
            st.rerun()

if not folders:
    st.info("There is no SAE for this model yet: train one above.")
    st.stop()

chosen = url_param("sae", names[0], str, names)
folder = folders[names.index(st.selectbox("SAE", names, index=names.index(chosen), format_func=lambda n: _describe(
    folders[names.index(n)]), key="sae_pick"))]
stamp = _stamp(folder)
try:
    store = load_feature_store(str(folder), stamp)
    meta = store.meta
except Exception as exc:  # a damaged or foreign folder
    st.error(f"Could not read the SAE in '{folder}': {exc}")
    st.stop()
n_features = len(store.features)
@st.cache_data(max_entries=8, show_spinner=False)
def fingerprint(model_label: str, path: str) -> str:
    return sae_v.model_fingerprint(handle)


if meta.model_fingerprint and meta.model_fingerprint != fingerprint(handle.spec.label, handle.path):
    st.warning("This SAE was trained on different weights of this model (the model was rebuilt since). Its "
               "features may no longer match: train a new SAE above.")

feature_from_url = st.query_params.get("feature")
view_default = "feature" if feature_from_url is not None else "list"
view = st.segmented_control("View", list(VIEWS), format_func=VIEWS.get, key="sae_view",
                            default=url_param("view", view_default, str, list(VIEWS))) or "list"
set_url_params(sae=folder.name, view=view)


# ---------------------------------------------------------------------------------------------
# Feature list


def show_list() -> None:
    summary = store.summary()
    row = metric_row()
    row.metric("Variance explained", f"{meta.fve:.3f}")
    row.metric("L0 (active / token)", f"{meta.l0:.1f}")
    row.metric("Dead features", f"{meta.dead} / {n_features}")
    row.metric("Cross-modal", summary["cross_modal"])
    row.metric("Text-only / image-only", f"{summary['text_only']} / {summary['image_only']}")
    row.metric("Concept ≥ 0.9 in both", summary["concept_both_ge_0.9"])
    explain(f"An SAE with {n_features} features on layer {meta.layer} of {meta.model}, measured on "
            f"{len(store.pairs.pairs)} held-out image–caption pairs ({store.pairs.dataset}). Variance explained "
            "is 1 − ‖x − x̂‖² / ‖x − mean‖²; L0 is the mean number of active features per token; dead features "
            "never fire on these pairs. A feature is cross-modal when at least 5 of its 30 strongest tokens are "
            "text and at least 5 are image patches.")
    c1, c2 = st.columns([1, 2])
    sort_by = c1.selectbox("Sort by", list(figs.SORTS), key="sae_sort",
                           index=list(figs.SORTS).index(url_param("sort", "omega", str, list(figs.SORTS))))
    # one-click toggles mirrored in the URL (labels=none when every one is off), like the sharpness page
    kinds = list(figs.LABEL_COLOURS)
    label_default = url_list("labels", ["cross-modal", "text-only", "image-only"], kinds, cast=str, allow_empty=True)
    chosen = c2.pills("Modality", kinds, selection_mode="multi", wrap=True, default=label_default, key="sae_labels",
                      help="Show the features of these modality labels (dead: never active on the held-out pairs).")
    labels = [k for k in kinds if k in (chosen or [])]
    set_url_params(sort=sort_by, labels=labels or EMPTY_LIST)
    rows = figs.sort_rows(figs.feature_rows(store), sort_by, labels)
    if not labels:
        st.info("Choose at least one modality label to list its features.")
    elif not rows:
        st.info(f"No feature of this SAE is {' or '.join(labels)}.")
    else:
        st.dataframe(rows, hide_index=True, height=380, key="sae_table", column_config={
            "omega": st.column_config.NumberColumn("ω", format="%.3f"),
            "density": st.column_config.NumberColumn(format="%.4f"),
            "text density": st.column_config.NumberColumn(format="%.4f"),
            "image density": st.column_config.NumberColumn(format="%.4f"),
        })
    explain("Each row is one SAE feature. ω (cross-modal weight) is the mean cosine between the raw residual "
            "vectors of its 5 strongest text tokens and 5 strongest image patches; under the official SAE-V rule "
            "only cross-modal features have one (0 for the others). Density is the share of tokens "
            "where it fires. Concepts are Shapes World ground truth: the attribute shared by most of its top-20 "
            "tokens, with that share as precision (\"both\": the same attribute in text and in image). Click a "
            "column header to sort.")
    c1, c2 = st.columns([1, 3])
    pick = c1.number_input("Open feature", 0, n_features - 1, int(rows[0]["feature"]) if rows else 0,
                           key="sae_open_pick")
    if c2.button("Open feature page", key="sae_open"):
        set_url_params(view="feature", feature=int(pick))
        st.session_state.pop("sae_view", None)
        st.rerun()
    st.plotly_chart(figs.feature_scatter(store), key="sae_scatter")
    explain("Each dot is a live feature. Cross-modal features (purple) with high ω bind a text concept to the "
            "image patches that show it; SAE-V scores image–caption pairs by how many such features they share.")


# ---------------------------------------------------------------------------------------------
# Feature page


def show_feature() -> None:
    initial = url_param("feature", 0, int)
    if not 0 <= initial < n_features:
        st.error(f"Feature {initial} does not exist: this SAE has features 0 to {n_features - 1}.")
        initial = 0
    index = int(st.number_input("Feature", 0, n_features - 1, initial, key="sae_feature"))
    set_url_params(feature=index)
    card = store.features[index]
    st.subheader(f"Feature {index} · {card.label}")
    row = metric_row()
    row.metric("ω (cross-modal weight)", f"{card.omega:.3f}")
    row.metric("Density", f"{card.density:.2%}")
    row.metric("Text / image density %", f"{100 * card.density_text:.1f} / {100 * card.density_image:.1f}")
    row.metric("Top-30 tokens: text / image", f"{card.n_text_top} / {card.n_image_top}")
    row.metric("Max activation", f"{card.max_act:.2f}")
    concept_bits = []
    for name, c in (("text", card.concept_text), ("image", card.concept_image), ("both", card.concept_both)):
        if c is not None and c.precision >= 0.5:
            concept_bits.append(f"{name}: **{figs.concept_label(c.name)}** (precision {c.precision:.2f} over "
                                f"{c.support} tokens)")
    if concept_bits:
        st.markdown("Ground-truth concept — " + " · ".join(concept_bits))
    elif store.pairs.dataset == "shapes":
        st.markdown("Ground-truth concept — none: no colour, shape, size or position is shared by half of its "
                    "top tokens.")
    st.caption(f"Permalink: this page's URL ends in `?feature={index}`; opening it shows this feature of this SAE.")
    if card.label == "dead":
        st.warning("This feature never fires on the held-out pairs.")

    left, right = st.columns([3, 2])
    with left:
        st.markdown("**Top text tokens** (outlined: the token; shading: activation on each word of the caption)")
        if not card.top_text:
            st.caption("No text token activates this feature.")
        for e in card.top_text[:8]:
            tokens = store.tokens[e.pair]
            st.markdown(f"<small>pair {e.pair} · {e.act:.2f}</small> "
                        + figs.highlighted_tokens_html(tokens, e.context, focus=e.index, scale=card.max_act),
                        unsafe_allow_html=True)
        explain("The captions where this feature fires most, each word shaded by the feature's activation on it "
                "(hover for the value). Activations are read from the residual stream, so a word's shading can "
                "reflect the words before it.")
    with right:
        st.plotly_chart(figs.histogram_figure(card), key="sae_hist")
        explain("How strongly the feature fires when it fires, over all held-out tokens (text and image).")
        st.markdown("**Logit lens** (tokens its decoder direction promotes)")
        st.write(", ".join(f"`{s.key}`" for s in card.logit_tokens) or "—")

    if is_vlm:
        st.markdown("**Top images** (heatmap: the feature's activation on each patch)")
        if not card.top_images:
            st.caption("No image patch activates this feature.")
        cols = st.columns(3)
        for j, e in enumerate(card.top_images):
            image = pair_image(str(folder), stamp, e.pair, handle.info.image_size)
            if image is None:
                continue
            fig = figs.image_heatmap_figure(image, e.heatmap, store.grid, f"pair {e.pair} · max {e.act:.2f}",
                                            selected=e.patch, zmax=card.max_act)
            cols[j % 3].plotly_chart(fig, key=f"sae_topimg_{j}")
        side = handle.info.image_size // store.grid if store.grid else 0
        explain("The images where this feature fires most (on their strongest patch, outlined). Colour is the "
                f"feature's activation per {side}×{side}-pixel patch (the vision tower's {store.grid}×{store.grid} "
                "grid); transparent patches are inactive.")

    c1, c2, c3 = st.columns(3)
    with c1:
        st.markdown("**Decoder neighbours** (cosine)")
        st.dataframe([{"feature": int(s.key), "cosine": s.value, "modality": store.features[int(s.key)].label}
                      for s in card.neighbours], hide_index=True, key="sae_nb")
    with c2:
        st.markdown("**Co-activating features** (correlation)")
        st.dataframe([{"feature": int(s.key), "correlation": s.value, "modality": store.features[int(s.key)].label}
                      for s in card.coactive], hide_index=True, key="sae_co")
    with c3:
        st.markdown("**Quantile samples**")
        st.dataframe([{"bin": f"{b.low:.2f}–{b.high:.2f}", "pair": e.pair, "modality": sae_v.MODALITY_NAMES[e.modality],
                       "where": store.tokens[e.pair][e.index] if e.modality == sae_v.TEXT else f"patch {e.index}",
                       "act": e.act} for b in card.quantiles for e in b.examples], hide_index=True, key="sae_q")
    explain("Neighbours: features whose decoder directions point the same way. Co-activation: Pearson correlation "
            "of activations over held-out tokens. Quantile samples: random tokens from each activation quintile, "
            "to see what weak activations mean, not only the strongest ones.")


# ---------------------------------------------------------------------------------------------
# Explain an input


@st.cache_data(max_entries=8, show_spinner="Running the model ...")
def explain_cached(folder: str, stamp: float, model_label: str, text: str, image_bytes: bytes | None):
    from PIL import Image

    sae_, meta_ = load_sae(folder, stamp)
    image = Image.open(io.BytesIO(image_bytes)).convert("RGB") if image_bytes else None
    return sae_v.explain_input(handle, sae_, meta_, text, image, per_position=16)


def _png(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _clicked_patch(event) -> int | None:
    try:
        points = event["selection"]["points"]
        data = points[0]["customdata"]
    except (TypeError, KeyError, IndexError):
        return None
    try:
        return int(data[0] if isinstance(data, (list, tuple)) else data)
    except (TypeError, ValueError, IndexError):
        return None


def show_explain() -> None:
    image = None
    default_text = store.pairs.pairs[0].text if store.pairs.pairs else ""
    if is_vlm:
        source = st.radio("Image", ["Dataset scene", "Upload"], horizontal=True, key="sae_img_source")
        if source == "Dataset scene":
            i = int(st.number_input("Scene (pair index)", 0, len(store.pairs.pairs) - 1, 0, key="sae_img_pair"))
            image = store.pairs.image(i)
            default_text = store.pairs.pairs[i].text
        else:
            upload = st.file_uploader("Upload an image", key="sae_upload")
            if upload is None:
                st.info("Choose an image file to explain.")
                return
            image, error = figs.read_image_upload(upload.getvalue(), upload.name)
            if error:
                st.error(error)
                return
    else:
        st.error(f"{handle.spec.label} is a text-only model, so the image view is not available: load a "
                 "vision-language model to explain images. The text below is still explained.")
    text = st.text_input("Text", value=default_text, max_chars=500, key="sae_text")
    if not text.strip():
        st.error("Enter some text to explain.")
        return
    try:
        result = explain_cached(str(folder), stamp, handle.spec.label, text, _png(image) if image else None)
    except ValueError as exc:
        st.error(str(exc))
        return
    if not result.totals:
        st.warning("No feature is active on this input.")
        return
    # features that fire on the image first (strongest patch first), so the map shows something
    on_image = sorted(result.image_max, key=lambda f: -result.image_max[f])
    options = (on_image + [int(s.key) for s in result.totals if int(s.key) not in result.image_max])[:60]
    left, right = st.columns([2, 3])
    with left:
        if is_vlm and image is not None:
            feature = st.selectbox("Feature to map over the image", options, key="sae_explain_feature",
                                   format_func=lambda f: f"{f} · {store.features[f].label} · max on image "
                                                         f"{result.image_max.get(f, 0.0):.2f}")
            clicked = _clicked_patch(st.session_state.get("sae_explain_map"))
            if clicked is not None and clicked != st.session_state.get("sae_patch_clicked"):
                st.session_state["sae_patch"] = clicked  # a click on the map picks the patch
                st.session_state["sae_patch_clicked"] = clicked
            patch = int(st.number_input("Patch (row-major index; or click the map)", 0, result.grid ** 2 - 1, 0,
                                        key="sae_patch"))
            heat = figs.explanation_patch_heatmap(result, feature)
            fig = figs.image_heatmap_figure(figs.fit_image(image, handle.info.image_size), heat, result.grid,
                                            f"Feature {feature} over the image", selected=patch, height=360)
            st.plotly_chart(fig, key="sae_explain_map", on_select="rerun", selection_mode="points")
            pos = next(p for p in result.positions if p.modality == sae_v.IMAGE and p.index == patch)
            st.markdown(f"**Features active on patch {patch}** (row {patch // result.grid}, column "
                        f"{patch % result.grid})")
            st.dataframe([{"feature": int(s.key), "activation": s.value, "modality": store.features[int(s.key)].label,
                           "ω": store.features[int(s.key)].omega,
                           "concept": (figs.concept_label(store.features[int(s.key)].concept_image.name)
                                       if store.features[int(s.key)].concept_image else "")}
                          for s in pos.features], hide_index=True, key="sae_patch_feats")
            explain("Pick a feature to see where it fires on the image, and a patch (outlined) to list every "
                    "feature active there. Patches are numbered row by row from the top left.")
    with right:
        st.markdown("**Features per text token**")
        st.dataframe([{"token": p.token, "features (activation)": ", ".join(f"{s.key} ({s.value:.2f})"
                                                                            for s in p.features[:6])}
                      for p in result.positions if p.modality == sae_v.TEXT], hide_index=True, key="sae_tok_feats")
        stored_rule = store.params.score_rule if store.params is not None else "official"
        active_above = sae_v.score_rule(stored_rule).cooccur_threshold
        shared, counted = figs.shared_features(result, store, active_above)
        st.markdown(f"**Features active on both text and image: {len(shared)}**; {len(counted)} of them have an ω "
                    f"and fire above {active_above:g} in both: Σω = "
                    f"{sum(store.features[f].omega for f in counted):.2f} (this pair's s_i)")
        if shared:
            st.write(", ".join(f"{f} (ω {store.features[f].omega:.2f})" if f in counted else f"{f} (no ω)"
                               for f in shared[:30]))
        explain("Every text token with its strongest features. Features active on a text token and on an image "
                "patch of the same input are 'shared'; SAE-V's score s_i adds the ω of the shared features that have "
                f"one (rule: {sae_v.SCORE_RULES.label(stored_rule)}) and fire above {active_above:g} on both sides.")


# ---------------------------------------------------------------------------------------------
# Data ranking


@st.cache_data(max_entries=8, show_spinner=False)
def ranking_cached(folder: str, stamp: float, model_label: str, by: str, threshold: float, rule: str):
    sae_, meta_ = load_sae(folder, stamp)
    store_ = load_feature_store(folder, stamp)
    with progress("Scoring pairs ...") as cb:
        return sae_v.rank_dataset(handle, sae_, meta_, store_, store_.pairs, by=by, threshold=threshold, progress=cb,
                                  rule=rule)


def show_ranking() -> None:
    if not is_vlm:
        st.error(f"Data ranking scores image–caption pairs, so it needs a vision-language model; "
                 f"{handle.spec.label} is text-only.")
        return
    rules = sae_v.SCORE_RULES
    stored_rule = store.params.score_rule if store.params is not None else "official"
    # the rule on its own row: its labels are long, and a third of the row cut them to "SAE-V official (ω…"
    rule = st.selectbox("Score rule", rules.names(), key="sae_rank_rule", format_func=rules.label,
                        index=rules.names().index(url_param("rule", stored_rule, str, rules.names())))
    s_i = sae_v.score_label(rule)
    row = field_row(gap="large")
    by = row.radio("Score", ["sum", "weighted"], horizontal=True, key="sae_rank_by", width="content",
                   index=["sum", "weighted"].index(url_param("by", "sum", str, ["sum", "weighted"])),
                   format_func={"sum": s_i, "weighted": "activation-weighted mean ω"}.get)
    default_thr = sae_v.score_rule(rule).cooccur_threshold
    threshold = row.slider("Active above", 0.0, 2.0, url_param("thr", default_thr, float, lo=0.0, hi=2.0), 0.05,
                           key=f"sae_rank_thr_{rule}", width=300,
                           help=f"A feature counts as active on a token above this activation ({default_thr:g} "
                                "for this rule).")
    set_url_params(by=by, thr=threshold, rule=rule)
    ranking = ranking_cached(str(folder), stamp, handle.spec.label, by, float(threshold), rule)
    row = metric_row()
    fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
    row.metric("ROC AUC (s_i)", fmt(ranking.roc_auc))
    row.metric("ROC AUC (weighted)", fmt(ranking.roc_auc_weighted))
    same_omega = type(sae_v.score_rule(rule)).weights is type(sae_v.score_rule(stored_rule)).weights
    row.metric("Features with ω", sum(f.omega != 0 for f in store.features) if same_omega else "—")
    row.metric("Pairs with s_i > 0", f"{sum(r.score != 0 for r in ranking.rows)} / {len(ranking.rows)}")
    explain("Each held-out image–caption pair is scored by the features active on both one of its caption tokens "
            "and one of its image patches. Official SAE-V rule: only features with at least 5 text and 5 image "
            "tokens among their 30 strongest have a cross-modal weight ω, a feature counts as active above 1, "
            "and s_i sums ω over the shared features that have one. Two labelled variants, not the paper's: "
            "*all-shared* gives every feature that fires in both modalities an ω and sums over all shared "
            "features (our earlier reading); *normalised* divides the official sum by the |ω| of the features "
            "active on either side, so a one-object scene is not outscored by a long caption of another scene. "
            "ROC AUC is the chance that a clean pair outscores a corrupted one.")

    keep = st.slider("Keep the top share of pairs by score", 0.05, 1.0,
                     url_param("keep", 0.5, float, lo=0.05, hi=1.0), 0.05, key="sae_rank_keep", format="%.2f")
    set_url_params(keep=keep)
    kept = figs.keep_summary(ranking, keep)
    base = sum(r.corrupted for r in ranking.rows) / max(len(ranking.rows), 1)
    row = metric_row()
    row.metric("Pairs kept / removed", f"{kept['kept']} / {kept['removed']}")
    row.metric("Precision: corrupted among removed", fmt(kept["precision"]),
                   help=f"Removing pairs at random would give {base:.3f}.")
    row.metric("Recall: corrupted pairs removed", fmt(kept["recall"]))
    row.metric("Clean share of what is kept", fmt(kept["clean_share_kept"]),
                   help=f"{1 - base:.3f} in the whole set.")
    keep_fig = figs.keep_curve_figure(ranking, keep)
    st.plotly_chart(keep_fig, key="sae_rank_keep_curve")
    explain(f"Filtering as in the paper: keep the {keep:.0%} of pairs with the highest score and drop the rest. "
            "Precision is the share of the dropped pairs that are corrupted (random dropping gives the dashed "
            f"base rate {base:.2f}); recall is the share of all corrupted pairs that get dropped.")

    dist = figs.score_distribution_figure(ranking)
    roc = figs.roc_figure(ranking)
    charts_side_by_side((dist, "sae_rank_dist"), (roc, "sae_rank_roc"))
    explain("Score per pair: its distribution for each pair kind (clean, caption of another scene, swapped "
            "attributes). ROC: the trade-off when keeping pairs above a score threshold.")
    st.dataframe(figs.kind_summary(ranking), hide_index=True, key="sae_rank_kinds")
    explain("Averages per pair kind: a useful score gives clean pairs a higher mean s_i and a better (lower) "
            "mean rank than corrupted ones. ROC AUC vs clean: the chance that a clean pair outscores a pair of "
            "that kind (0.5: the score cannot see that corruption; None on the clean row, the one the others are "
            "compared with).")
    rows = figs.ranking_rows(ranking)
    st.dataframe(rows, hide_index=True, height=360, key="sae_rank_table")
    st.download_button("Download ranking (CSV)", data=rows_to_csv(rows), file_name="sae-v-ranking.csv",
                       mime="text/csv", key="sae_rank_csv", on_click="ignore")
    show_filtering_experiment()
    try:
        from components.share import share_bar

        share_bar("sae", title=f"SAE-V ranking on {handle.spec.label} layer {meta.layer}",
                  params={"sae": folder.name, "by": by, "threshold": threshold, "rule": rule, "keep": keep},
                  result=ranking, model=handle.spec.label,
                  figures={"Scores": dist, "ROC": roc, "Keep": keep_fig}, tables={"ranking": rows})
    except ImportError:
        pass


def show_filtering_experiment() -> None:
    st.markdown("#### Does filtering by s_i train a better model? (the paper's experiment, demo scale)")
    results, why = figs.filtering_results(figs.FILTERING_RESULTS)
    if results is None:
        st.info("The data-filtering experiment has not been run yet"
                + ("" if why == "absent" else f" (its results file is {why})") + ": "
                "`python benchmarks/sae_v_filtering.py` writes `benchmarks/results/sae_v_filtering.json`, "
                "which this view then shows.")
        return
    st.dataframe(figs.filtering_rows(results), hide_index=True, key="sae_filter_table")
    st.plotly_chart(figs.filtering_figure(results), key="sae_filter_fig")
    pool = results.get("pool") or {}
    verdict = results.get("verdict") or {}
    bits = []
    if pool.get("pairs"):
        bits.append(f"a pool of {pool['pairs']} pairs, {pool.get('corrupted', '?')} of them corrupted")
    if isinstance(pool.get("s_i_roc_auc_clean_vs_corrupted"), (int, float)):
        bits.append(f"s_i separates them with ROC AUC {pool['s_i_roc_auc_clean_vs_corrupted']:.3f}")
    variant = pool.get("normalised_s_i") or {}
    if isinstance(variant.get("roc_auc_clean_vs_corrupted"), (int, float)):
        bits.append(f"the labelled normalised variant with {variant['roc_auc_clean_vs_corrupted']:.3f}")
    if "top_half_beats_random_half_yes_no" in verdict:
        bits.append("the top share by s_i " + ("beats" if verdict["top_half_beats_random_half_yes_no"]
                                               else "does not beat") + " a random share on yes/no accuracy")
    if "top_half_at_least_whole_pool_yes_no" in verdict:
        bits.append("and " + ("matches or beats" if verdict["top_half_at_least_whole_pool_yes_no"]
                              else "falls short of") + " training on the whole pool")
    for key, what in (("top_half_minus_random_half", "top share − random share"),
                      ("top_half_minus_whole_pool", "top share − whole pool")):
        diff = verdict.get(key)
        if isinstance(diff, dict) and isinstance(diff.get("difference"), (int, float)):
            bits.append(f"{what}: {diff['difference']:+.3f} yes/no (standard error "
                        f"{diff.get('standard_error', float('nan')):.3f})")
    explain("Stored results of `benchmarks/sae_v_filtering.py` (model "
            f"{results.get('model', '?')}, {results.get('scale', '')}): " + ", ".join(bits)
            + ". Each condition fine-tunes the same starting checkpoint; scores are measured on held-out test "
            "scenes, mean ± standard deviation over seeds.")
    if isinstance(results.get("note"), str) and results["note"].strip():
        st.caption("Benchmark note: " + results["note"])


{"list": show_list, "feature": show_feature, "explain": show_explain, "ranking": show_ranking}[view]()

"""The feature list and the parts of a feature page."""
from __future__ import annotations

from typing import Callable

import streamlit as st

from analysis import sae_v
from components.common import explain, metric_row, table as pinned_table
from components.figures import sae as figs
from components.hosting import escape_markdown

MODALITY_COLUMNS = ("text density", "image density", "concept (image)", "concept (both)", "precision (both)")


def one_modality(store: sae_v.FeatureStore) -> bool:
    """True when the store's tokens are of one modality (a language model's text): modality columns hide."""
    return store.grid == 0 or not any(f.density_image for f in store.features)


def summary(store: sae_v.FeatureStore) -> None:
    meta, n = store.meta, len(store.features)
    s = store.summary()
    row = metric_row()
    row.metric("Variance explained", f"{meta.fve:.3f}")
    row.metric("L0 (active / token)", f"{meta.l0:.1f}")
    row.metric("Dead features", f"{meta.dead} / {n}")
    if not one_modality(store):
        row.metric("Cross-modal", s["cross_modal"])
        row.metric("Text-only / image-only", f"{s['text_only']} / {s['image_only']}")
        row.metric("Concept ≥ 0.9 in both", s["concept_both_ge_0.9"])
    where = "held-out image–caption pairs" if not one_modality(store) else "texts"
    source = store.pairs.source or store.pairs.dataset
    explain(f"An SAE with {n} features on layer {meta.layer} of {escape_markdown(meta.model)} "
            f"({escape_markdown(meta.source)}), measured on "
            f"{len(store.pairs.pairs)} {where} ({escape_markdown(source)}). Variance explained is "
            "1 − ‖x − x̂‖² / ‖x − mean‖²; L0 is the mean number of active features per token; dead features never "
            "fire on these pairs."
            + (" A feature is cross-modal when at least 5 of its 30 strongest tokens are text and at least 5 are "
               "image patches." if not one_modality(store) else ""))
    if getattr(meta, "code_scale", 1.0) != 1.0:
        st.info(f"This SAE is a training checkpoint whose input scale sae-lens folds into its weights; for this "
                f"architecture ({meta.kind}) that makes its codes {meta.code_scale:.3f}× the checkpoint's own "
                "training-time codes (reconstructions are the same). The threshold 'Active above', the activations "
                "shown and steering strengths are on this scale.", icon=":material/straighten:")
    if meta.fve < 0.3 and meta.source != "trained here":
        st.warning(f"This SAE explains only {meta.fve:.0%} of the variance of layer {meta.layer} on these data: "
                   "it was probably trained on another model, another layer or very different data.")


def table(store: sae_v.FeatureStore, rows: list[dict]) -> None:
    hide = set(MODALITY_COLUMNS) | {"modality"} if one_modality(store) else set()
    shown = [{k: v for k, v in r.items() if k not in hide} for r in rows]
    pinned_table(shown, height=380, key="sae_table", column_config={  # its feature column stays in view
        "omega": st.column_config.NumberColumn("ω", format="%.3f"),
        "density": st.column_config.NumberColumn(format="%.4f"),
        "text density": st.column_config.NumberColumn(format="%.4f"),
        "image density": st.column_config.NumberColumn(format="%.4f"),
    })
    if one_modality(store):
        explain("Each row is one SAE feature of a text-only store: density is the share of tokens where it fires, "
                "max act its strongest activation. Click a column header to sort.")
        return
    explain("Each row is one SAE feature. ω (cross-modal weight) is the mean cosine between the raw residual "
            "vectors of its 5 strongest text tokens and 5 strongest image patches; under the official SAE-V rule "
            "only cross-modal features have one (0 for the others). Density is the share of tokens "
            "where it fires. Concepts are Shapes World ground truth: the attribute shared by most of its top-20 "
            "tokens, with that share as precision (\"both\": the same attribute in text and in image). Click a "
            "column header to sort.")


def scatter(store: sae_v.FeatureStore) -> None:
    st.plotly_chart(figs.feature_scatter(store), key="sae_scatter")
    explain("Each dot is a live feature. Cross-modal features (purple) with high ω bind a text concept to the "
            "image patches that show it; SAE-V scores image–caption pairs by how many such features they share.")


def feature_header(store: sae_v.FeatureStore, index: int) -> None:
    card = store.features[index]
    st.subheader(f"Feature {index} · {card.label}")
    row = metric_row()
    if not one_modality(store):
        row.metric("ω (cross-modal weight)", f"{card.omega:.3f}")
    row.metric("Density", f"{card.density:.2%}")
    if not one_modality(store):
        row.metric("Text / image density %", f"{100 * card.density_text:.1f} / {100 * card.density_image:.1f}")
        row.metric("Top-30 tokens: text / image", f"{card.n_text_top} / {card.n_image_top}")
    row.metric("Max activation", f"{card.max_act:.2f}")
    bits = [f"{name}: **{figs.concept_label(c.name)}** (precision {c.precision:.2f} over {c.support} tokens)"
            for name, c in (("text", card.concept_text), ("image", card.concept_image), ("both", card.concept_both))
            if c is not None and c.precision >= 0.5]
    if bits:
        st.markdown("Ground-truth concept — " + " · ".join(bits))
    elif store.pairs.dataset in ("shapes", "scenes"):
        st.markdown("Ground-truth concept — none: no colour, shape, size or position is shared by half of its "
                    "top tokens.")
    st.caption(f"Permalink: this page's URL ends in `?feature={index}`; opening it shows this feature of this SAE.")
    if card.label == "dead":
        st.warning("This feature never fires on these pairs.")


def feature_text(store: sae_v.FeatureStore, card: sae_v.FeatureCard) -> None:
    left, right = st.columns([3, 2])
    with left:
        st.markdown("**Top text tokens** (outlined: the token; shading: activation on each token of its text)")
        if not card.top_text:
            st.caption("No text token activates this feature.")
        for e in card.top_text[:8]:
            st.markdown(f"<small>pair {e.pair} · {e.act:.2f}</small> "
                        + figs.highlighted_tokens_html(store.tokens[e.pair], e.context, focus=e.index,
                                                       scale=card.max_act), unsafe_allow_html=True)
        explain("The texts where this feature fires most, each token shaded by the feature's activation on it "
                "(hover for the value). Activations are read from the residual stream, so a token's shading can "
                "reflect the tokens before it.")
    with right:
        st.plotly_chart(figs.histogram_figure(card), key="sae_hist")
        explain("How strongly the feature fires when it fires, over all tokens of these pairs.")
        st.markdown("**Logit lens** (tokens its decoder direction promotes)")
        st.write(", ".join(f"`{s.key}`" for s in card.logit_tokens) or "—")


def feature_images(store: sae_v.FeatureStore, card: sae_v.FeatureCard, image_of: Callable[[int], object],
                   image_size: int) -> None:
    st.markdown("**Top images** (heatmap: the feature's activation on each patch)")
    if not card.top_images:
        st.caption("No image patch activates this feature.")
    cols = st.columns(3)
    for j, e in enumerate(card.top_images):
        image = image_of(e.pair)
        if image is None:
            continue
        fig = figs.image_heatmap_figure(image, e.heatmap, store.grid, f"pair {e.pair} · max {e.act:.2f}",
                                        selected=e.patch, zmax=card.max_act)
        cols[j % 3].plotly_chart(fig, key=f"sae_topimg_{j}")
    side = image_size // store.grid if store.grid else 0
    explain("The images where this feature fires most (on their strongest patch, outlined). Colour is the "
            f"feature's activation per {side}×{side}-pixel patch (the vision tower's {store.grid}×{store.grid} "
            "grid); transparent patches are inactive.")


def feature_tables(store: sae_v.FeatureStore, card: sae_v.FeatureCard) -> None:
    c1, c2, c3 = st.columns(3)
    with c1:
        st.markdown("**Decoder neighbours** (cosine)")
        pinned_table([{"feature": int(s.key), "cosine": s.value, "modality": store.features[int(s.key)].label}
                      for s in card.neighbours], key="sae_nb")
    with c2:
        st.markdown("**Co-activating features** (correlation)")
        pinned_table([{"feature": int(s.key), "correlation": s.value, "modality": store.features[int(s.key)].label}
                      for s in card.coactive], key="sae_co")
    with c3:
        st.markdown("**Quantile samples**")
        pinned_table([{"bin": f"{b.low:.2f}–{b.high:.2f}", "pair": e.pair,
                       "modality": sae_v.MODALITY_NAMES[e.modality],
                       "where": store.tokens[e.pair][e.index] if e.modality == sae_v.TEXT else f"patch {e.index}",
                       "act": e.act} for b in card.quantiles for e in b.examples], key="sae_q")
    explain("Neighbours: features whose decoder directions point the same way. Co-activation: Pearson correlation "
            "of activations over these tokens. Quantile samples: random tokens from each activation quintile, "
            "to see what weak activations mean, not only the strongest ones.")

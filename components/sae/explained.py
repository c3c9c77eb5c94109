"""An explained input: the features on every text token, a feature mapped over the image, a clicked patch."""
from __future__ import annotations

import streamlit as st

from analysis import sae_v
from components.common import explain, table as pinned_table
from components.figures import sae as figs


def clicked_patch(event) -> int | None:
    try:
        points = event["selection"]["points"]
        data = points[0]["customdata"]
    except (TypeError, KeyError, IndexError):
        return None
    try:
        return int(data[0] if isinstance(data, (list, tuple)) else data)
    except (TypeError, ValueError, IndexError):
        return None


def _label(store: sae_v.FeatureStore, f: int) -> str:
    return store.features[f].label if 0 <= f < len(store.features) else "?"


def image_side(result: sae_v.InputExplanation, store: sae_v.FeatureStore, image) -> None:
    """Pick a feature to map over the image (as the tower sees it) and a patch (typed, or clicked on the map) to
    list its features."""
    on_image = sorted(result.image_max, key=lambda f: -result.image_max[f])
    options = (on_image + [int(s.key) for s in result.totals if int(s.key) not in result.image_max])[:60]
    feature = st.selectbox("Feature to map over the image", options, key="sae_explain_feature",
                           format_func=lambda f: f"{f} · {_label(store, f)} · max on image "
                                                 f"{result.image_max.get(f, 0.0):.2f}")
    clicked = clicked_patch(st.session_state.get("sae_explain_map"))
    if clicked is not None and clicked != st.session_state.get("sae_patch_clicked"):
        st.session_state["sae_patch"] = clicked  # a click on the map picks the patch
        st.session_state["sae_patch_clicked"] = clicked
    patch = int(st.number_input("Patch (row-major index; or click the map)", 0, result.grid ** 2 - 1, 0,
                                key="sae_patch"))
    heat = figs.explanation_patch_heatmap(result, feature)
    fig = figs.image_heatmap_figure(image, heat, result.grid,
                                    f"Feature {feature} over the image", selected=patch, height=360)
    st.plotly_chart(fig, key="sae_explain_map", on_select="rerun", selection_mode="points")
    pos = next(p for p in result.positions if p.modality == sae_v.IMAGE and p.index == patch)
    st.markdown(f"**Features active on patch {patch}** (row {patch // result.grid}, column {patch % result.grid})")
    rows = []
    for s in pos.features:
        card = store.features[int(s.key)] if int(s.key) < len(store.features) else None
        rows.append({"feature": int(s.key), "activation": s.value, "modality": card.label if card else "?",
                     "ω": card.omega if card else None,
                     "concept": figs.concept_label(card.concept_image.name) if card and card.concept_image else ""})
    pinned_table(rows, key="sae_patch_feats")
    explain("Pick a feature to see where it fires on the image, and a patch (outlined) to list every "
            "feature active there. Patches are numbered row by row from the top left.")


def text_side(result: sae_v.InputExplanation, store: sae_v.FeatureStore, image) -> None:
    st.markdown("**Features per text token**")
    pinned_table([{"token": p.token, "features (activation)": ", ".join(f"{s.key} ({s.value:.2f})"
                                                                        for s in p.features[:6])}
                  for p in result.positions if p.modality == sae_v.TEXT], key="sae_tok_feats")
    if image is None:
        explain("Every text token with its strongest features (activation in the SAE's units).")
        return
    stored_rule = store.params.score_rule if store.params is not None else "official"
    rule = store.params.rule() if store.params is not None else sae_v.score_rule()
    active_above = rule.cooccur_threshold
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

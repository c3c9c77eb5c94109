"""Steering side by side: the unsteered and the steered output, with the tokens that changed marked."""
from __future__ import annotations

import streamlit as st

from analysis import sae_v
from components.common import explain
from components.figures import sae as figs


def side_by_side(result: sae_v.SteeringResult) -> None:
    features = ", ".join(f"{k} at {v:g}" for k, v in sorted(result.features.items()))
    verb = "added" if result.mode == "add" else "clamped"
    left, right = st.columns(2)
    with left:
        st.markdown("**Unsteered**")
        st.markdown(figs.steered_html(result.unsteered, "#1565c0"), unsafe_allow_html=True)
    with right:
        st.markdown(f"**Steered** (feature {features}, {verb})")
        st.markdown(figs.steered_html(result.steered), unsafe_allow_html=True)
    changed = sum(result.steered.changed)
    if result.changed:
        st.caption(f"{changed} of {len(result.steered.tokens)} steered tokens differ from the unsteered output "
                   "(marked).")
    else:
        st.caption("The output did not change: try a larger strength, or another feature.")
    explain(f"Both outputs are greedy continuations of the same prompt ({result.prompt[:80]!r}"
            f"{'…' if len(result.prompt) > 80 else ''}). In the steered one the features' decoder directions are "
            f"{verb} in the residual stream after layer {result.layer}, at every position (the prompt's text and "
            "image tokens and each new token), scaled by the strength (in the SAE's activation units). Marked "
            "tokens are those the other output does not have at that place.")

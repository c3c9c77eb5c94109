"""The glossary: every symbol and term the pages use, in one sentence each, and where it is defined.

    GLOSSARY["ω"].meaning   # what the cross-modal weight says, in words
    symbols_in(text)        # the symbols a text uses (Greek letters, s_i, CHAIR_i, ΔNLL, KL, ...)

The glossary page (views/glossary.py) lists it; tests/unit/test_glossary.py fails when a page's text uses
a symbol this table lacks, and when a plain sentence (components/plain.py, a talk's narration) uses one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import streamlit as st


@dataclass(frozen=True)
class Term:
    symbol: str
    name: str
    meaning: str  # one sentence, no other symbol needed to follow it
    defined: str  # where it is defined: the paper (and its part), or this app's page
    pages: tuple[str, ...]  # the pages that use it (URL paths)


SHARP = "Softmax is not enough (Veličković et al., ICML 2025)"
TERMS = (
    Term("δ", "logit spread", "How far the largest attention score sits above the others; the larger it is, the "
         "more a head can focus on one item.", f"{SHARP}: the dispersion lemma's bound on the logits.",
         ("attention-sharpness",)),
    Term("θ", "temperature", "The number every attention score is divided by before the softmax: a low "
         "temperature makes attention sharper, a high one flatter.", f"{SHARP}: the lemma's softmax with "
         "temperature; its adaptive temperature sets it per row.", ("attention-sharpness",)),
    Term("β", "adaptive sharpening factor", "The factor the adaptive rule multiplies a row of attention scores "
         "by when the row is spread out (never below 1).", f"{SHARP}: the adaptive temperature, a polynomial "
         "fitted on the row's entropy.", ("attention-sharpness",)),
    Term("H", "entropy", "How spread out a distribution is, in nats: 0 when all the weight is on one item, ln n when "
         "it is even over n items; on the caption page, the verifier's doubt about one claim.",
         f"{SHARP} (attention rows); CapMAS (ICML 2025) for a claim's uncertainty.",
         ("attention-sharpness", "caption-correction")),
    Term("ln n", "the entropy of an even spread", "The largest entropy n items can have: every item gets the same "
         "weight.", "Information theory; drawn as the dotted reference on the attention-sharpness page.",
         ("attention-sharpness",)),
    Term("1/n", "an even share", "The weight each of n items gets when attention is spread evenly.",
         f"{SHARP}: the lemma's limit at a fixed temperature.", ("attention-sharpness",)),
    Term("e^", "the exponential", "e raised to a power: the lemma bounds each attention weight by e^(δ/θ)/n "
         "from above and e^(−δ/θ)/n from below.", f"{SHARP}: the dispersion lemma.", ("attention-sharpness",)),
    Term("τ", "contribution threshold", "The smallest share of a layer's update a part must carry for the "
         "contribution graph to keep it: a higher threshold keeps fewer, stronger routes.",
         "Information flow routes (Ferrando & Voita, 2024): the pruning threshold of the graph.", ("residual-stream",)),
    Term("ω", "cross-modal weight", "How evenly a sparse-autoencoder feature fires on caption words and on image "
         "patches: near 1 for a feature that fires on both, near 0 for one that fires on one kind only.",
         "SAE-V (ICML 2025): the cross-modal weight of a feature.", ("sae-features",)),
    Term("s_i", "pair score", "How many cross-modal features an image and its caption share: a caption of another "
         "scene shares fewer and ranks lower.", "SAE-V (ICML 2025): the score that ranks image-text pairs for "
         "data filtering.", ("sae-features",)),
    Term("π", "keep threshold", "The most doubt a claim may carry and still be kept in the corrected caption: at 0 "
         "only the claims the verifier is sure of survive.", "CapMAS (ICML 2025): the threshold on a claim's "
         "uncertainty.", ("caption-correction",)),
    Term("CHAIR_i", "hallucinated objects", "The share of the objects a caption mentions that are not in the "
         "picture.", "Rohrbach et al. 2018, Object Hallucination in Image Captioning: the per-instance CHAIR "
         "metric.", ("caption-correction",)),
    Term("ε", "tolerance", "A small number: on the prompt-reconstruction page the largest difference still "
         "counted as an exact match; on the caption page the floor that keeps a doubt finite.",
         "Hidden No More (ICML 2025) for the match; this app's caption page for the floor.",
         ("prompt-reconstruction", "caption-correction")),
    Term("σ", "noise strength", "How much random noise a defence adds to the model's inner numbers, in units of "
         "their usual spread.", "Hidden No More (ICML 2025): the noise defence it evaluates.",
         ("prompt-reconstruction",)),
    Term("Σ", "sum", "Adds up the terms after it; Σ V^(g+1) is the cost of guessing every gap of a shard by brute "
         "force, V the vocabulary size and g the gap.", "Cascade (ICML 2025): the cost of inverting one party's "
         "shard.", ("prompt-reconstruction", "sae-features")),
    Term("KL", "KL divergence", "How different two next-word predictions are, in nats: KL(full‖policy) is 0 when "
         "the policy's small memory predicts exactly as the full memory does.", "Kullback and Leibler 1951; "
         "computed per predicted token on the KV-cache and residual-stream pages.",
         ("kv-cache", "residual-stream")),
    Term("ΔNLL", "extra surprise", "How much more surprised (negative log-likelihood, nats per token) the model is "
         "by the true next token with the small memory than with the full one.", "This app's KV-cache page: "
         "the equal-entries table.", ("kv-cache",)),
)
GLOSSARY: dict[str, Term] = {t.symbol: t for t in TERMS}

# A symbol in page text: a Greek letter (ΔNLL as one), a one-letter or capitalised name with an index (s_i,
# CHAIR_i), KL, ln n, 1/n, e^.
SYMBOL = re.compile(r"Δ[A-Za-z]+|[\u0370-\u03ff]|\b(?:[a-z]|[A-Z]{2,})_[a-z]\b|\bKL\b|\bln n\b|\b1/n\b|\be\^")


def symbols_in(text: str) -> set[str]:
    """The symbols `text` uses, as the glossary spells them."""
    return set(SYMBOL.findall(text))


def missing(text: str) -> set[str]:
    """The symbols of `text` the glossary lacks."""
    return {s for s in symbols_in(text) if s not in GLOSSARY}


def draw() -> None:
    """The glossary page: one row per term, symbol first."""
    from components.hosting import escape_markdown

    st.title("Glossary")
    st.write("Every symbol the pages use, in one sentence, and where it is defined.")
    for t in TERMS:
        st.markdown(f"**{escape_markdown(t.symbol)}** — *{escape_markdown(t.name)}*. "
                    f"{escape_markdown(t.meaning)}  \n"
                    f":small[Defined in: {escape_markdown(t.defined)} Used on: {', '.join(t.pages)}.]")

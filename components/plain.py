"""Two levels of words (#48): each page's plain sentence (what it shows and why it matters, no symbols) and
the hook that draws it above the researcher's note (the page's own intro), which it folds.

    first(view)   # components/view.py's render(), right under the title

Keyed by the panel's name in analysis/framework/panels.py; tests/unit/test_glossary.py holds every sentence
to the rule: no symbol from the glossary (components/glossary.py).
"""
from __future__ import annotations

import streamlit as st

PLAIN: dict[str, str] = {
    "sae": "A sparse autoencoder splits what a vision-language model computes into features, and this page finds "
           "the ones that fire on both a caption's words and the picture's patches, then uses them to rank "
           "image and caption pairs and to move an object in a generated caption.",
    "sharpness": "A model that must pick the one right item from a list spreads its attention thinner as the "
                 "list grows, and this page measures how fast that happens and whether a proposed fix helps.",
    "kv": "A model keeps a note of every word it has read, and this page cuts that memory to a fixed size with "
          "several rules and shows which facts each rule forgets and how much memory it saves.",
    "captions": "A captioning model sometimes describes things that are not in the picture, and this page checks "
                "each claim of a caption against the image and rewrites the caption without the doubtful ones.",
    "invert": "The numbers a model computes halfway through still hold the prompt, and this page rebuilds the "
              "prompt word by word from them and tests the defences people propose.",
    "residual": "This page reads what the model is about to say after each of its layers and swaps pieces between "
                "two runs to find where the answer is carried.",
}


def sentence(panel: str) -> str:
    return PLAIN.get(panel, "")


def first(view) -> None:
    """The plain sentence, then the page's intro folded as the researcher's note (as it was when there is no
    plain sentence for the page)."""
    plain = sentence(view.panel)
    if not plain:
        _note(view)
        return
    st.markdown(f"**{plain}**")
    if view.intro or view.intro_caption:
        with st.expander("The researcher's note"):
            _note(view)


def _note(view) -> None:
    if view.intro:
        st.write(view.intro)
    if view.intro_caption:
        st.caption(view.intro_caption)

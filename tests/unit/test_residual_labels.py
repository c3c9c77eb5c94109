"""Residual stream figure labels a person reads: space tokens visible, component names as the page names them."""
from __future__ import annotations

from analysis import residual
from components.figures import residual as F


def test_a_whitespace_token_is_drawn_as_its_sign_not_a_blank_cell():
    assert [F.visible(t) for t in (" ", "\n", "  ", "\t", "")] == ["␣", "↵", "␣␣", "⇥", "∅"]
    assert F.visible(" Paris") == " Paris" and F.visible("a") == "a"


def test_patching_titles_name_the_component_as_the_page_does(tiny_llama):
    params = residual.ResidualParams(pair="own", prompt="w1 w2 w3", corrupt="w1 w4 w3", components=["mlp", "heads"],
                                     methods=["attribution"])
    result = residual.patch(tiny_llama, params)
    assert F.patch_figure(result, "mlp").layout.title.text.startswith("MLP output:")  # was "Mlp:"
    assert F.patch_figure(result, "heads").layout.title.text.startswith("Attention heads:")

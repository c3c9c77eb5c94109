"""A metric card's arrow means a change: none for a zero change ("↑ 0.000") or for words under the value
("0.0e+00 ↑ max |difference|"), as every page's metric_row() draws them."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest


def _cards():
    from components.common import metric_row

    row = metric_row()
    row.metric("zero change", "0.512", "0.000")
    row.metric("a change", "0.512", "+0.120")
    row.metric("negative", "0.512", "-0.3")
    row.metric("words", "0.0e+00", "max |difference|")
    row.metric("words with a number", "'75'", "P = 0.93 at the last layer")


def test_only_a_nonzero_change_gets_an_arrow():
    at = AppTest.from_function(_cards, default_timeout=120).run()
    assert not at.exception
    arrows = {m.label: m.proto.direction for m in at.metric}
    none, up, down = 2, 1, 0  # MetricProto.MetricDirection
    assert arrows == {"zero change": none, "a change": up, "negative": down, "words": none,
                      "words with a number": none}, arrows


def _headline():
    import streamlit as st

    from components.view import Headline, Metric, draw_headline

    draw_headline(st.container(), Headline((Metric("Key-value accuracy", "100%", "+0% vs full"),
                                            Metric("Item recall", "50%", "-25% vs full"),
                                            Metric("Cache at last step", "3.0 KiB", "24 entries/head",
                                                   delta_color="off"))))


def test_a_headline_card_draws_no_arrow_on_a_zero_change():
    """The KV headline's "+0% vs full" drew an up arrow (issue #47): headline cards follow metric_row's rule."""
    at = AppTest.from_function(_headline, default_timeout=120).run()
    assert not at.exception
    arrows = {m.label: m.proto.direction for m in at.metric}
    none, down = 2, 0
    assert arrows == {"Key-value accuracy": none, "Item recall": down, "Cache at last step": none}, arrows

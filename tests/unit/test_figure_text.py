"""components.figures.text: titles broken to fit narrow charts."""
from __future__ import annotations

import plotly.graph_objects as go

from components.figures.text import TITLE_LINE_PX, set_title, wrap


def test_wrap_breaks_at_spaces_into_short_lines_and_keeps_every_word():
    text = "Work per position: candidates scored and the true token's rank"
    lines = wrap(text, 20).split("<br>")
    assert lines == ["Work per position:", "candidates scored", "and the true token's", "rank"]
    assert " ".join(lines) == text and all(len(line) <= 20 for line in lines)
    assert wrap("short", 20) == "short"
    assert wrap("a extraordinarily-long-word b", 5) == "a<br>extraordinarily-long-word<br>b"


def test_set_title_keeps_top_margin_for_each_extra_line():
    one = set_title(go.Figure(), "One line", chars=60, top=50)
    three = set_title(go.Figure(), "word " * 30, chars=60, top=80)
    assert one.layout.margin.t == 50 and one.layout.title.text == "One line"
    assert three.layout.title.text.count("<br>") == 2 and three.layout.margin.t == 80 + 2 * TITLE_LINE_PX
    # both hang from the top of the figure; several lines sit lower (Plotly lifts them)
    assert one.layout.title.yanchor == three.layout.title.yanchor == "top"
    assert three.layout.title.pad.t > one.layout.title.pad.t

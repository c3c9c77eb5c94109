"""Text that fits inside a Plotly figure on a 1024-px projector as well as on a wide screen.

Plotly neither wraps a title nor moves one axis's title out of the next panel's way: at 1024 px a
long title runs off the chart's edge, and side-by-side panels' titles run into each other. These
helpers break titles at word boundaries and set up one row of panels with room between them. The
browser test measures the result (no chart text overlaps another or leaves its chart).
"""
from __future__ import annotations

import plotly.graph_objects as go

TITLE_LINE_PX = 22  # one more title line needs this much more top margin


def wrap(text: str, chars: int) -> str:
    """`text` broken with <br> at spaces into lines of at most `chars` characters (a longer word
    keeps its own line)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= chars:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(lines)


def set_title(fig: go.Figure, text: str, chars: int = 60, top: int = 50) -> go.Figure:
    """Title `text` wrapped at `chars` characters, with `top` px of margin for its first line and
    TITLE_LINE_PX more for each further one."""
    wrapped = wrap(text, chars)
    more = wrapped.count("<br>")
    # anchored at the top of the figure, so further lines grow down into the margin kept for them
    # (Plotly sets a title of several lines about 12 px higher than one line: pad it that much more)
    fig.update_layout(title=dict(text=wrapped, yref="container", y=1.0, yanchor="top",
                                 pad=dict(t=26 if more else 14)),
                      margin=dict(t=top + TITLE_LINE_PX * more))
    return fig


def legend_below(fig: go.Figure, bottom: int = 110) -> go.Figure:
    """A horizontal legend at the bottom of the figure, under the x-axis titles (one placed at a fixed
    fraction under the plot lands on them when the figure is short), with `bottom` px kept for both."""
    fig.update_layout(legend=dict(orientation="h", yref="container", y=0.0, yanchor="bottom", x=0.0),
                      margin=dict(b=bottom))
    return fig


def panel_titles(fig: go.Figure, size: int = 14) -> go.Figure:
    """Subplot titles a little smaller than Plotly's 16 px, so three fit over three narrow panels."""
    fig.update_annotations(font_size=size)
    return fig

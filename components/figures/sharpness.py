"""Plotly figures of the attention sharpness panel: pure functions of analysis results."""
from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from analysis.sharpness import (
    HeadStats, LemmaResult, PromptResult, SweepResult, adaptive_beta, beta_curve, sharpening_interval,
)
from components.figures.memo import shared_figure
from components.figures.text import legend_below, panel_titles, set_title

SOFTMAX_COLOUR = "#636efa"
ADAPTIVE_COLOUR = "#ef553b"
REFERENCE = dict(color="grey", dash="dot")
MAX_LAYER_LEGEND = 12  # more layers than this: one colour scale instead of a legend entry per layer
LAYER_SCALE = "Viridis"
# one colour per fixed temperature of the lemma figure, the same on both of its panels (left to
# Plotly's colour cycle, each panel's entropy curve took the next trace's colour, not its own)
THETA_COLOURS = ["#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#bcbd22", "#e377c2"]
N_COLOURS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#b5de2b", "#fde725", "#f89540", "#cc4778", "#7e03a8"]


def _stats(run, sink: bool) -> HeadStats:
    return run.with_sink if sink else run.without_sink


def _sink_note(sink: bool) -> str:
    return "" if sink else " (first token excluded)"


@shared_figure
def lemma_figure(result: LemmaResult) -> go.Figure:
    """p_max and entropy vs n for each θ and the adaptive rule, with 1/n and ln n references."""
    ns = result.params.ns
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Weight on the maximum", "Entropy of the weights"),
                        horizontal_spacing=0.14)
    fixed = 0
    for curve in result.curves:
        if curve.label.startswith("adaptive"):
            style = dict(color=ADAPTIVE_COLOUR, width=3)
        else:
            style = dict(color=THETA_COLOURS[fixed % len(THETA_COLOURS)])
            fixed += 1
        fig.add_scatter(x=ns, y=curve.p_max, name=curve.label, legendgroup=curve.label, line=style,
                        row=1, col=1)
        fig.add_scatter(x=ns, y=curve.entropy, name=curve.label, legendgroup=curve.label, line=style,
                        showlegend=False, row=1, col=2)
    fig.add_scatter(x=ns, y=result.uniform, name="1/n (uniform)", line=REFERENCE, row=1, col=1)
    fig.add_scatter(x=ns, y=result.log_n, name="ln n (uniform)", line=REFERENCE, showlegend=False, row=1, col=2)
    fig.update_xaxes(type="log", title_text="number of items n (log scale)", tickvals=[n for n in ns if n in (2, 16, 128, 1024, 8192)] or ns)
    fig.update_yaxes(type="log", title_text="p_max (probability, log scale)", dtick=1, exponentformat="power",
                     row=1, col=1)  # one tick per power of ten (the 2s and 5s between crowded the axis)
    fig.update_yaxes(title_text="entropy H (nats)", row=1, col=2)
    fig.update_layout(legend_title_text="temperature", height=470)
    set_title(fig, f"Lemma: one logit δ = {result.params.spread:g} above n - 1 equal ones", top=80)
    return panel_titles(legend_below(fig))


@shared_figure
def size_figure(result: SweepResult, layer: int, head: int, sink: bool = True) -> go.Figure:
    """Entropy, max weight and the answer item's weight of one head vs n, softmax vs adaptive θ."""
    ns = [p.n for p in result.points]
    item = "Max item's weight" if result.item == "max-item" else "Answer's weight"
    fig = make_subplots(rows=1, cols=3, subplot_titles=("Entropy H / ln n", "Largest weight", item),
                        horizontal_spacing=0.15)
    for label, colour in (("softmax", SOFTMAX_COLOUR), ("adaptive θ", ADAPTIVE_COLOUR)):
        runs = [_stats(p.run(label), sink) for p in result.points]
        for col, field in enumerate(("entropy_norm", "max_weight", "target_weight"), start=1):
            fig.add_scatter(x=ns, y=[getattr(s, field)[layer][head] for s in runs], name=label,
                            legendgroup=label, showlegend=col == 1, mode="lines+markers",
                            line=dict(color=colour), row=1, col=col)
    fig.add_scatter(x=ns, y=[1.0 / n for n in ns], name="1/n", line=REFERENCE, row=1, col=3)
    fig.update_xaxes(type="log", title_text="items n (log scale)", tickvals=ns)
    fig.update_yaxes(title_text="H / ln(keys) (1 = uniform)", range=[0, 1.05], row=1, col=1)
    fig.update_yaxes(title_text="probability", range=[0, 1.05], row=1, col=2)
    fig.update_yaxes(title_text="probability", range=[0, 1.05], row=1, col=3)
    fig.update_layout(height=440)
    set_title(fig, f"Layer {layer}, head {head}: dispersion as n grows{_sink_note(sink)}", top=80)
    return panel_titles(legend_below(fig, bottom=100))


@shared_figure
def theta_sweep_figure(result: SweepResult, layer: int, head: int, sink: bool = True) -> go.Figure:
    """Entropy and max weight of one head, and P(correct answer), vs θ; one curve per n."""
    fixed = sorted((r.rule.theta if r.rule.mode == "fixed" else 1.0, r.rule.label)
                   for r in result.points[0].runs if r.rule.mode != "adaptive")
    labels = [label for _, label in fixed] + ["adaptive θ"]
    ticks = [f"{t:g}" for t, _ in fixed] + ["adaptive"]
    fig = make_subplots(rows=1, cols=3, subplot_titles=("Entropy H", "Largest weight", "P(correct answer)"),
                        horizontal_spacing=0.15)
    for i, p in enumerate(result.points):
        runs = [p.run(label) for label in labels]
        name = f"n = {p.n}"
        line = dict(color=N_COLOURS[i % len(N_COLOURS)])
        fig.add_scatter(x=ticks, y=[_stats(r, sink).entropy[layer][head] for r in runs], name=name,
                        legendgroup=name, mode="lines+markers", line=line, row=1, col=1)
        fig.add_scatter(x=ticks, y=[_stats(r, sink).max_weight[layer][head] for r in runs], name=name,
                        legendgroup=name, mode="lines+markers", line=line, showlegend=False, row=1, col=2)
        fig.add_scatter(x=ticks, y=[r.answer_prob for r in runs], name=name, legendgroup=name,
                        mode="lines+markers", line=line, showlegend=False, row=1, col=3)
    fig.update_xaxes(type="category", title_text="temperature θ")
    fig.update_yaxes(title_text="nats", row=1, col=1)
    fig.update_yaxes(title_text="probability", range=[0, 1.05], row=1, col=2)
    fig.update_yaxes(title_text="probability", range=[0, 1.05], row=1, col=3)
    fig.update_layout(legend_title_text="items", height=440)
    set_title(fig, f"Temperature sweep, layer {layer} head {head}: every head at θ (1 = softmax), last the "
                   f"adaptive rule{_sink_note(sink)}", top=80)
    return panel_titles(legend_below(fig, bottom=100))


@shared_figure
def beta_figure(result: SweepResult, n: int) -> go.Figure:
    """β(H) of the adaptive rule, the sharpening band shaded, and every head's observed (H, β) at n."""
    point = next(p for p in result.points if p.n == n)
    run = point.run("adaptive θ")
    threshold = run.rule.rule.min_entropy
    h, beta = beta_curve(8.0, min_entropy=threshold)
    lo, hi = sharpening_interval()
    lo = max(lo, threshold)
    fig = go.Figure()
    fig.add_vrect(x0=lo, x1=hi, fillcolor=ADAPTIVE_COLOUR, opacity=0.08, line_width=0,
                  annotation_text=f"sharpens: {lo:.2f} < H < {hi:.2f} nats", annotation_position="top left")
    fig.add_scatter(x=h, y=beta, name=f"β(H) = max(poly(H), 1) for H > {threshold:g}", line=dict(color="black"))
    # a deep model's layers by one colour scale (a legend of 30 entries ran past the chart), a shallow one's
    # by name
    many = result.layers > MAX_LAYER_LEGEND
    if many:
        fig.add_scatter(x=[None], y=[None], mode="markers", name="layer scale", showlegend=False, hoverinfo="skip",
                        marker=dict(color=[0], cmin=0, cmax=result.layers - 1, colorscale=LAYER_SCALE,
                                    showscale=True, colorbar=dict(title=dict(text="layer"), thickness=12)))
    for layer in range(result.layers):
        h_mean = run.with_sink.raw_entropy[layer]
        colour = (dict(color=sample_colorscale(LAYER_SCALE, layer / max(result.layers - 1, 1))[0]) if many
                  else {})
        fig.add_scatter(
            x=h_mean, y=adaptive_beta(torch.tensor(h_mean, dtype=torch.float64), threshold).tolist(), mode="markers",
            name=f"layer {layer}", marker=dict(size=10, **colour), showlegend=not many,
            customdata=run.with_sink.beta[layer],
            text=[f"layer {layer}, head {k}" for k in range(result.heads)],
            hovertemplate="%{text}<br>mean H = %{x:.2f} nats<br>β(mean H) = %{y:.2f}"
                          "<br>mean β applied = %{customdata:.2f}<extra></extra>",
        )
    fig.update_xaxes(title_text="entropy H of softmax(s) at the answer position (nats)", range=[0, 8])
    fig.update_yaxes(title_text="inverse temperature β (1 = unchanged)")
    fig.update_layout(height=440)
    set_title(fig, f"Adaptive temperature rule; dots: each head at its mean observed entropy at n = {n}")
    return fig


@shared_figure
def heatmap_figure(result: SweepResult, n: int, sink: bool = True) -> go.Figure:
    """Layer x head normalised entropy H / ln n, softmax vs adaptive θ, on one colour scale."""
    point = next(p for p in result.points if p.n == n)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("softmax", "adaptive θ"), horizontal_spacing=0.08,
                        shared_yaxes=True)
    for col, label in enumerate(("softmax", "adaptive θ"), start=1):
        z = _stats(point.run(label), sink).entropy_norm
        fig.add_heatmap(z=z, x=list(range(result.heads)), y=list(range(result.layers)), zmin=0, zmax=1,
                        colorscale="Viridis", showscale=col == 2, colorbar=dict(title="H / ln n"),
                        text=[[f"{v:.2f}" for v in row] for row in z], texttemplate="%{text}",
                        hovertemplate="layer %{y}, head %{x}: %{z:.3f}<extra></extra>", row=1, col=col)
    fig.update_xaxes(title_text="head", dtick=1)
    fig.update_yaxes(dtick=1, autorange="reversed")
    fig.update_yaxes(title_text="layer", row=1, col=1)  # the panels share their layers
    fig.update_layout(height=max(300, 60 * result.layers + 160))
    set_title(fig, f"Normalised entropy per head at n = {n}{_sink_note(sink)} (0 sharp, 1 uniform)", top=80)
    return fig


@shared_figure
def accuracy_figure(result: SweepResult) -> go.Figure:
    rows = result.accuracy_table()
    ns = [r["n"] for r in rows]
    fig = go.Figure()
    fig.add_scatter(x=ns, y=[r["softmax accuracy"] for r in rows], name="softmax", mode="lines+markers",
                    line=dict(color=SOFTMAX_COLOUR))
    fig.add_scatter(x=ns, y=[r["adaptive accuracy"] for r in rows], name="adaptive θ", mode="lines+markers",
                    line=dict(color=ADAPTIVE_COLOUR))
    if all("chance" in r for r in rows):
        fig.add_scatter(x=ns, y=[r["chance"] for r in rows], name="chance (1 / candidates)", line=REFERENCE)
    fig.update_xaxes(type="log", title_text="items in the prompt n (log scale)", tickvals=ns)
    fig.update_yaxes(title_text="accuracy (share of prompts answered right)", range=[0, 1.05])
    fig.update_layout(title=f"{result.task.capitalize()} accuracy vs n", height=360)
    return fig


@shared_figure
def retrieval_heads_figure(result: SweepResult, k: int = 3) -> go.Figure:
    """The weight each of the k retrieval heads puts on the answer item vs n, softmax (solid), adaptive θ (dotted)."""
    ns = [p.n for p in result.points]
    heads = result.retrieval_heads(k)
    fig = go.Figure()
    for i, (layer, head) in enumerate(heads):
        colour = THETA_COLOURS[i % len(THETA_COLOURS)]
        for label, dash in (("softmax", "solid"), ("adaptive θ", "dot")):
            fig.add_scatter(x=ns, y=[p.run(label).with_sink.target_weight[layer][head] for p in result.points],
                            name=f"L{layer}H{head}, {label}", mode="lines+markers",
                            line=dict(color=colour, dash=dash))
    fig.add_scatter(x=ns, y=[1.0 / n for n in ns], name="1/n (uniform over items)", line=REFERENCE)
    fig.update_xaxes(type="log", title_text="items in the prompt n (log scale)", tickvals=ns)
    fig.update_yaxes(title_text=f"weight on the {result.item.replace('-', ' ')} (probability)", range=[0, 1.05])
    fig.update_layout(height=400)
    set_title(fig, f"The retrieval heads found (most weight on the answer item at n = {ns[0]}) as n grows")
    return legend_below(fig)


@shared_figure
def prompt_weights_figure(result: PromptResult, layer: int, head: int) -> go.Figure:
    """The last token's attention over the prompt for one head, softmax vs the chosen temperature."""
    x = [f"{i}:{t}" for i, t in enumerate(result.tokens)]
    fig = go.Figure()
    fig.add_bar(x=x, y=result.weights_softmax[layer][head], name="softmax", marker_color=SOFTMAX_COLOUR)
    fig.add_bar(x=x, y=result.weights_tempered[layer][head], name=result.params.rule.label,
                marker_color=ADAPTIVE_COLOUR)
    for pos in result.target_positions:
        fig.add_vline(x=pos, line=dict(color="green", dash="dash"))
    fig.update_xaxes(title_text="key token (position:token)", type="category")
    fig.update_yaxes(title_text="last token's weight", range=[0, 1.05])
    fig.update_layout(title=f"Layer {layer}, head {head}: where the last token looks", barmode="group", height=420)
    return fig

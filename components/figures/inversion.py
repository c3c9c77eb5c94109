"""Figures and tables for the prompt-reconstruction panel (pure functions of the typed results)."""
from __future__ import annotations

import html
import math

import plotly.graph_objects as go

from analysis.inversion import (
    AttackResult, CascadeResult, LayerSweep, NoiseSweep, SpeedComparison, defence_label,
)
from components.figures.memo import shared_figure
from components.figures.text import legend_below, panel_titles, set_title

GOOD, BAD, UNSEEN = "#2e9b4f", "#d1495b", "#d9d9d9"


def tokens_html(result: AttackResult) -> str:
    """Original tokens over recovered ones, green when equal, red when not (all text escaped)."""
    cells = []
    for t in result.tokens:
        colour = GOOD if t.correct else BAD
        tip = html.escape(f"position {t.position}: distance {t.distance:.3g}, rank {t.rank or 'not reached'}, "
                          f"{t.evaluations} candidates", quote=True)
        cells.append(
            f'<span title="{tip}" style="display:inline-block;margin:2px;padding:2px 6px;border-radius:4px;'
            f'border:1px solid {colour};font-family:monospace;text-align:center">'
            f'<span style="color:#666">{html.escape(t.true_token)}</span><br>'
            f'<span style="color:{colour};font-weight:600">{html.escape(t.recovered_token)}</span></span>'
        )
    return '<div style="line-height:1.2">' + "".join(cells) + "</div>"


def token_rows(result: AttackResult) -> list[dict]:
    return [
        {"position": t.position, "original": t.true_token, "recovered": t.recovered_token, "correct": t.correct,
         "L1 distance": round(t.distance, 6), "rank of true token": t.rank or None,
         "candidates scored": t.evaluations, "gradient steps": t.gradient_steps, "certified (< ε)": t.certified}
        for t in result.tokens
    ]


@shared_figure
def distance_figure(result: AttackResult) -> go.Figure:
    """Per-position L1 distance of the chosen candidate, against the acceptance threshold."""
    xs = [t.position for t in result.tokens]
    fig = go.Figure()
    fig.add_bar(x=xs, y=[max(t.distance, 1e-12) for t in result.tokens], name="distance (green: right, red: wrong)",
                marker_color=[GOOD if t.correct else BAD for t in result.tokens],
                hovertext=[f"{t.true_token} → {t.recovered_token}" for t in result.tokens])
    # A line trace rather than add_hline: hline annotations are misplaced on log axes.
    span = [min(xs) - 0.5, max(xs) + 0.5]
    fig.add_scatter(x=span, y=[result.numerical_epsilon] * 2, mode="lines", line=dict(dash="dash", color="#444"),
                    name=f"exact match: ε = {result.numerical_epsilon:.3g}")
    if result.epsilon > result.numerical_epsilon:
        fig.add_scatter(x=span, y=[result.epsilon] * 2, mode="lines", line=dict(dash="dot", color="#999"),
                        name=f"within the defence's reach: {result.epsilon:.3g}")
    fig.update_layout(title="L1 distance to the observed state, per position",
                      xaxis_title="position (token index)", yaxis_title="L1 distance (log scale)",
                      yaxis_type="log", height=360, margin=dict(t=50))
    return legend_below(fig, bottom=120)


@shared_figure
def rank_figure(result: AttackResult) -> go.Figure:
    """Rank of the true token in the proposal order and candidates scored, per position."""
    xs = [t.position for t in result.tokens]
    fig = go.Figure()
    fig.add_bar(x=xs, y=[t.evaluations for t in result.tokens], name="candidates scored", marker_color="#8da0cb")
    fig.add_scatter(x=xs, y=[t.rank or None for t in result.tokens], mode="markers", name="rank of true token",
                    marker=dict(size=10, color="#fc8d62", symbol="diamond"))
    fig.add_scatter(x=[min(xs) - 0.5, max(xs) + 0.5], y=[result.vocab_size] * 2, mode="lines",
                    line=dict(dash="dot", color="#444"), name=f"exhaustive: {result.vocab_size:,} per position")
    fig.update_layout(xaxis_title="position (token index)", yaxis_title="count (log scale)", yaxis_type="log",
                      height=380)
    set_title(fig, "Work per position: candidates scored and the true token's rank", chars=42)
    return legend_below(fig, bottom=120)


@shared_figure
def layer_figure(sweep: LayerSweep) -> go.Figure:
    xs = [p.layer for p in sweep.points]
    fig = go.Figure()
    fig.add_scatter(x=xs, y=[100 * p.accuracy for p in sweep.points], mode="lines+markers",
                    name="tokens recovered (%)")
    fig.add_bar(x=xs, y=[p.evaluations for p in sweep.points], name="candidates scored", yaxis="y2",
                opacity=0.3, marker_color="#8da0cb", width=0.4)
    fig.update_layout(title="Recovery by layer", xaxis=dict(title="layer L (0 = embeddings)", dtick=1),
                      yaxis=dict(title="tokens recovered (%)", range=[-5, 105]),
                      yaxis2=dict(title="candidates scored (count)", overlaying="y", side="right",
                                  rangemode="tozero", showgrid=False),
                      height=340, margin=dict(t=50, b=40), legend=dict(orientation="h", y=-0.25))
    return fig


@shared_figure
def noise_figure(sweep: NoiseSweep) -> go.Figure:
    fig = go.Figure()
    dashes = ["solid", "dash", "dot", "dashdot"]
    for n, defence in enumerate(dict.fromkeys(p.defence for p in sweep.points)):
        pts = [p for p in sweep.points if p.defence == defence]
        fig.add_scatter(x=[f"{p.noise:g}" for p in pts], y=[100 * p.accuracy for p in pts], mode="lines+markers",
                        name=defence_label(defence), line=dict(dash=dashes[n % len(dashes)], width=3))
    fig.update_layout(title="Recovery vs Gaussian noise, per permutation defence",
                      xaxis_title="noise σ (multiples of the hidden states' std)", xaxis_type="category",
                      yaxis=dict(title="tokens recovered (%)", range=[-5, 105]), height=340,
                      margin=dict(t=50, b=40), legend=dict(orientation="h", y=-0.25))
    return fig


@shared_figure
def speed_figure(cmp: SpeedComparison) -> go.Figure:
    from plotly.subplots import make_subplots

    names = ["proposal-ordered attack", "exhaustive search"]
    evals = [cmp.attack.evaluations, cmp.exhaustive_evaluations_total]
    secs = [sum(t.seconds for t in cmp.attack.tokens), cmp.exhaustive_seconds_total]
    extrapolated = cmp.measured_positions < cmp.positions
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.2, subplot_titles=(
        "candidates scored", "wall time" + ("<br>(exhaustive extrapolated)" if extrapolated else "")))
    colours = ["#66c2a5", "#8da0cb"]
    fig.add_bar(x=names, y=evals, text=[f"{v:,}" for v in evals], marker_color=colours, row=1, col=1)
    fig.add_bar(x=names, y=secs, text=[f"{v:.2f} s" for v in secs], marker_color=colours, row=1, col=2)
    # Explicit log ranges: plotly's autorange can start above the smaller bar and hide it.
    fig.update_yaxes(type="log", title_text="candidates (count, log scale)", row=1, col=1,
                     range=[0, math.log10(max(max(evals), 1)) + 0.3])
    fig.update_yaxes(type="log", title_text="seconds (log scale)", row=1, col=2,
                     range=[math.log10(max(min(secs), 1e-4)) - 0.5, math.log10(max(max(secs), 1e-4)) + 0.3])
    fig.update_xaxes(title_text="method")
    fig.update_layout(showlegend=False, height=380, margin=dict(b=40))
    set_title(fig, f"Attack vs exhaustive search: {cmp.evaluation_ratio:,.0f}× fewer candidates, "
                   f"{cmp.time_ratio:,.1f}× less time", top=80)
    return panel_titles(fig)


@shared_figure
def cascade_figure(result: CascadeResult) -> go.Figure:
    """Which party sees which position (cells), and what the attacking party recovered."""
    parties = len(result.parties)
    z, text = [], []
    for p in range(parties):
        row, labels = [], []
        for i, owner in enumerate(result.assignment):
            if owner == p:
                rec = result.recovered[i] if p == result.params.attacker else None
                mark = "" if rec is None else " ✓" if rec == result.token_ids[i] else " ✗"
                row.append(1.0)
                labels.append(result.tokens[i] + mark)
            else:
                row.append(0.0)
                labels.append("")
        z.append(row)
        text.append(labels)
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(len(result.assignment))), y=[f"party {p}" for p in range(parties)],
        text=text, texttemplate="%{text}", colorscale=[[0, "#f4f4f4"], [1, "#9ecae1"]], showscale=False,
        hovertemplate="%{y}, position %{x}<extra></extra>",
    ))
    fig.update_layout(xaxis_title="position (token index)", yaxis_title="party", yaxis_autorange="reversed",
                      height=142 + 40 * parties, margin=dict(b=40))
    return set_title(fig, "What each party sees (shaded: its hidden states; ✓/✗: the attacker's brute force "
                          "right/wrong)")


def cascade_rows(result: CascadeResult) -> list[dict]:
    return [
        {"party": v.party, "positions seen": len(v.positions), "largest gap (unseen run)": v.largest_gap,
         "brute-force cost": f"10^{v.log10_cost:.1f} sequences"}
        for v in result.parties
    ]


CASCADE_SCOPE_SHORT = (
    "Scope: this simulates only what each computing party sees — the layer-L hidden-state rows of its own "
    "positions — and what one party alone can brute-force from them (exhaustive cost Σ V^(g+1) over its "
    "positions). It is not the Cascade protocol; see below for what is left out."
)

CASCADE_SCOPE = """
**Modelled.** Each of the *k* parties holds the layer-L residual-stream rows of a fixed subset of
positions (round-robin: position *i* to party *i* mod *k*; or contiguous blocks) and nothing else.
One party, alone, attacks its own rows with the vocab-matching attack of the panel above: for each
position it sees, it must enumerate the *g* unseen tokens since the last position it recovered
together with the seen one, so its exhaustive cost is Σ over its positions of V^(g+1) candidate
sequences. That sum is computed for every party, and the chosen party's brute force is actually run
when it fits the budget.

**Left out (the rest of the protocol).**
- Cascade's attention nodes: in the protocol, attention is computed by separate parties that receive
  query, key and value rows of pairs of shards and return partial attention results; what those
  parties see (and could attack) is not modelled — only the per-position rows of the computing parties.
- The exchange and aggregation of partial attention results between the two kinds of node, and the
  user's own steps (embedding the prompt, reading the output).
- Every layer but L: in the protocol a party sees its rows at every layer; the simulation uses one.
- The paper's own sharding schemes and their parameters (only round-robin and contiguous blocks here).
- Collusion: parties that pool their rows close each other's gaps; each party attacks alone here.
- Smarter attacks than exhaustive enumeration of a gap: pruning with the model's next-token
  distribution, or learning-based inversion (which the paper evaluates). The cost shown is an upper
  bound for the attacker, not a security guarantee.
- Generation (decoding), communication, latency and the protocol's cost: only the prompt's prefill
  states are considered.
"""

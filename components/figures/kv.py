"""Plotly figures and tables for the KV-cache eviction panel (pure functions of the typed results)."""
from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go

from analysis.kv import POLICIES, KvResult, PolicyRun, SweepResult
from analysis.kv.metrics import metric as metric_named
from analysis.kv.metrics import table_metrics
from components.figures.memo import shared_figure

# Labels and colours come from the policy classes (analysis/kv/policies.py): POLICIES.label / .colour.


def is_variant(policy: str) -> bool:
    """A labelled variant (prefill-only, or MorphKV's 8903d2a rule): shown apart from the main comparison."""
    return policy in POLICIES and getattr(POLICIES.get(policy), "variant", False)


# A marker is one SVG element per point in the browser: the default view's per-step charts had about
# 900 each (9 policies x 98 steps), 0.2 CPU s of drawing per chart on each page load.
MARKERS_UP_TO = 30  # points per line drawn with a marker on each point; longer lines are plain
ANALYTIC_MARKS = 12  # about this many analytic-size marks per policy on the memory chart


def line_mode(points: int) -> str:
    """"lines+markers" for a short line (each point readable), "lines" for a long one."""
    return "lines+markers" if points <= MARKERS_UP_TO else "lines"


def kept_matrix(result: KvResult, layer_index: int, head: int) -> list[list[float | None]]:
    """Rows: decode steps; columns: original positions. 1 kept, 0 evicted, None not yet generated."""
    n = len(result.task.tokens)
    rows = []
    for step, positions in enumerate(result.kept[layer_index][head]):
        newest = result.task.prefill_len + step
        row: list[float | None] = [0.0 if j <= newest else None for j in range(n)]
        for j in positions:
            row[j] = 1.0
        rows.append(row)
    return rows


def position_labels(tokens: list[str]) -> list[str]:
    """One category per original position, "12 · word": unique, so the heatmap's x axis can carry each
    column's token to the hover once instead of once per cell."""
    return [f"{j} · {html.escape(t, quote=False)}" for j, t in enumerate(tokens)]


def _tick_step(n: int) -> int:
    """Every 1, 2, 5, 10, 20, 50, ... positions: about ten numbered ticks on the position axis."""
    for step in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000):
        if n / step <= 12:
            return step
    return max(1, n // 10)


@shared_figure
def retained_heatmap(result: KvResult, layer_index: int, head: int) -> go.Figure:
    """Which original positions are in the cache after each decode step, needles marked.

    Sent compactly: the cells as one float32 array (NaN = not read yet), which Plotly serialises as
    binary, and each column's token once, as its x category (with a hover text per cell the default
    view's figure was 452 KB; now 131 KB)."""
    z = np.array(kept_matrix(result, layer_index, head), dtype=np.float32)  # None -> NaN
    n = len(result.task.tokens)
    labels = position_labels(result.token_text)
    tick = _tick_step(n)
    fig = go.Figure(go.Heatmap(
        z=z, x=labels, y=np.arange(len(z), dtype=np.int32), zmin=0, zmax=1,
        colorscale=[[0.0, "#f1f1f1"], [0.5, "#f1f1f1"], [0.5, "#1f4e8c"], [1.0, "#1f4e8c"]],
        showscale=False, hoverongaps=False, hovertemplate="step %{y}<br>position %{x}<br>kept=%{z}<extra></extra>",
    ))
    tokens = result.token_text
    needles = sorted({p for group in result.task.needle_positions for p in group})
    if needles:
        fig.add_trace(go.Scatter(
            x=[labels[p] for p in needles], y=[-1.2] * len(needles), mode="markers", name="needle (key / value)",
            marker=dict(symbol="triangle-up", size=9, color="#d62728"),
            hovertext=[f"needle at {p}: {tokens[p]}" for p in needles], hoverinfo="text",
        ))
    for step, pos in enumerate(result.task.answer_positions):
        d = pos - result.task.prefill_len - 1
        if 0 <= d < len(z):
            fig.add_annotation(x=n - 0.5, y=d, text="answer", showarrow=False, xanchor="left",
                               font=dict(size=10, color="#d62728"))
    # the lines' labels inside the plot's top edge: above it they ran into the subtitle wherever the figure has
    # less top margin (the talk's step 1 at 1024 px)
    for x, text, dash, side in ((result.task.prefill_len - 0.5, "end of prefill", "dot", "right"),
                                (result.task.context_len - 0.5, "questions", "dash", "left")):
        fig.add_vline(x=x, line_dash=dash, line_color="#888888")
        fig.add_annotation(x=x, y=1, yref="paper", yanchor="top", xanchor=side, xshift=-3 if side == "right" else 3,
                           text=text, showarrow=False, font=dict(size=10, color="#555555"),
                           bgcolor="rgba(255,255,255,0.8)")
    label = POLICIES.label(result.params.policy)
    fig.update_layout(
        title=f"{label}: cached tokens per decode step (layer {result.layers[layer_index]}, KV head {head})"
              "<br><sup>dark = kept, light = evicted, blank = not read yet, ▲ = needle (key, value)</sup>",
        xaxis_title="original token position (tokens)", yaxis_title="decode step",
        xaxis=dict(tickmode="array", tickvals=labels[::tick], ticktext=list(range(0, n, tick))),
        yaxis_autorange="reversed", height=max(360, 4 * len(z) + 200), margin=dict(t=90, r=80),
        legend=dict(orientation="h", y=-0.2),
    )
    return fig


def summary_rows(result: KvResult, variants: bool = False) -> list[dict]:
    """One row per policy at the chosen budget (the main comparison, or the variants): a column per table
    metric (analysis/kv/metrics.py)."""
    return [{"policy": r.label, **{m.header: m.value(r) for m in table_metrics()}}
            for r in result.runs if is_variant(r.policy) == variants]


@shared_figure
def step_metric_figure(result: KvResult, metric: str = "kl") -> go.Figure:
    """Per-step KL (or ΔNLL) of each policy against the full cache."""
    titles = {"kl": ("KL(full ‖ policy) per predicted token", "KL divergence (nats)"),
              "dnll": ("ΔNLL of the true next token per step", "NLL(policy) − NLL(full) (nats)")}
    title, ytitle = titles[metric]
    fig = go.Figure()
    for r in result.runs:
        if r.policy == "full":
            continue
        values = getattr(r, metric)
        fig.add_trace(go.Scatter(y=values, mode=line_mode(len(values)), name=r.label,
                                 line=dict(color=POLICIES.colour(r.policy),
                                           dash="dot" if is_variant(r.policy) else "solid")))
    for pos in result.task.answer_positions:
        fig.add_vline(x=pos - result.task.prefill_len, line_dash="dot", line_color="#bbbbbb")
    fig.update_layout(title=f"{title}<br><sup>budget {result.params.budget}; dotted lines = answer tokens</sup>",
                      xaxis_title="predicted token index after the context (tokens)", yaxis_title=ytitle,
                      height=480, legend=dict(orientation="h", yanchor="top", y=-0.32, x=0))  # half-width column
    return fig


def not_evicted_note(result: KvResult) -> str:
    """Which layers no policy evicts (sliding-window: bounded by their own window), or "" when every one is."""
    kept = result.kept_layers
    if not kept:
        return ""
    return (f"Layer{'s' if len(kept) > 1 else ''} {', '.join(map(str, kept))} of {result.model_layers} "
            f"{'are' if len(kept) > 1 else 'is'} sliding-window: no policy evicts {'them' if len(kept) > 1 else 'it'} "
            "(the window already bounds them), so the chart counts the other layers only.")


@shared_figure
def memory_figure(result: KvResult) -> go.Figure:
    """Measured cache size over decode steps of the layers the policies evict, one line per policy; analytic
    size as markers on about `ANALYTIC_MARKS` evenly spaced steps (always the last). Sliding-window layers are
    left out (no policy evicts them; counted, they made every policy's line grow)."""
    fig = go.Figure()
    for r in result.runs:
        colour = POLICIES.colour(r.policy)
        measured = r.evicted_bytes or r.cache_bytes  # a result saved before: every layer (none sliding there)
        analytic = r.evicted_analytic or r.analytic_bytes
        fig.add_trace(go.Scatter(y=[b / 1024 for b in measured], mode="lines", name=f"{r.label} (measured)",
                                 line=dict(color=colour, width=2)))
        n = len(analytic)
        steps = sorted({*range(0, n, max(1, -(-n // ANALYTIC_MARKS))), n - 1}) if n else []
        fig.add_trace(go.Scatter(x=steps, y=[analytic[i] / 1024 for i in steps], mode="markers",
                                 name=f"{r.label} (2·layers·H_kv·d·T·bytes)", showlegend=False,
                                 marker=dict(color=colour, size=4, symbol="x")))
    kept = result.kept_layers
    which = (f"<br><sup>layers {', '.join(map(str, result.layers))} (evicted); sliding-window layer"
             f"{'s' if len(kept) > 1 else ''} {', '.join(map(str, kept))} not counted</sup>" if kept else "")
    fig.update_layout(title="KV-cache memory over decode steps (lines measured, × analytic)" + which,
                      xaxis_title="decode step", yaxis_title="cache size (KiB)", height=460,
                      # ten policies: a side legend at this height scrolls and hides the last ones
                      legend=dict(orientation="h", yanchor="top", y=-0.25, x=0))
    return fig


@shared_figure
def sweep_figure(sweep: SweepResult, metric: str = "accuracy") -> go.Figure:
    """Budget sweep: one curve per policy of a sweep metric (analysis/kv/metrics.py), budget as a share of
    the context on x."""
    m = metric_named(metric)
    fig = go.Figure()
    for name in dict.fromkeys(p.policy for p in sweep.points):
        pts = sorted((p for p in sweep.points if p.policy == name), key=lambda p: p.share)
        fig.add_trace(go.Scatter(x=[100 * p.share for p in pts], y=[p.values.get(m.name) for p in pts],
                                 mode="lines+markers", name=POLICIES.label(name),
                                 line=dict(color=POLICIES.colour(name), dash="dot" if is_variant(name) else "solid"),
                                 hovertext=[f"budget {p.budget} entries" for p in pts]))
    if m.name == "accuracy" and sweep.full_accuracy is not None:
        fig.add_hline(y=sweep.full_accuracy, line_dash="dash", line_color=POLICIES.colour("full"),
                      annotation_text="full cache", annotation_position="bottom right")
    fig.update_layout(title=f"{m.title or m.label} vs cache budget (context {sweep.context} tokens)",
                      xaxis_title="budget (% of the context)", yaxis_title=m.axis or m.header, height=360)
    return fig


@shared_figure
def survival_figure(run: PolicyRun, layers: list[int]) -> go.Figure:
    """Share of the asked-for needles still cached when each answer is predicted, per layer and KV head."""
    z = run.needle_survival
    fig = go.Figure(go.Heatmap(z=z, x=[f"head {h}" for h in range(len(z[0]) if z else 0)],
                               y=[f"layer {l}" for l in layers], zmin=0, zmax=1, colorscale="Blues",
                               colorbar=dict(title="share"), texttemplate="%{z:.2f}"))
    fig.update_layout(title=f"{run.label}: needle survival<br><sup>share of asked-for needles cached when "
                            "the answer is predicted</sup>",
                      xaxis_title="KV head", yaxis_title="layer", height=120 + 40 * len(layers))
    return fig


def text_rows(result: KvResult) -> list[dict]:
    """Side-by-side generations: policy, text, share of tokens equal to the full cache's."""
    rows = []
    for t in result.texts:
        same = sum(t.matches_full) / max(1, len(t.matches_full))
        rows.append({"policy": t.label, "generated text": t.text, "tokens equal to full cache": round(same, 2)})
    return rows


def answer_rows(result: KvResult) -> list[dict]:
    """Per asked key: the true value and what each policy predicted (teacher-forced)."""
    tok = result.token_text
    rows = []
    for i, pos in enumerate(result.task.answer_positions):
        needle = result.task.needle_positions[i] if i < len(result.task.needle_positions) else []
        row = {"asked key": tok[needle[0]] if needle else "", "key position": needle[0] if needle else None,
               "true value": tok[pos]}
        for r in result.runs:
            pred = r.answers[i] if i < len(r.answers) else None
            row[r.label] = "✓" if pred == result.task.tokens[pos] else "✗"
        rows.append(row)
    return rows

"""Figures and tables of the KV panel's long-response view (pure functions of a `LongResult`)."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from analysis.kv import POLICIES
from analysis.kv.longresp import LongResult
from components.figures.kv import _tick_step, is_variant, line_mode, position_labels
from components.figures.memo import shared_figure

POSITION_METRICS = {
    "top1": ("Top-1 agreement with the full cache, by generated position",
             "share agreeing (moving mean over 8 tokens)"),
    "same": ("Answer still identical to the full cache's", "identical so far (1 = yes)"),
    "kl": ("KL(full ‖ policy) after the same prefix, by generated position", "KL divergence (nats, moving mean over 8)"),
}
SMOOTH = 8  # tokens in the moving mean of the per-position curves (a single answer's 0/1 flips are unreadable)


def smoothed(values: list[float], metric: str) -> list[float]:
    if metric == "same" or len(values) < 2:
        return list(values)
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v - (values[i - SMOOTH] if i >= SMOOTH else 0.0)
        out.append(acc / min(i + 1, SMOOTH))
    return out


@shared_figure
def position_figure(result: LongResult, metric: str = "top1") -> go.Figure:
    title, ytitle = POSITION_METRICS[metric]
    fig = go.Figure()
    for r in result.runs:
        if r.policy == "full":
            continue
        values = smoothed(getattr(r, metric), metric)
        fig.add_trace(go.Scatter(y=values, mode=line_mode(len(values)), name=r.label,
                                 line=dict(color=POLICIES.colour(r.policy),
                                           dash="dot" if is_variant(r.policy) else "solid")))
    fig.update_layout(title=f"{title}<br><sup>budget {result.params.budget}; each policy on its own answer</sup>",
                      xaxis_title="generated position (tokens)", yaxis_title=ytitle, height=440,
                      legend=dict(orientation="h", yanchor="top", y=-0.25, x=0))
    return fig


@shared_figure
def memory_figure(result: LongResult) -> go.Figure:
    """Measured cache bytes per generated token, one line per policy (the full cache grows, the others stay flat)."""
    fig = go.Figure()
    for r in result.runs:
        fig.add_trace(go.Scatter(y=[b / 1024 for b in r.cache_bytes], mode="lines", name=r.label,
                                 line=dict(color=POLICIES.colour(r.policy), width=2,
                                           dash="dot" if is_variant(r.policy) else "solid")))
    fig.update_layout(title="KV-cache memory while the answer is written (measured)",
                      xaxis_title="generated token", yaxis_title="cache size (KiB)", height=420,
                      legend=dict(orientation="h", yanchor="top", y=-0.25, x=0))
    return fig


def kept_matrix(result: LongResult, layer_index: int, head: int) -> np.ndarray:
    """Rows: decode steps of the chosen policy's answer; columns: positions (prompt, then its answer).
    1 kept, 0 evicted, NaN not written yet."""
    steps = result.kept[layer_index][head]
    p = len(result.task.tokens)
    n = p + len(steps)
    z = np.full((len(steps), n), np.nan, dtype=np.float32)
    for step, positions in enumerate(steps):
        z[step, : p + step + 1] = 0.0
        z[step, positions] = 1.0
    return z


@shared_figure
def kept_heatmap(result: LongResult, layer_index: int, head: int) -> go.Figure:
    z = kept_matrix(result, layer_index, head)
    tokens = result.prompt_text + result.answer_text
    labels = position_labels((tokens + [""] * z.shape[1])[: z.shape[1]])
    tick = _tick_step(len(labels))
    p = len(result.task.tokens)
    fig = go.Figure(go.Heatmap(
        z=z, x=labels, y=np.arange(len(z), dtype=np.int32), zmin=0, zmax=1,
        colorscale=[[0.0, "#f1f1f1"], [0.5, "#f1f1f1"], [0.5, "#1f4e8c"], [1.0, "#1f4e8c"]],
        showscale=False, hoverongaps=False,
        hovertemplate="generated token %{y}<br>position %{x}<br>kept=%{z}<extra></extra>"))
    fig.add_vline(x=p - 0.5, line_dash="dash", line_color="#888888", annotation_text="answer starts",
                  annotation_position="top")
    label = POLICIES.label(result.params.policy)
    fig.update_layout(
        title=f"{label}: cached tokens while it writes (layer {result.layers[layer_index]}, KV head {head})"
              "<br><sup>dark = kept, light = evicted, blank = not written yet</sup>",
        xaxis_title="token position (prompt, then the answer; tokens)", yaxis_title="generated token",
        xaxis=dict(tickmode="array", tickvals=labels[::tick], ticktext=list(range(0, len(labels), tick))),
        yaxis_autorange="reversed", height=max(360, 4 * len(z) + 200), margin=dict(t=90, r=40))
    return fig


def summary_rows(result: LongResult) -> list[dict]:
    rows = []
    for r in result.runs:
        rows.append({
            "policy": r.label,
            "answer tokens": len(r.generated),
            "item recall": None if r.recall is None else round(r.recall, 3),
            "item precision": None if r.precision is None else round(r.precision, 3),
            "top-1 agreement": round(r.agreement, 3),
            "mean KL (nats)": round(sum(r.kl) / max(1, len(r.kl)), 4),
            "identical for (tokens)": int(sum(r.same)),
            "cache entries per head (last step)": round(r.cache_len[-1], 1) if r.cache_len else None,
            "cache KiB (last step)": round(r.cache_bytes[-1] / 1024, 1) if r.cache_bytes else None,
        })
    return rows


def item_rows(result: LongResult) -> list[dict]:
    """Per reference item, in answer order: which policies' answers contain it."""
    rows = []
    for k, item in enumerate(result.task.reference):
        row = {"#": k + 1, "item": item}
        for r in result.runs:
            row[r.label] = "✓" if k < len(r.recalled) and r.recalled[k] else "✗"
        rows.append(row)
    return rows


def answer_rows(result: LongResult) -> list[dict]:
    return [{"policy": r.label, "answer": r.text} for r in result.runs]

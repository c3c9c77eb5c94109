"""Figures and HTML for the caption-correction panel: pure functions of its results."""
from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go

from analysis.captions import LOW_MASS, CaptionMetrics, ClaimVerdict, CorrectionResult, DiffSpan
from components.figures.memo import shared_figure
from components.figures.images import tower_view

KEEP, DROP = "#2e7d32", "#c62828"


@shared_figure
def score_figure(result: CorrectionResult) -> go.Figure:
    """H(u) per claim as horizontal bars, coloured by verdict, with the threshold pi."""
    claims = result.claims[::-1]  # first claim on top
    fig = go.Figure(go.Bar(
        x=[c.score for c in claims], y=[f"{i}. {c.claim}" for i, c in zip(range(len(claims), 0, -1), claims)],
        orientation="h", marker_color=[DROP if c.flagged else KEEP for c in claims],
        customdata=[[c.p_true, c.p_false, c.mass] for c in claims],
        hovertemplate="%{y}<br>H = %{x:.3f} nats<br>p_T = %{customdata[0]:.3f}, p_F = %{customdata[1]:.3f}"
                      "<br>yes+no mass %{customdata[2]:.3f}<extra></extra>",
    ))
    fig.add_vline(x=result.params.pi, line_dash="dash", line_color="black",
                  annotation_text=f"π = {result.params.pi:.2f}", annotation_position="top")
    fig.update_layout(
        title="Hallucination score per claim (red: flagged, H > π)",
        xaxis_title=("H(u) = −log max(p_T − p_F, ε)  (nats" + (", p renormalised over yes+no)"
                     if result.params.probabilities == "renormalised" else ", raw p)")), yaxis_title="claim",
        height=max(260, 28 * len(claims) + 120), margin=dict(l=10, r=10, t=60, b=50),
    )
    return fig


model_view = tower_view  # the image as the vision tower sees it


def heatmap_figure(verdict: ClaimVerdict, image: np.ndarray) -> go.Figure:
    """The claim's patch attribution over the (model-view) image, symmetric colour scale."""
    heat = np.asarray(verdict.heatmap, dtype=float)
    size, grid = image.shape[0], heat.shape[0]
    step = size / grid
    centres = (np.arange(grid) + 0.5) * step - 0.5  # image pixel i spans [i - 0.5, i + 0.5]
    bound = float(np.abs(heat).max()) or 1.0
    fig = go.Figure(go.Image(z=image, hoverinfo="skip"))
    fig.add_trace(go.Heatmap(
        z=heat, x=centres, y=centres, zmin=-bound, zmax=bound, colorscale="RdBu_r", opacity=0.45,
        colorbar=dict(title="attribution<br>(log-odds)"),
        hovertemplate="patch (%{x:.0f}, %{y:.0f}) px<br>attribution %{z:.3f}<extra></extra>",
    ))
    verdict_text = "flagged" if verdict.flagged else "kept"
    fig.update_layout(
        title=f"Where the answer comes from: “{verdict.claim}” ({verdict_text})",
        xaxis_title="x (pixels of the model's input)", yaxis_title="y (pixels of the model's input)",
        height=460, margin=dict(l=10, r=10, t=60, b=50),
    )
    fig.update_xaxes(range=[-0.5, size - 0.5], constrain="domain")
    fig.update_yaxes(range=[size - 0.5, -0.5], scaleanchor="x")
    return fig


@shared_figure
def sweep_figure(result: CorrectionResult) -> go.Figure:
    """Factuality and coverage of the kept claims as the threshold pi varies (or kept count)."""
    pis = [p.pi for p in result.sweep]
    fig = go.Figure()
    if result.sweep and result.sweep[0].factuality is not None:
        fig.add_trace(go.Scatter(x=pis, y=[p.factuality for p in result.sweep], name="factuality of kept claims",
                                 mode="lines", line_shape="hv", line_color=KEEP))
        fig.add_trace(go.Scatter(x=pis, y=[p.coverage for p in result.sweep], name="coverage of scene facts",
                                 mode="lines", line_shape="hv", line_color="#1565c0"))
        fig.update_layout(yaxis_title="share (0–1)", yaxis_range=[-0.02, 1.05])
    else:
        total = len(result.claims)
        fig.add_trace(go.Scatter(x=pis, y=[p.kept / total if total else 0 for p in result.sweep],
                                 name="claims kept", mode="lines", line_shape="hv"))
        fig.update_layout(yaxis_title="share of the caption's claims kept", yaxis_range=[-0.02, 1.02])
    fig.add_vline(x=result.params.pi, line_dash="dash", line_color="black",
                  annotation_text=f"π = {result.params.pi:.2f}")
    fig.update_layout(title="Threshold sweep: the factuality / coverage trade-off",
                      xaxis_title="threshold π (nats; a claim is kept when H ≤ π)",
                      height=380, margin=dict(l=10, r=10, t=60, b=50),
                      legend=dict(orientation="h", y=-0.25))
    return fig


@shared_figure
def metrics_figure(before: CaptionMetrics, after: CaptionMetrics) -> go.Figure:
    """Factuality, coverage and CHAIR_i before and after correction."""
    names = ["factuality", "coverage", "CHAIR_i"]
    fig = go.Figure()
    for label, m, colour in (("before", before, "#9e9e9e"), ("after", after, "#1565c0")):
        values = [m.factuality, m.coverage, m.chair_i]
        fig.add_trace(go.Bar(x=names, y=values, name=label, marker_color=colour,
                             text=[f"{v:.2f}" for v in values], textposition="outside"))
    fig.update_layout(title="Caption quality before and after correction (exact, Shapes World)",
                      xaxis_title="metric", yaxis_title="share (0–1; CHAIR: lower is better)",
                      yaxis_range=[0, 1.15], barmode="group", height=360, margin=dict(l=10, r=10, t=60, b=50))
    return fig


def diff_html(spans: list[DiffSpan]) -> str:
    """The caption diff as HTML: removed words struck through in red, added ones in green."""
    styles = {
        "same": "",
        "removed": f"color:{DROP};text-decoration:line-through;background:#fdecea;",
        "added": f"color:{KEEP};background:#e8f5e9;font-weight:600;",
    }
    parts = []
    for span in spans:
        text = html.escape(span.text)
        parts.append(f'<span style="{styles[span.op]}">{text}</span>' if styles[span.op] else text)
    return '<div style="font-size:1.05rem;line-height:1.8">' + " ".join(parts) + "</div>"


def claim_rows(result: CorrectionResult) -> list[dict]:
    """The claim table: one row per claim."""
    rows = []
    for i, c in enumerate(result.claims, 1):
        row = {"#": i, "claim": c.claim, "p_True": round(c.p_true, 4), "p_False": round(c.p_false, 4),
               "yes+no mass": round(c.mass, 4) if c.asked else None}
        if result.params.probabilities == "renormalised":
            row["p_True/(p_True+p_False)"] = round(c.p_true / c.mass, 4) if c.mass > 0 else None
        row.update({"H (nats)": round(c.score, 3),
                    "verdict": "hallucinated (dropped)" if c.flagged else "kept"})
        if not c.asked:
            row["verdict"] += " (not asked: the question format cannot express it)"
        if result.params.scene_seed is not None:  # the scene is known: every claim's truth, or why not
            row["ground truth"] = NO_TRUTH if c.truth is None else ("true" if c.truth else "false")
            row["verdict right?"] = "—" if c.truth is None else ("yes" if c.truth != c.flagged else "no")
        rows.append(row)
    return rows


NOT_MEASURABLE = "not measurable"
NO_TRUTH = "not measurable (not a Shapes World claim)"
METRICS = (("Factuality", "factuality", "normal"), ("Coverage", "coverage", "normal"),
           ("CHAIR_i", "chair_i", "inverse"))


def metric_cards(result: CorrectionResult) -> list[tuple[str, str, str | None, str]]:
    """(label, value, delta, delta colour) per metric card: after, with the change from before; "not
    measurable" where there is no ground truth (never a number)."""
    cards = []
    for label, name, colour in METRICS:
        before = getattr(result.before, name) if result.before else None
        after = getattr(result.after, name) if result.after else None
        if after is not None and before is not None:
            cards.append((label, f"{after:.2f}", f"{after - before:+.2f}", colour))
        elif before is not None:
            cards.append((f"{label} (before)", f"{before:.2f}", "after: " + NOT_MEASURABLE, "off"))
        else:
            cards.append((label, NOT_MEASURABLE, None, "off"))
    return cards


def metric_rows(result: CorrectionResult) -> list[dict]:
    """The metrics table of the export: before and after, "not measurable" without ground truth."""
    def shown(m, name):
        return NOT_MEASURABLE if m is None else round(getattr(m, name), 4)

    return [{"metric": name, "before": shown(result.before, name), "after": shown(result.after, name),
             "note": result.ground_truth} for _, name, _ in METRICS]


def low_mass_message(result: CorrectionResult) -> str:
    """A warning for claims whose yes+no mass is below LOW_MASS (empty when there are none)."""
    low = [c for c in result.claims if c.low_mass]
    if not low:
        return ""
    raw = result.params.probabilities != "renormalised"
    return (f"For {len(low)} of {len(result.claims)} claims the verifier put less than {LOW_MASS:.0%} of its "
            f"next-token probability on yes or no (lowest: {min(c.mass for c in low):.1%}), so it is not really "
            "answering the question and p_True / p_False say little about those claims. "
            + ("With raw probabilities the missing mass also raises H, so such claims tend to be dropped; "
               "the renormalised form reads only the yes/no split, but a split of very little mass is noise too."
               if raw else
               "The renormalised form hides the missing mass: a split of very little mass is noise."))

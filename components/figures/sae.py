"""Figures, tables and HTML for the SAE-V panel: pure functions of `analysis.sae_v` results."""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from analysis.framework import paths
from analysis.framework import images
from analysis.sae_v import (
    IMAGE, FeatureCard, FeatureStore, InputExplanation, Ranking, SteeredText, SteeringResult, by_kind, score_label,
)
from components.figures.memo import shared_figure
from components.figures.text import set_title
from components.figures.images import tower_view

LABEL_COLOURS = {"cross-modal": "#7b1fa2", "text-only": "#1565c0", "image-only": "#ef6c00", "dead": "#9e9e9e"}


# ---------------------------------------------------------------------------------------------
# Tables


def concept_label(name: str) -> str:
    """'colour:red' -> 'colour = red' (a bare ':red' would be a colour directive in Streamlit markdown)."""
    kind, _, value = name.partition(":")
    return f"{kind} = {value}" if value else kind


def feature_rows(store: FeatureStore) -> list[dict]:
    """One row per feature for the sortable feature list."""
    rows = []
    for f in store.features:
        both = f.concept_both
        rows.append({
            "feature": f.index,
            "modality": f.label,
            "omega": f.omega,
            "density": f.density,
            "text density": f.density_text,
            "image density": f.density_image,
            "max act": f.max_act,
            "concept (both)": concept_label(both.name) if both else "",
            "precision (both)": round(both.precision, 3) if both else None,
            "concept (text)": concept_label(f.concept_text.name) if f.concept_text else "",
            "concept (image)": concept_label(f.concept_image.name) if f.concept_image else "",
        })
    return rows


SORTS = {
    "omega": ("omega", True),
    "density": ("density", True),
    "modality": ("modality", False),
    "concept precision": ("precision (both)", True),
    "feature": ("feature", False),
}


def sort_rows(rows: list[dict], by: str, labels: list[str] | None = None) -> list[dict]:
    """Rows filtered to the given modality labels and sorted by a SORTS key (None values last)."""
    key, descending = SORTS[by]
    chosen = [r for r in rows if labels is None or r["modality"] in labels]
    present = [r for r in chosen if r[key] is not None]
    missing = [r for r in chosen if r[key] is None]
    present.sort(key=lambda r: (r[key], -r["feature"]) if descending else (r[key], r["feature"]), reverse=descending)
    return present + missing


def ranking_rows(ranking: Ranking) -> list[dict]:
    """The ranked table; the label columns only where the pairs have labels, the image where it has a name."""
    out = []
    for r in ranking.rows:
        row = {"rank": r.rank, "pair": r.pair, "score s_i": r.score, "weighted mean omega": r.weighted,
               "shared features": r.shared}
        if ranking.labelled:
            row.update(corrupted=r.corrupted, kind=r.kind)
        if r.image:
            row["image"] = r.image
        row["caption"] = r.text
        out.append(row)
    return out


def kind_summary(ranking: Ranking) -> list[dict]:
    """Mean score and shared-feature count per pair kind (clean, other scene, swapped), and for each
    corrupted kind the ROC AUC of s_i against the clean pairs alone."""
    out = []
    for kind, stats in by_kind(ranking.rows).items():
        auc = stats.get("roc_auc_vs_clean")
        out.append({"kind": kind, "pairs": stats["pairs"], "mean s_i": stats["mean_score"],
                    "mean weighted ω": stats["mean_weighted"], "mean shared features": stats["mean_shared"],
                    "mean rank": stats["mean_rank"], "ROC AUC vs clean": None if auc is None else round(auc, 3)})
    return out


# ---------------------------------------------------------------------------------------------
# Figures


@shared_figure
def feature_scatter(store: FeatureStore) -> go.Figure:
    """omega vs density per feature, one colour per modality label."""
    fig = go.Figure()
    for label, colour in LABEL_COLOURS.items():
        feats = [f for f in store.features if f.label == label and f.density > 0]
        if not feats:
            continue
        fig.add_trace(go.Scatter(
            x=[f.density for f in feats], y=[f.omega for f in feats], mode="markers", name=label,
            marker=dict(color=colour, size=7, opacity=0.75),
            text=[f"feature {f.index}" + (f"<br>{f.concept_both.name} ({f.concept_both.precision:.2f})"
                                          if f.concept_both else "") for f in feats],
            hovertemplate="%{text}<br>density %{x:.4f}<br>ω %{y:.3f}<extra></extra>",
        ))
    fig.update_layout(
        title="Features: cross-modal weight ω vs how often they fire",
        # plain decimals (0.0001, not plotly's SI "100µ"); the y title on two lines, so a short chart (a talk's
        # step) does not run it into the chart's title
        xaxis=dict(title="density (share of tokens where the feature is active, log scale)", type="log",
                   tickformat="~g"),
        yaxis_title="ω: mean cosine of top text<br>vs top image residuals",
        height=420, margin=dict(l=10, r=10, t=60, b=50), legend_title="modality",
    )
    return fig


@shared_figure
def histogram_figure(card: FeatureCard) -> go.Figure:
    edges = np.asarray(card.hist_edges, dtype=float)
    counts = np.asarray(card.hist_counts, dtype=float)
    fig = go.Figure()
    if len(edges) > 1:
        fig.add_trace(go.Bar(x=(edges[:-1] + edges[1:]) / 2, y=counts, width=np.diff(edges),
                             marker_color=LABEL_COLOURS.get(card.label, "#555"),
                             hovertemplate="activation %{x:.3f}<br>%{y} tokens<extra></extra>"))
    fig.update_layout(
        xaxis_title="activation (SAE latent units)", yaxis_title="tokens (count)",
        height=300, margin=dict(l=10, r=10, b=50), bargap=0.02,
    )
    return set_title(fig, f"Feature {card.index}: activation histogram (active tokens only)", chars=28)


fit_image = tower_view  # the image as the vision tower sees it


def image_heatmap_figure(image: np.ndarray, heatmap: list[float], grid: int, title: str,
                         selected: int | None = None, height: int = 300, zmax: float | None = None) -> go.Figure:
    """A feature's activation per patch over the image (row-major patches, `grid` per side)."""
    size = image.shape[0]
    heat = np.asarray(heatmap, dtype=float).reshape(grid, grid)
    step = size / grid
    centres = (np.arange(grid) + 0.5) * step
    fig = go.Figure(go.Image(z=image, hoverinfo="skip"))
    fig.add_trace(go.Heatmap(
        z=np.where(heat > 0, heat, np.nan), x=centres, y=centres, zmin=0, zmax=zmax or float(heat.max()) or 1.0,
        colorscale="Viridis", opacity=0.55, colorbar=dict(title="activation", thickness=10),
        customdata=np.arange(grid * grid).reshape(grid, grid),
        hovertemplate="patch %{customdata}<br>activation %{z:.3f}<extra></extra>",
    ))
    xs, ys = np.meshgrid(centres, centres)
    fig.add_trace(go.Scatter(  # near-invisible markers, one per patch, so a click selects the patch
        x=xs.ravel(), y=ys.ravel(), mode="markers", customdata=np.arange(grid * grid), showlegend=False,
        marker=dict(symbol="square", size=max(4, int(height * 0.8 / grid)), opacity=0.01, color="white"),
        hovertemplate="patch %{customdata}<extra></extra>", name="patch",
    ))
    if selected is not None:
        r, c = divmod(selected, grid)
        fig.add_shape(type="rect", x0=c * step, x1=(c + 1) * step, y0=r * step, y1=(r + 1) * step,
                      line=dict(color="white", width=3))
    fig.update_layout(title=title, height=height, margin=dict(l=0, r=0, t=40, b=0),
                      xaxis=dict(title="x (pixels)", showticklabels=False),
                      yaxis=dict(title="y (pixels)", showticklabels=False))
    return fig


@shared_figure
def score_distribution_figure(ranking: Ranking) -> go.Figure:
    """s_i (or the weighted mean) per pair kind, as overlaid histograms."""
    fig = go.Figure()
    value = (lambda r: r.score) if ranking.by == "sum" else (lambda r: r.weighted)
    kinds = sorted({r.kind for r in ranking.rows}, key=lambda k: (k != "clean", k))
    for kind in kinds:
        fig.add_trace(go.Histogram(x=[value(r) for r in ranking.rows if r.kind == kind], name=kind,
                                   opacity=0.6, nbinsx=30))
    auc = ranking.roc_auc if ranking.by == "sum" else ranking.roc_auc_weighted
    subtitle = f"<br><sup>ROC AUC clean vs corrupted = {auc:.3f}</sup>" if auc is not None else ""
    fig.update_layout(
        barmode="overlay", title="Cross-modal score per image–caption pair" + subtitle,
        xaxis_title=score_label(ranking.rule) if ranking.by == "sum"
        else "activation-weighted mean ω over shared features",
        yaxis_title="pairs (count)", height=360, margin=dict(l=10, r=10, t=60, b=50), legend_title="pair kind",
    )
    return fig


@shared_figure
def roc_figure(ranking: Ranking) -> go.Figure:
    """ROC curve of 'clean' (positive) vs corrupted, thresholding the chosen score."""
    value = (lambda r: r.score) if ranking.by == "sum" else (lambda r: r.weighted)
    rows = sorted(ranking.rows, key=lambda r: -value(r))
    pos = sum(not r.corrupted for r in rows)
    neg = len(rows) - pos
    xs, ys = [0.0], [0.0]
    tp = fp = 0
    for i, r in enumerate(rows):
        tp += not r.corrupted
        fp += r.corrupted
        if i + 1 == len(rows) or value(rows[i + 1]) != value(r):
            xs.append(fp / max(neg, 1))
            ys.append(tp / max(pos, 1))
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="lines", name="s_i", line=dict(color="#7b1fa2")))
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="chance", line=dict(dash="dash", color="#999")))
    fig.update_layout(title="ROC: keeping pairs above a score threshold", xaxis_title="corrupted pairs kept (rate)",
                      yaxis_title="clean pairs kept (rate)", height=360, margin=dict(l=10, r=10, t=60, b=50))
    return fig


def keep_summary(ranking: Ranking, keep: float) -> dict:
    """Keep the top `keep` share of the ranking: precision / recall of the corrupted pairs removed."""
    from analysis.sae_v import keep_top

    return keep_top(ranking.rows, keep)


@shared_figure
def keep_curve_figure(ranking: Ranking, keep: float | None = None, steps: int = 40) -> go.Figure:
    """Precision and recall of the corrupted pairs removed, as the kept share goes from 0 to 1."""
    from analysis.sae_v import keep_top

    keeps = [i / steps for i in range(steps + 1)]
    stats = [keep_top(ranking.rows, k) for k in keeps]
    base = sum(r.corrupted for r in ranking.rows) / max(len(ranking.rows), 1)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=keeps, y=[s["precision"] for s in stats], mode="lines", name="precision (removed)",
                             line=dict(color="#c62828"),
                             hovertemplate="keep %{x:.0%}<br>corrupted among removed %{y:.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=keeps, y=[s["recall"] for s in stats], mode="lines", name="recall (removed)",
                             line=dict(color="#1565c0"),
                             hovertemplate="keep %{x:.0%}<br>share of corrupted removed %{y:.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[0, 1], y=[base, base], mode="lines", name="random removal (precision)",
                             line=dict(color="#999", dash="dash")))
    if keep is not None:
        fig.add_vline(x=keep, line=dict(color="#555", dash="dot"))
    fig.update_layout(title="Removing the lowest-scoring pairs: which of them are corrupted?",
                      xaxis=dict(title="share of pairs kept (highest s_i first)", tickformat=".0%", range=[0, 1]),
                      yaxis=dict(title="precision / recall", range=[0, 1.02]),
                      height=340, margin=dict(l=10, r=10, t=60, b=50))
    return fig


# ---------------------------------------------------------------------------------------------
# The data-filtering experiment (benchmarks/sae_v_filtering.py writes its JSON)

FILTERING_RESULTS = paths.result_file("sae_v_filtering.json")
FILTERING_LABELS = {
    "whole_pool": "whole pool",
    "top_half_by_s_i": "top share by s_i (SAE-V)",
    "random_half": "random share",
    "clean_only_oracle": "clean pairs only (oracle)",
    "top_half_by_normalised_s_i": "top share by normalised s_i (variant)",
}
FILTERING_METRICS = {"yes_no": "yes/no accuracy", "factuality": "caption factuality", "coverage": "caption coverage"}


def filtering_results(path) -> tuple[dict | None, str | None]:
    """(results, None) from the experiment's JSON, or (None, why not) when it is absent or unreadable."""
    import json

    path = Path(path)
    if not path.is_file():
        return None, "absent"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({exc.__class__.__name__})"
    if not isinstance(data, dict) or not isinstance(data.get("conditions"), dict) or not data["conditions"]:
        return None, "it holds no conditions"
    return data, None


def filtering_bits(results: dict) -> list[str]:
    """The sentence parts that say what the stored filtering experiment found."""
    pool = results.get("pool") or {}
    verdict = results.get("verdict") or {}
    bits = []
    if pool.get("pairs"):
        bits.append(f"a pool of {pool['pairs']} pairs, {pool.get('corrupted', '?')} of them corrupted")
    if isinstance(pool.get("s_i_roc_auc_clean_vs_corrupted"), (int, float)):
        bits.append(f"s_i separates them with ROC AUC {pool['s_i_roc_auc_clean_vs_corrupted']:.3f}")
    variant = pool.get("normalised_s_i") or {}
    if isinstance(variant.get("roc_auc_clean_vs_corrupted"), (int, float)):
        bits.append(f"the labelled normalised variant with {variant['roc_auc_clean_vs_corrupted']:.3f}")
    if "top_half_beats_random_half_yes_no" in verdict:
        bits.append("the top share by s_i " + ("beats" if verdict["top_half_beats_random_half_yes_no"]
                                               else "does not beat") + " a random share on yes/no accuracy")
    if "top_half_at_least_whole_pool_yes_no" in verdict:
        bits.append("and " + ("matches or beats" if verdict["top_half_at_least_whole_pool_yes_no"]
                              else "falls short of") + " training on the whole pool")
    for key, what in (("top_half_minus_random_half", "top share − random share"),
                      ("top_half_minus_whole_pool", "top share − whole pool")):
        diff = verdict.get(key)
        if isinstance(diff, dict) and isinstance(diff.get("difference"), (int, float)):
            bits.append(f"{what}: {diff['difference']:+.3f} yes/no (standard error "
                        f"{diff.get('standard_error', float('nan')):.3f})")
    return bits


def _mean_std(entry: dict, metric: str) -> tuple[float | None, float | None]:
    summary = (entry.get("summary") or {}).get(metric) or {}
    if "mean" in summary:
        return summary.get("mean"), summary.get("std")
    values = [v for v in entry.get(metric) or [] if isinstance(v, (int, float))]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return mean, std


def filtering_rows(results: dict) -> list[dict]:
    """One row per training condition: data kept, corrupted kept, and each metric's mean ± std over seeds."""
    rows = []
    for name, entry in results["conditions"].items():
        corrupted = entry.get("kept_corrupted")
        if isinstance(corrupted, list):
            corrupted = round(sum(corrupted) / len(corrupted), 1) if corrupted else None
        row = {"condition": FILTERING_LABELS.get(name, name), "pairs kept": entry.get("kept"),
               "corrupted kept": corrupted, "steps": entry.get("steps")}
        for metric, label in FILTERING_METRICS.items():
            mean, std = _mean_std(entry, metric)
            row[label] = None if mean is None else (f"{mean:.3f} ± {std:.3f}" if std is not None else f"{mean:.3f}")
        rows.append(row)
    start = results.get("starting_checkpoint")
    if isinstance(start, dict):
        rows.append({"condition": "starting checkpoint (no fine-tune)", "pairs kept": None, "corrupted kept": None,
                     "steps": 0, **{label: (f"{start[m]:.3f}" if isinstance(start.get(m), (int, float)) else None)
                                    for m, label in FILTERING_METRICS.items()}})
    return rows


@shared_figure
def filtering_figure(results: dict) -> go.Figure:
    """Each metric per training condition: mean over seeds with ± one standard deviation."""
    fig = go.Figure()
    names = list(results["conditions"])
    colours = {"whole_pool": "#616161", "top_half_by_s_i": "#7b1fa2", "random_half": "#ef6c00",
               "clean_only_oracle": "#2e7d32", "top_half_by_normalised_s_i": "#00897b"}
    for name in names:
        entry = results["conditions"][name]
        stats = [_mean_std(entry, m) for m in FILTERING_METRICS]
        fig.add_trace(go.Bar(
            x=list(FILTERING_METRICS.values()), y=[m for m, _ in stats], name=FILTERING_LABELS.get(name, name),
            marker_color=colours.get(name), error_y=dict(type="data", array=[s or 0.0 for _, s in stats]),
            hovertemplate="%{x}: %{y:.3f}<extra>" + html.escape(FILTERING_LABELS.get(name, name)) + "</extra>"))
    start = results.get("starting_checkpoint")
    if isinstance(start, dict):
        fig.add_trace(go.Scatter(x=list(FILTERING_METRICS.values()), y=[start.get(m) for m in FILTERING_METRICS],
                                 mode="markers", name="starting checkpoint",
                                 marker=dict(symbol="line-ew-open", size=40, color="#000")))
    seeds = (results.get("training") or {}).get("seeds")
    fig.update_layout(
        barmode="group", title="Fine-tuning on filtered data: held-out quality per condition"
        + (f"<br><sup>mean ± std over {seeds} seeds</sup>" if seeds else ""),
        yaxis=dict(title="score on held-out test scenes (0–1)", range=[0, 1.05]), xaxis_title="metric",
        height=380, margin=dict(l=10, r=10, t=70, b=50), legend_title="trained on",
    )
    return fig


# ---------------------------------------------------------------------------------------------
# HTML


def highlighted_tokens_html(tokens: list[str], acts: list[float], focus: int | None = None,
                            scale: float | None = None) -> str:
    """Tokens as spans shaded by activation; the focus token is outlined. All text is escaped."""
    top = scale or max([a for a in acts if a is not None] + [1e-9])
    spans = []
    for i, (tok, a) in enumerate(zip(tokens, acts)):
        alpha = 0.0 if not a or a <= 0 else min(1.0, a / top) * 0.85 + 0.1
        outline = "outline:2px solid #7b1fa2;" if i == focus else ""
        spans.append(f'<span title="{a:.3f}" style="background:rgba(123,31,162,{alpha:.2f});'
                     f'padding:1px 3px;border-radius:3px;{outline}">{html.escape(tok)}</span>')
    return '<div style="line-height:2;font-family:monospace">' + " ".join(spans) + "</div>"


def feature_list_html(keys_values: list[tuple[str, float]]) -> str:
    return ", ".join(f"<b>{html.escape(k)}</b> ({v:.2f})" for k, v in keys_values)


# ---------------------------------------------------------------------------------------------
# Uploads


def read_image_upload(data: bytes, name: str = "upload"):
    """(PIL image, None) or (None, message): the shared upload decoder (analysis/framework/images.py)."""
    try:
        return images.open_image(data, name=f"'{name}'"), None
    except images.ImageError as exc:
        return None, str(exc)


def shared_features(explanation: InputExplanation, store: FeatureStore,
                    active_above: float) -> tuple[list[int], list[int]]:
    """(features active on a text token and an image patch of the input, strongest ω first; those of
    them that count towards s_i: they have an ω and fire above `active_above` on both sides)."""
    shared = sorted(set(explanation.text_max) & set(explanation.image_max), key=lambda f: -store.features[f].omega)
    counted = [f for f in shared if (store.features[f].has_omega if store.features[f].has_omega is not None
                                     else store.features[f].omega != 0)
               and explanation.text_max[f] > active_above and explanation.image_max[f] > active_above]
    return shared, counted


def explanation_patch_heatmap(explanation: InputExplanation, feature: int) -> list[float]:
    """A feature's activation on every patch of an explained input."""
    heat = [0.0] * (explanation.grid * explanation.grid)
    for p in explanation.positions:
        if p.modality == IMAGE:
            for s in p.features:
                if int(s.key) == feature:
                    heat[p.index] = s.value
    return heat


# ---------------------------------------------------------------------------------------------
# Steering


def steered_html(output: SteeredText, colour: str = "#c62828") -> str:
    """One output's tokens, the ones the other output does not have at this place marked. All text escaped."""
    if not output.tokens:
        return '<div style="font-family:monospace"><i>(nothing generated)</i></div>'
    spans = []
    for token, changed in zip(output.tokens, output.changed or [False] * len(output.tokens)):
        text = html.escape(token)
        if changed:
            spans.append(f'<mark style="background:{colour}22;border-bottom:2px solid {colour};padding:0 1px" '
                         f'title="changed">{text}</mark>')
        else:
            spans.append(f"<span>{text}</span>")
    return '<div style="line-height:2;font-family:monospace;white-space:pre-wrap">' + "".join(spans) + "</div>"


def steering_rows(result: SteeringResult) -> list[dict]:
    """The two outputs as a table (for the export)."""
    return [{"output": "unsteered", "text": result.unsteered.text, "changed tokens": sum(result.unsteered.changed)},
            {"output": "steered", "text": result.steered.text, "changed tokens": sum(result.steered.changed)}]



def steering_figure(result: SteeringResult) -> go.Figure:
    """The unsteered and the steered output as a two-row table, the tokens that differ in bold (a talk's step)."""
    def marked(output: SteeredText) -> str:
        return "".join(f"<b>{html.escape(t)}</b>" if c else html.escape(t)
                       for t, c in zip(output.tokens, output.changed or [False] * len(output.tokens)))

    features = ", ".join(f"{k} at {v:g}" for k, v in sorted(result.features.items()))
    fig = go.Figure(go.Table(
        columnwidth=[1, 4], header=dict(values=["output", "text (changed words in bold)"], align="left"),
        cells=dict(values=[["unsteered", f"steered (feature {features})"],
                           [marked(result.unsteered), marked(result.steered)]], align="left", height=34,
                   font=dict(size=15))))
    fig.update_layout(margin=dict(l=10, r=10, t=10, b=10))
    return fig


def top_tokens_figure(card: FeatureCard) -> go.Figure:
    """How many of a feature's strongest tokens are caption words and how many image patches (a talk's step)."""
    fig = go.Figure(go.Bar(x=["caption words", "image patches"], y=[card.n_text_top, card.n_image_top],
                           marker_color=["#1565c0", "#c62828"], text=[card.n_text_top, card.n_image_top],
                           textposition="outside"))
    fig.update_layout(title=f"Feature {card.index}: its {card.n_text_top + card.n_image_top} strongest tokens",
                      yaxis_title="tokens", margin=dict(l=10, r=10, t=40, b=10))
    return fig

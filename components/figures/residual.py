"""Plotly figures of the residual-stream panel: pure functions of analysis results."""
from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.residual import COMPONENTS, METHODS, Generation, Inspection, Patching, PairSweep, SideBySide
from components.figures.memo import shared_figure
from components.figures.text import legend_below, panel_titles, set_title

STATE_AXIS = "state s (after s layers)"  # one word for rows, lens and patching (= entering layer s)
PATCH_AXIS = STATE_AXIS
SHARE = "share of the logit difference recovered"
DIVERGING = "RdBu_r"
A_COLOUR, B_COLOUR = "#1f77b4", "#d62728"
MAX_WRITTEN = 24  # positions up to which the lens grid writes each cell's top token
# The lens grid's cells are as wide as the plot area over the positions: about 460 px at a 1024-px window with
# the sidebar open. A cell writes at most as many characters as fit in it at 10 px (about 6 px each), cut with
# "…" (the hover has the whole token): written whole, neighbours ran together ("circlecircle" on shapes-lm).
LENS_PLOT_PX = 460
CHAR_PX = 6.0
METRICS = {  # lens cell metric -> (colour-bar title, colour scale, range)
    "target_prob": ("P(target)", "Viridis", (0.0, 1.0)),
    "kl": ("KL to final (nats)", "Magma_r", (0.0, None)),
    "top_prob": ("P(top token)", "Viridis", (0.0, 1.0)),
}


WHITESPACE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


def visible(token: str) -> str:
    """A token a cell can show: one of only whitespace drawn as its signs (a space token left cells blank),
    an empty one as ∅; any other as it is."""
    if token.strip():
        return token
    return "".join(WHITESPACE.get(c, "·") for c in token) or "∅"


def _tokens(tokens: list[str]) -> list[str]:
    """Axis labels: a token's position and its text, escaped, with spaces shown."""
    return [f"{j}:{html.escape(t).replace(' ', '·') or '∅'}" for j, t in enumerate(tokens)]


def cell_text(token: str, fits: int) -> str:
    """A token as a lens cell writes it: spaces shown as "·", at most `fits` characters (cut with "…")."""
    text = token.replace(" ", "·")
    return text if len(text) <= fits else text[:max(fits - 1, 1)] + "…"


@shared_figure
def lens_figure(result: Inspection, metric: str = "target_prob") -> go.Figure:
    """Layer x position: the chosen lens's top token in each cell, coloured by `metric`."""
    lens = result.lens
    title, scale, (low, high) = METRICS[metric]
    if metric == "top_prob":
        z = [[cell[0] for cell in row] for row in lens.top_probs]
    else:
        z = getattr(lens, metric)
    fits = max(1, int(LENS_PLOT_PX / max(len(result.tokens), 1) / CHAR_PX))
    text = [[html.escape(cell_text(visible(cell[0]), fits)) for cell in row] for row in lens.top_tokens]
    hover = [[f"top: {', '.join(html.escape(t) for t in lens.top_tokens[i][j])}<br>"
              f"P(target {html.escape(result.target)}) = {lens.target_prob[i][j]:.3f}, rank {lens.target_rank[i][j] + 1}<br>"
              f"KL to final = {lens.kl[i][j]:.3f} nats" for j in range(len(row))] for i, row in enumerate(z)]
    # the top token written in each cell while the cells are wide enough to read; beyond, hover says it
    written = dict(text=text, texttemplate="%{text}", textfont=dict(size=9)) if len(result.tokens) <= MAX_WRITTEN else {}
    fig = go.Figure(go.Heatmap(z=z, x=_tokens(result.tokens), y=list(range(len(z))), **written,
                               hovertext=hover, hoverinfo="text",
                               colorscale=scale, zmin=low, zmax=high, colorbar=dict(title=title)))
    fig.update_xaxes(title_text="position: token of the prompt", tickangle=-45)
    fig.update_yaxes(title_text=STATE_AXIS, dtick=max(1, len(z) // 15))
    fig.update_layout(height=max(360, 22 * len(z) + 160))
    lens_name = "Tuned lens" if lens.lens == "tuned" else "Logit lens"
    return set_title(fig, f"{lens_name}: each layer's top next token; colour {title}", chars=80)


@shared_figure
def lens_curves(result: Inspection) -> go.Figure:
    """At the last position, per state: P(target) and KL to the final distribution."""
    lens = result.lens
    states = list(range(len(lens.kl)))
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"P({result.target.strip()}) at the last position",
                                                         "KL(final ‖ lens) at the last position"),
                        horizontal_spacing=0.14)
    fig.add_scatter(x=states, y=lens.last(lens.target_prob), mode="lines+markers", name="P(target)", row=1, col=1)
    fig.add_scatter(x=states, y=lens.last(lens.kl), mode="lines+markers", name="KL", row=1, col=2, showlegend=False)
    fig.update_xaxes(title_text=STATE_AXIS)
    fig.update_yaxes(title_text="probability", range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(title_text="KL (nats)", row=1, col=2)
    fig.update_layout(height=380, showlegend=False)
    return panel_titles(fig)


@shared_figure
def dla_figure(result: Inspection) -> go.Figure:
    """Direct logit attribution per layer (attention, MLP) and per head."""
    dla = result.dla
    what = f"logit({result.target.strip()})" + (f" − logit({result.foil.strip()})" if result.foil else "")
    layers = list(range(len(dla.attn)))
    # one above the other: side by side, the heat map's layer axis ran into the bars at a 1024-px window
    bars, grid, gap = 240, max(220, 14 * len(layers)), 110
    fig = make_subplots(rows=2, cols=1, row_heights=[bars, grid], vertical_spacing=gap / (bars + grid + gap),
                        subplot_titles=("Per layer", "Per head"))
    fig.add_bar(x=layers, y=dla.attn, name="attention", marker_color=A_COLOUR, row=1, col=1)
    fig.add_bar(x=layers, y=dla.mlp, name="MLP", marker_color=B_COLOUR, row=1, col=1)
    top = max((abs(v) for row in dla.heads for v in row), default=1.0) or 1.0
    fig.add_heatmap(z=dla.heads, x=[f"H{h}" for h in range(len(dla.heads[0]))], y=layers, colorscale=DIVERGING,
                    zmin=-top, zmax=top, colorbar=dict(title="logit units", y=0.0, yanchor="bottom",
                                                       len=grid / (bars + grid + gap)), row=2, col=1)
    fig.update_xaxes(title_text="layer", row=1, col=1)
    fig.update_yaxes(title_text="direct effect<br>(logit units)", row=1, col=1)
    fig.update_xaxes(title_text="head", row=2, col=1)
    fig.update_yaxes(title_text="layer", row=2, col=1)
    fig.update_layout(barmode="group", height=bars + grid + gap + 200)
    set_title(fig, f"Direct logit attribution to {what}: embeddings {dla.embed:+.2f}, total {dla.total:+.2f} "
                   f"(the model: {dla.model_value:+.2f})", chars=60, top=80)
    return panel_titles(legend_below(fig))


@shared_figure
def patch_figure(result: Patching, component: str) -> go.Figure:
    """Exact and attribution patching of one component side by side, on one colour scale."""
    grids = [g for g in result.grids if g.component == component]
    fig = make_subplots(rows=1, cols=len(grids), shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=[{"exact": "Exact patching", "attribution": "Attribution patching (estimate)"}
                                        .get(g.method, f"{METHODS.label(g.method)} (estimate)") for g in grids])
    for k, g in enumerate(grids):
        cols = _tokens(result.clean_tokens) if g.component == "residual" else g.cols
        fig.add_heatmap(z=g.share, x=cols, y=list(range(len(g.rows))), colorscale=DIVERGING, zmin=-1, zmax=1,
                        colorbar=dict(title="share"), showscale=k == 0, row=1, col=k + 1,
                        hovertemplate="%{x}, layer %{y}: %{z:.3f}<extra></extra>")
        axis = {"residual": "position: token of the clean prompt", "heads": "head", "queries": "head (its queries)",
                "keys": "head (its keys)"}.get(g.component, "")
        fig.update_xaxes(title_text=axis, tickangle=-45 if g.component == "residual" else 0, row=1, col=k + 1)
    fig.update_yaxes(title_text=PATCH_AXIS if component == "residual" else "layer", row=1, col=1)
    fig.update_layout(height=max(360, 16 * len(grids[0].rows) + 170))
    corr = result.correlation.get(component)
    note = f" — exact vs attribution: r = {corr:.2f}" if corr is not None else ""
    return panel_titles(set_title(fig, f"{COMPONENTS.label(component)}: {SHARE}{note}", chars=60))


@shared_figure
def agreement_figure(result: Patching) -> go.Figure:
    """Every cell: the attribution estimate against the exact share (the diagonal is agreement)."""
    fig = go.Figure()
    for comp in dict.fromkeys(g.component for g in result.grids):
        exact, attr = result.grid(comp, "exact"), result.grid(comp, "attribution")
        if exact is None or attr is None:
            continue
        xs = [v for row in exact.share for v in row]
        ys = [v for row in attr.share for v in row]
        fig.add_scatter(x=xs, y=ys, mode="markers", name=f"{comp} (r = {result.correlation.get(comp, float('nan')):.2f})",
                        marker=dict(size=6, opacity=0.7))
    fig.add_scatter(x=[-1, 1.2], y=[-1, 1.2], mode="lines", line=dict(color="grey", dash="dot"), name="agreement")
    fig.update_xaxes(title_text=f"exact patching ({SHARE})")
    fig.update_yaxes(title_text="attribution patching estimate (same units)")
    fig.update_layout(height=420)
    return legend_below(set_title(fig, "When is the cheap estimate trustworthy? Each dot is one cell", chars=80))


@shared_figure
def side_figure(result: SideBySide) -> go.Figure:
    """Per state at the last position: P(target) and DLA per layer of both sides, and their difference."""
    a, b = result.a, result.b
    states = list(range(len(a.lens.kl)))
    layers = list(range(len(a.dla.attn)))
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09, subplot_titles=(
        f"P({a.target.strip()}) at the last position", "KL(final ‖ lens), last position",
        "Direct logit attribution per layer"))
    for side, colour, label in ((a, A_COLOUR, result.a_label), (b, B_COLOUR, result.b_label)):
        fig.add_scatter(x=states, y=side.lens.last(side.lens.target_prob), name=label, legendgroup=label,
                        line=dict(color=colour), row=1, col=1)
        fig.add_scatter(x=states, y=side.lens.last(side.lens.kl), name=label, legendgroup=label, showlegend=False,
                        line=dict(color=colour), row=1, col=2)
        fig.add_scatter(x=layers, y=side.dla.layers(), name=label, legendgroup=label, showlegend=False,
                        line=dict(color=colour), row=1, col=3)
    fig.add_bar(x=states, y=result.target_prob_diff, name=f"difference ({result.a_label} − {result.b_label})",
                marker_color="#7f7f7f", opacity=0.5, row=1, col=1)
    fig.add_bar(x=states, y=result.kl_diff, showlegend=False, marker_color="#7f7f7f", opacity=0.5, row=1, col=2)
    fig.add_bar(x=layers, y=result.dla_diff, showlegend=False, marker_color="#7f7f7f", opacity=0.5, row=1, col=3)
    fig.update_xaxes(title_text=STATE_AXIS, row=1, col=1)
    fig.update_xaxes(title_text=STATE_AXIS, row=1, col=2)
    fig.update_xaxes(title_text="layer", row=1, col=3)
    fig.update_yaxes(title_text="probability", row=1, col=1)
    fig.update_yaxes(title_text="nats", row=1, col=2)
    fig.update_yaxes(title_text="logit units", row=1, col=3)
    fig.update_layout(height=420)
    return panel_titles(legend_below(fig))


@shared_figure
def sweep_figure(result: PairSweep) -> go.Figure:
    """Mean share recovered per state at the subject's last token, the last token and elsewhere."""
    states = list(range(result.layers))
    fig = go.Figure()
    for values, colour, label, dash in (
            (result.subject, B_COLOUR, "subject's last token (exact)", None),
            (result.last, A_COLOUR, "last token (exact)", None),
            (result.other, "#7f7f7f", "other positions (exact)", None),
            (result.subject_attribution, B_COLOUR, "subject's last token (attribution)", "dash"),
            (result.last_attribution, A_COLOUR, "last token (attribution)", "dash")):
        fig.add_scatter(x=states, y=values, name=label, line=dict(color=colour, dash=dash))
    fig.update_xaxes(title_text=PATCH_AXIS)
    fig.update_yaxes(title_text=f"{SHARE} (mean over pairs)")
    fig.update_layout(height=420)
    return legend_below(set_title(fig, f"Residual patching over {len(result.runs)} pairs "
                                       f"(exact vs attribution r = {result.correlation:.2f} over every cell"
                                       + ("" if result.median_correlation != result.median_correlation else
                                          f", median of each pair's own r = {result.median_correlation:.2f}")
                                       + ")", chars=80))


def held_out_rows(held: dict) -> list[dict]:
    """Per state: the mean KL to the output of the logit and the tuned lens, and where the tuned lens is closer."""
    closer = held.get("closer") or [None] * len(held["logit"])
    return [{"state": i, "logit lens: mean KL (nats)": round(a, 2), "tuned lens": round(b, 2),
             "tokens where the tuned lens is closer": "—" if c is None or i == len(held["logit"]) - 1 else f"{c:.0%}"}
            for i, (a, b, c) in enumerate(zip(held["logit"], held["tuned"], closer))]


def last_position_rows(result: Inspection) -> list[dict]:
    """Per layer, at the last position: the lens's top token, P(target), its rank, KL to the final layer."""
    lens = result.lens
    return [{"state": i, "top token": visible(lens.top_tokens[i][-1][0]), "P(top)": round(lens.top_probs[i][-1][0], 3),
             f"P({result.target.strip()})": round(lens.target_prob[i][-1], 3), "target rank (1 = top)": lens.target_rank[i][-1] + 1,
             "KL to final (nats)": round(lens.kl[i][-1], 3)} for i in range(len(lens.kl))]


def peak_rows(result: Patching, component: str, top: int = 5) -> list[dict]:
    """Residual stream: per layer, the position whose patch restores most, and the last token's share.
    Other components: the `top` cells with the largest exact (else estimated) share."""
    grid = result.grid(component, "exact") or next(g for g in result.grids if g.component == component)
    if component == "residual":
        rows = []
        for i, row in enumerate(grid.share):
            j = max(range(len(row)), key=lambda k: row[k])
            rows.append({"state": i, "position": j, "token": result.clean_tokens[j], "share there": round(row[j], 3),
                         "share at the last token": round(row[-1], 3)})
        return rows
    cells = sorted(((v, i, j) for i, row in enumerate(grid.share) for j, v in enumerate(row)), reverse=True)[:top]
    return [{"layer": i, "head" if component in ("heads", "queries", "keys") else "output": grid.cols[j],
             f"share ({grid.method})": round(v, 3)} for v, i, j in cells]


COMMIT_LABELS = {"first": "first top-1", "stays": "top-1 from there on"}
LENS_MARKERS = {"logit": ("circle", "#111111"), "tuned": ("diamond", "#ff7f0e")}


@shared_figure
def strip_figure(result: Generation, definition: str = "first") -> go.Figure:
    """The commitment strip: per generated token (x), the states (y) where the chosen lens has it top-1, each
    lens's commitment state marked, and the model's own P(token) below."""
    states, tokens = result.layers + 1, _tokens(result.tokens)
    main = result.strips[-1]  # the chosen lens (the logit lens comes first when a tuned one is beside it)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.75, 0.25], vertical_spacing=0.06,
                        subplot_titles=(f"Where the {main.lens} lens has the generated token on top (dark: top-1)",
                                        "The model's own P(token)"))
    z = [[int(main.top1[k][s]) for k in range(len(tokens))] for s in range(states)]
    fig.add_heatmap(z=z, x=tokens, y=list(range(states)), colorscale=[[0, "#f2f2f2"], [1, "#4c78a8"]], zmin=0, zmax=1,
                    showscale=False, hovertemplate="%{x}, state %{y}: top-1 = %{z}<extra></extra>", row=1, col=1)
    for strip in result.strips:
        symbol, colour = LENS_MARKERS.get(strip.lens, ("x", "#d62728"))
        ys = strip.commitment(definition)
        fig.add_scatter(x=[t for t, y in zip(tokens, ys) if y is not None], y=[y for y in ys if y is not None],
                        mode="markers", marker=dict(symbol=symbol, size=10, color=colour, line=dict(width=1, color="white")),
                        name=f"{strip.lens} lens: {COMMIT_LABELS[definition]}", row=1, col=1)
    fig.add_bar(x=tokens, y=result.prob, marker_color="#7f7f7f", name="P(token)", showlegend=False, row=2, col=1)
    fig.update_yaxes(title_text="state s (after s layers)", range=[-0.5, states - 0.5], row=1, col=1)
    fig.update_yaxes(title_text="P", range=[0, 1], row=2, col=1)
    fig.update_xaxes(title_text="generated token", tickangle=-45, row=2, col=1)
    fig.update_layout(height=max(420, 14 * states + 300))
    set_title(fig, f"Commitment strip ({COMMIT_LABELS[definition]}): {len(tokens)} generated tokens", chars=80)
    return panel_titles(legend_below(fig))


def strip_rows(result: Generation) -> list[dict]:
    """Per generated token: its text, the model's P and top-1, and each lens's two commitment states."""
    rows = []
    for k, token in enumerate(result.tokens):
        row = {"#": k, "token": visible(token), "P(token)": round(result.prob[k], 3), "model's top-1": visible(result.top[k])}
        for strip in result.strips:
            first, stays = strip.first[k], strip.stays[k]
            row[f"{strip.lens}: first top-1 (state)"] = "never" if first is None else str(first)
            row[f"{strip.lens}: top-1 from state"] = "not the model's top-1" if stays is None else str(stays)
        rows.append(row)
    return rows


def _chip(token: str, prob: float, index: int, style: str = "") -> str:
    return (f'<span class="rs-tok" title="#{index} · P = {prob:.3g}" style="display:inline-block;margin:1px;'
            f'padding:0 3px;border-radius:3px;{style}">{html.escape(visible(token))}</span>')


def _text_block(title: str, chips: list[str]) -> str:
    return (f'<div style="flex:1;min-width:220px"><div style="font-weight:600;margin-bottom:4px">'
            f'{html.escape(title)}</div><div style="line-height:1.9;font-family:monospace">{"".join(chips)}</div></div>')


def continuations_html(result: Generation, branch=None) -> str:
    """The generated text token by token (every one of them, numbered in its tooltip), and beside it a branch's:
    the shared tokens grey, the first difference outlined, each text's probability from the branch point."""
    shared = "background:#eeeeee;color:#555"
    first = None if branch is None or branch.first_difference is None else branch.at + branch.first_difference
    main = []
    for k, (token, prob) in enumerate(zip(result.tokens, result.prob)):
        style = shared if branch is not None and k < branch.at else "background:#dbe9f6"
        if k == first:
            style += ";outline:2px solid #d62728"
        main.append(_chip(token, prob, k, style))
    blocks = [_text_block(f"Generated text ({len(result.tokens)} tokens)"
                          + (f" · P from token {branch.at} = {branch.main_path_prob:.3g}" if branch else ""), main)]
    if branch is not None:
        chips = [_chip(t, p, k, shared) for k, (t, p) in enumerate(zip(result.tokens[:branch.at], result.prob))]
        for i, (token, prob) in enumerate(zip(branch.tokens, branch.prob)):
            style = "background:#fde0c5" + (";outline:2px solid #d62728" if branch.at + i == first else "")
            chips.append(_chip(token, prob, branch.at + i, style))
        blocks.append(_text_block(f"Branch: {visible(branch.token)!r} at token {branch.at} ({len(branch.tokens)} "
                                  f"tokens from there) · P = {branch.path_prob:.3g}", chips))
    return f'<div style="display:flex;gap:16px;flex-wrap:wrap">{"".join(blocks)}</div>'


def branch_rows(branch) -> list[dict]:
    """Per position from the branch point: the main text's token and the branch's, each with the model's P."""
    rows = []
    for i in range(max(len(branch.main_tokens), len(branch.tokens))):
        main = branch.main_tokens[i] if i < len(branch.main_tokens) else ""
        other = branch.tokens[i] if i < len(branch.tokens) else ""
        main, other = visible(main) if main else "", visible(other) if other else ""
        rows.append({"#": branch.at + i, "generated": main,
                     "P (generated)": round(branch.main_prob[i], 4) if i < len(branch.main_prob) else None,
                     "branch": other, "P (branch)": round(branch.prob[i], 4) if i < len(branch.prob) else None,
                     "same": i < min(len(branch.main_ids), len(branch.ids)) and branch.main_ids[i] == branch.ids[i]})
    return rows


GRAPH_COLOURS = {"attn": "#1f77b4", "attn_residual": "#bbbbbb", "mlp": "#ff7f0e", "mlp_residual": "#bbbbbb"}
GRAPH_KINDS = {"attn": "attention edge (source → destination)", "attn_residual": "residual past attention",
               "mlp": "MLP", "mlp_residual": "residual past the MLP"}


def contribution_graph_figure(graph) -> go.Figure:
    """The contribution graph (analysis/residual/contributions.py) over (position, state): state s is the
    residual stream after s layers (0: the embeddings), s + ½ the stream after layer s's attention; each kept
    edge drawn with a width that grows with its importance."""
    fig = go.Figure()
    for kind, colour in GRAPH_COLOURS.items():
        for low, high, width in ((0.0, 0.1, 1.0), (0.1, 0.3, 2.5), (0.3, 1.01, 5.0)):
            xs, ys = [], []
            for e in graph.edges:
                if e.kind == kind and low <= e.weight < high:
                    bottom = e.layer + (0.5 if kind.startswith("mlp") else 0.0)
                    xs += [e.source, e.target, None]
                    ys += [bottom, bottom + 0.5, None]
            if xs:
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": colour, "width": width},
                                         hoverinfo="skip", showlegend=False))
    hx, hy, text = [], [], []
    for e in graph.edges:
        bottom = e.layer + (0.5 if e.kind.startswith("mlp") else 0.0)
        hx.append((e.source + e.target) / 2)
        hy.append(bottom + 0.25)
        top = ""
        if e.heads:
            h = max(range(len(e.heads)), key=lambda k: e.heads[k])
            top = f"<br>largest head: L{e.layer}H{h} ({e.heads[h]:.3f})"
        text.append(f"{GRAPH_KINDS[e.kind]}, layer {e.layer}: {e.source} → {e.target}<br>importance {e.weight:.3f}{top}")
    for kind, colour in GRAPH_COLOURS.items():
        if kind in ("attn", "mlp"):
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line={"color": colour, "width": 3},
                                     name=GRAPH_KINDS[kind]))
    fig.add_trace(go.Scatter(x=hx, y=hy, mode="markers", marker={"size": 6, "color": "rgba(0,0,0,0.15)"},
                             hovertext=text, hoverinfo="text", showlegend=False))
    fig.add_trace(go.Scatter(x=[graph.position], y=[graph.layers], mode="markers", name="output node",
                             marker={"size": 12, "symbol": "star", "color": "#d62728"}))
    fig.update_xaxes(tickvals=list(range(len(graph.tokens))), ticktext=_tokens(graph.tokens), title="position",
                     range=[-0.5, len(graph.tokens) - 0.5])
    fig.update_yaxes(title=STATE_AXIS, range=[-0.3, graph.layers + 0.3])
    set_title(fig, f"Contribution graph from {graph.position}: {graph.nodes} of {graph.possible_nodes} nodes kept "
                   f"(τ = {graph.threshold}); kept edges carry {graph.kept_share:.0%} of each kept node's importance")
    legend_below(fig)
    fig.update_layout(height=max(360, 22 * graph.layers + 160))
    return fig


def graph_path_rows(graph, top: int = 8) -> list[dict]:
    """The strongest kept path from each source position's embedding to the output node."""
    rows = []
    for j in graph.ranked_sources(skip_own=False)[:top]:
        hops = [f"L{e.layer}H{max(range(len(e.heads)), key=lambda k: e.heads[k])} {e.source}→{e.target}"
                for e in graph.best_path[j] if e.kind == "attn"]
        rows.append({"position": j, "token": graph.tokens[j], "strongest path": round(graph.source_strength[j], 4),
                     "attention hops (largest head)": ", ".join(hops) or "residual only"})
    return rows


def false_negative_rows(found: list) -> list[dict]:
    """One row per component and estimate: how many of the exact top-5 % cells the estimate's top 5 % misses,
    and which (`FalseNegatives` of a patching run, or the totals over every pair)."""
    return [{"component": COMPONENTS.label(f.component), "estimate": METHODS.label(f.method),
             "exact top 5 %": f"{f.top} of {f.cells}", "missed": f.count,
             "which (exact share)": ", ".join(f"{m} ({e:+.3f})" for m, e in zip(f.missed, f.effects)) or "none",
             "top 5 % from |share|": round(f.cut, 3)}
            for f in found]


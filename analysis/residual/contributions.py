"""The contribution graph of Ferrando & Voita 2024 (*Information flow routes: automatically interpreting
language models at scale*), implemented from the paper's equations.

Every block adds to the residual stream, so the representation it writes is a sum of parts:

- attention of layer l at destination position i: x_mid[l, i] = x[l, i] + sum_j sum_h z[l, i <- j, h] (+ the
  output projection's bias, which belongs to no source), where z[l, i <- j, h] = a[h, i, j] * W_O^h v_h[j]
  is what head h moves from source position j (its attention weight times its value through the output
  projection);
- the MLP of layer l at position i: x[l + 1, i] = x_mid[l, i] + mlp[l, i].

The importance of a part z of a sum y is its *proximity* to y, the paper's proportion with the L1 norm:

    prox(z, y) = max(0, ||y||_1 - ||y - z||_1),    importance(z, y) = prox(z, y) / sum over y's parts of prox

(the residual x[l, i] / x_mid[l, i] is one of the parts). An attention edge j -> i of layer l weighs the sum
of its heads' importances (each head's is kept too). The graph is built top-down as the paper does: from the
residual state at the output (after the last layer) at the chosen position, keep every edge whose importance
exceeds the threshold tau and continue from the node it comes from, down to the embeddings.

Cost: one forward (the residual states, attention and MLP outputs, the attention weights and each head's
output are captured through the backend seam), then the decomposition: each layer's value vectors are
recomputed from the captured input with the layer's own norm and value projection (checked against the
captured head outputs), multiplied by the output projection once per (source, head), and weighed per
destination. No forward per edge (benchmarks/residual_graph.py measures the ratio).

Sequential pre-norm blocks only (Llama, Mistral, Qwen, SmolLM2, the Shapes World zoo): a model whose
attention output is not such a sum, or whose MLP does not read x_mid, is refused with the reason.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from analysis import backends
from analysis.backends import Request, Site
from analysis.framework.results import Result
from analysis.model_access import anatomy
from analysis.model_access.models import ModelHandle, require_kind
from analysis.residual.errors import ResidualError
from analysis.residual.sites import head_weights, layer_parts

TOLERANCE = 1e-3  # relative: how closely the decomposition must add up to the captured outputs
CHUNK = 16  # destination positions weighed at once
BUDGET = 1 << 24  # elements of (destination, source, head, width) parts held at once (64 MB in float32)


def proximity(parts: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    """max(0, ||y||_1 - ||y - z||_1) of each part z (..., D) against its sum y (broadcast to the parts)."""
    return (whole.abs().sum(-1) - (whole - parts).abs().sum(-1)).clamp(min=0)


def normalised(*proxs: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """Each proximity over the sum of all of them (the parts' axes `dims` of each summed away; a sum of 0
    gives importance 0)."""
    total = sum(p.sum(dim=d) if d else p for p, d in zip(proxs, dims))
    total = torch.where(total > 0, total, torch.ones_like(total))
    return tuple(p / total.reshape(total.shape + (1,) * len(d)) if d else p / total for p, d in zip(proxs, dims))


@dataclass
class Importances:
    """Every importance of one prompt (all float32 on the CPU): attn (L, T_dest, T_src, H) per head,
    attn_residual (L, T), mlp (L, T), mlp_residual (L, T); per destination they sum to 1."""

    attn: torch.Tensor
    attn_residual: torch.Tensor
    mlp: torch.Tensor
    mlp_residual: torch.Tensor
    logits: torch.Tensor  # the model's logits (T, V)
    seconds: dict[str, float] = field(default_factory=dict)


def _check(what: str, got: torch.Tensor, want: torch.Tensor, label: str, layer: int) -> None:
    gap = float((got - want).abs().max())
    scale = max(1.0, float(want.abs().max()))
    if gap > TOLERANCE * scale:
        raise ResidualError(f"The contribution graph cannot decompose {label}: at layer {layer} {what} "
                            f"(off by {gap:.2e}); it needs sequential pre-norm blocks whose attention output is "
                            f"a weighted sum of value vectors through the output projection.")


def _values(block: torch.nn.Module, attention: torch.nn.Module, x: torch.Tensor, label: str) -> torch.Tensor:
    """The value vectors (T, H_kv * d) the layer computes from its input x (T, D)."""
    norm = next((getattr(block, n) for n in ("input_layernorm", "ln_1", "attention_norm")
                 if isinstance(getattr(block, n, None), torch.nn.Module)), None)
    proj = getattr(attention, "v_proj", None)
    if norm is None or not isinstance(proj, torch.nn.Module):
        raise ResidualError(f"The contribution graph cannot find the value projection of {label} (it needs a "
                            "pre-norm attention with a separate v_proj).")
    return proj(norm(x[None]))[0].float()


@torch.no_grad()
def importances(handle: ModelHandle, input_ids: torch.Tensor) -> Importances:
    """Every edge's importance for the prompt `input_ids` (1, T), from one forward."""
    lm = handle.language_model
    n = anatomy.n_layers(lm)
    label = handle.spec.label
    layout = anatomy.head_layout(lm)
    heads, groups = layout.heads, layout.groups
    t0 = time.process_time()
    reads = tuple(Site(kind, i) for i in range(n) for kind in ("block_in", "heads", "attn_weights", "attn_out",
                                                                "mlp_out"))
    got = backends.run(handle, Request(inputs={"input_ids": input_ids, "use_cache": False},
                                       reads=reads + (Site("block_out", n - 1),), logits=0, root="language_model"))
    t1 = time.process_time()
    parts = layer_parts(lm)
    T = input_ids.shape[1]
    attn_imp = torch.zeros(n, T, T, heads)
    attn_res, mlp_imp, mlp_res = torch.zeros(n, T), torch.zeros(n, T), torch.zeros(n, T)
    device = handle.device
    for layer in range(n):
        x = got[Site("block_in", layer)][0].float().to(device)
        post = got[Site("block_in", layer + 1) if layer + 1 < n else Site("block_out", n - 1)][0].float().to(device)
        attn_out = got[Site("attn_out", layer)][0].float().to(device)
        mlp_out = got[Site("mlp_out", layer)][0].float().to(device)
        pattern = got[Site("attn_weights", layer)][0].float().to(device)  # (H, T, T)
        z = got[Site("heads", layer)][0].float().to(device)  # (T, H, d)
        p = parts[layer]
        if p.attn_norm is not None:
            raise ResidualError(f"The contribution graph cannot decompose {label}: its attention output passes "
                                "through a norm before the residual stream (a sum's parts do not survive a norm).")
        v = _values(p.block, p.attention, x.to(next(p.attention.parameters()).dtype), label)
        v = v.reshape(T, heads // groups, -1).repeat_interleave(groups, dim=1)  # (T, H, d): head h reads h // groups
        _check("the heads' outputs differ from attention weights times values",
               torch.einsum("hij,jhd->ihd", pattern, v), z, label, layer)
        w_o, bias = head_weights(p, heads)  # (H, d, D)
        w_o = w_o.to(device)
        moved = torch.einsum("jhd,hdD->jhD", v, w_o)  # (T_src, H, D): what head h would move from j at weight 1
        total = torch.einsum("hij,jhD->iD", pattern, moved) + (bias.to(device) if bias is not None else 0)
        _check("the heads' shares do not add up to the attention output", total, attn_out, label, layer)
        mid = x + attn_out
        _check("the MLP's output and its input do not add up to the layer's output", mid + mlp_out, post, label, layer)
        width = heads * moved.shape[-1]
        for start in range(0, T, CHUNK):
            dest = slice(start, min(T, start + CHUNK))
            y = mid[dest]  # (C, D)
            sources = dest.stop  # causal: a destination reads no later source
            p_attn = torch.zeros(dest.stop - start, sources, heads, device=device)
            step = max(1, BUDGET // ((dest.stop - start) * width))
            for s0 in range(0, sources, step):
                src = slice(s0, min(sources, s0 + step))
                z_parts = pattern[:, dest, src].permute(1, 2, 0)[..., None] * moved[None, src]  # (C, S, H, D)
                p_attn[:, src] = proximity(z_parts, y[:, None, None, :])
            p_res = proximity(x[dest], y)
            a, r = normalised(p_attn, p_res, dims=((1, 2), ()))
            attn_imp[layer, dest, :sources], attn_res[layer, dest] = a.cpu(), r.cpu()
        m, r = normalised(proximity(mlp_out, post), proximity(mid, post), dims=((), ()))
        mlp_imp[layer], mlp_res[layer] = m.cpu(), r.cpu()
    t2 = time.process_time()
    return Importances(attn_imp, attn_res, mlp_imp, mlp_res, got.logits[0].float(),
                       seconds={"forward_cpu": t1 - t0, "contributions_cpu": t2 - t1})


@dataclass
class Edge(Result):
    """A kept edge. kind: 'attn' (source position's residual state `layer` -> destination's state after
    layer `layer`'s attention), 'attn_residual' (the destination's own residual past attention), 'mlp' and
    'mlp_residual' (state after attention -> state `layer` + 1, through the MLP or past it)."""

    kind: str
    layer: int
    source: int  # position
    target: int  # position
    weight: float
    heads: list[float] = field(default_factory=list)  # attn: each head's importance (they sum to weight)


@dataclass
class ContributionGraph(Result):
    """The contribution graph of one prompt, built top-down from `position` at the output."""

    model: str
    prompt: str
    tokens: list[str]
    position: int
    prediction: str
    threshold: float
    layers: int
    heads: int
    edges: list[Edge]
    nodes: int  # kept (state, position) nodes, states after attention included
    possible_nodes: int  # 2 * layers * T + T
    kept_share: float  # mean over kept nodes above the embeddings: the share of their importance kept edges carry
    source_strength: list[float]  # per position: the strongest kept path's strength (product of weights) from
    #                               its embedding to the output node; 0 if none
    best_path: list[list[Edge]]  # per position: that path, bottom-up (empty if none)
    seconds: dict[str, float] = field(default_factory=dict)

    def ranked_sources(self, *, skip_own: bool = True) -> list[int]:
        """Positions by their strongest path, strongest first (the output position left out by default)."""
        order = sorted(range(len(self.tokens)), key=lambda j: -self.source_strength[j])
        return [j for j in order if self.source_strength[j] > 0 and not (skip_own and j == self.position)]


def build_graph(imp: Importances, position: int, threshold: float) -> tuple[list[Edge], int, float, list[float],
                                                                          list[list[Edge]]]:
    """The paper's top-down construction: (edges, kept nodes, kept share, source strengths, best paths)."""
    n, T = imp.mlp.shape
    kept: set[tuple[str, int, int]] = {("R", n, position)}  # R: residual state s; A: after attention of layer l
    edges: list[Edge] = []
    shares: list[float] = []
    best: dict[tuple[str, int, int], tuple[float, Edge | None]] = {("R", n, position): (1.0, None)}

    def reach(node, weight, edge, above):
        strength = best[above][0] * weight
        if strength > best.get(node, (0.0, None))[0]:
            best[node] = (strength, edge)
        kept.add(node)

    for layer in range(n - 1, -1, -1):
        for i in sorted(k[2] for k in kept if k[0] == "R" and k[1] == layer + 1):
            node, share = ("R", layer + 1, i), 0.0
            for kind, w in (("mlp", float(imp.mlp[layer, i])), ("mlp_residual", float(imp.mlp_residual[layer, i]))):
                if w > threshold:
                    e = Edge(kind, layer, i, i, w)
                    edges.append(e)
                    share += w
                    reach(("A", layer, i), w, e, node)
            shares.append(share)
        for i in sorted(k[2] for k in kept if k[0] == "A" and k[1] == layer):
            node, share = ("A", layer, i), 0.0
            w = float(imp.attn_residual[layer, i])
            if w > threshold:
                e = Edge("attn_residual", layer, i, i, w)
                edges.append(e)
                share += w
                reach(("R", layer, i), w, e, node)
            per_source = imp.attn[layer, i].sum(-1)
            for j in range(T):
                w = float(per_source[j])
                if w > threshold:
                    e = Edge("attn", layer, j, i, w, [float(h) for h in imp.attn[layer, i, j]])
                    edges.append(e)
                    share += w
                    reach(("R", layer, j), w, e, node)
            shares.append(share)
    strength, paths = [], []
    for j in range(T):
        s, e = best.get(("R", 0, j), (0.0, None))
        strength.append(s)
        path = []
        while e is not None:
            path.append(e)
            above = ("R", e.layer + 1, e.target) if e.kind.startswith("mlp") else ("A", e.layer, e.target)
            e = best[above][1]
        paths.append(path)
    return edges, len(kept), (sum(shares) / len(shares) if shares else 0.0), strength, paths


def contribution_graph(handle: ModelHandle, prompt: str, *, threshold: float = 0.04,
                       position: int | None = None) -> ContributionGraph:
    """The contribution graph of `prompt` from `position` (None: the last) at the output, pruned at `threshold`."""
    from analysis.residual.prompts import encoded, show

    require_kind(handle, "causal_lm", "vlm", panel="residual stream")
    if not 0 <= threshold < 1:
        raise ResidualError(f"The threshold must be in [0, 1), got {threshold}.")
    ids = encoded(handle, prompt, "prompt")
    T = ids.shape[1]
    pos = T - 1 if position is None else position
    if not -T <= pos < T:
        raise ResidualError(f"Position {pos} is outside the prompt's {T} tokens (0..{T - 1}).")
    pos %= T
    imp = importances(handle, ids.to(handle.device))
    t0 = time.process_time()
    edges, nodes, share, strength, paths = build_graph(imp, pos, threshold)
    seconds = dict(imp.seconds, graph_cpu=time.process_time() - t0)
    tok = handle.tokenizer
    return ContributionGraph(
        model=handle.spec.label, prompt=prompt, tokens=show(tok, ids[0].tolist()), position=pos,
        prediction=tok.decode([int(imp.logits[pos].argmax())]), threshold=threshold, layers=imp.mlp.shape[0],
        heads=imp.attn.shape[-1], edges=edges, nodes=nodes, possible_nodes=2 * imp.mlp.shape[0] * T + T,
        kept_share=share, source_strength=strength, best_path=paths, seconds=seconds)

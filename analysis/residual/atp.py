"""AtP*: attribution patching with the QK fix and GradDrop (Kramár et al. 2024, "AtP*: An efficient and
scalable method for localizing LLM behaviour to components"), and the false negatives of an estimate.

The patching here is "denoising" (patching.py): a cell's clean activation goes into the corrupted run, and the
gradient is the corrupted run's. Written from the paper's definitions, in that direction:

- AtP (eq. 4): I(n) ~ (n_clean - n_corrupt) . dm/dn at the corrupted run.
- QK fix (section 3.1.1): a head's query or key reaches the metric only through its attention softmax, where a
  first-order step is poor (saturated softmax). So the softmax is recomputed exactly with the patched query
  (or key) and the linear step is taken only through the attention output:
      I(n) ~ sum_t (A'_t - A_t) . dm/dA_t,   dm/dA_ts = v_s . dm/dz_t
  (A: the head's probabilities, A' with the patched queries or keys; z_t = sum_s A_ts v_s the head's output).
  A cell here is a head's queries (or keys) at every position at once, so A' is the softmax with all of them
  patched (the paper's per-position nodes summed in the linear part, exact in the softmax).
- GradDrop (section 3.2, eq. 11): to catch effects that cancel, L more estimates I_l(n), each with the gradient
  through layer l's contribution to the residual stream (its attention and MLP outputs) stopped; the score is
      c(n) = 1/(L - 1) sum_l |I_l(n)|
  (for a node inside layer l the term l is 0: all of n's effect leaves through layer l's outputs). The score
  is a magnitude; the grid shows it with the sign of the QK-fixed estimate. The residual stream is no node of
  the paper's: its state s is outside every layer, so there the sum runs over all L layers and is divided by L.

Queries and keys are patched and read through an attention rule of the backend seam (`AttentionRule`: every
layer's attention function replaced by `scored_attention`, plain eager softmax attention that copies row 0's
query or key of one head into another row, and keeps queries, keys, values and the mask), so they run on every
backend that runs rules (local hooks, nnsight here and on NDIF). Under grouped KV heads, head h's key is the
shared KV head as head h reads it: patching it leaves the other heads of its group alone.

False negatives: the cells whose exact effect |m_patched - m_corrupt| is among the top 5 % of a component's
cells (at least one) and whose estimate is not among the top 5 % of the estimates.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from analysis.backends import AttentionRule, LogitMetric, Write
from analysis.residual.hooks import Trace, site, trace
from analysis.residual.patching import (
    COMPONENTS, METHODS, Component, Geometry, MethodRun, PatchMethod, Residual, attribution_forward,
)
from analysis.framework.results import Result

TOP_SHARE = 0.05


# ---------------------------------------------------------------------------------------------
# The attention rule: eager attention that patches queries or keys and records what the QK fix reads


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


def scored_attention(cells: tuple, record: bool, layer: int, query, key, value, attention_mask, scaling=None,
                     softcap=None):
    """Eager softmax attention (the seam's `AttentionRule` signature). `cells`: (row, layer, head, "q" | "k"),
    head `head`'s queries (or keys) of batch row `row` replaced by row 0's in layer `layer`. With `record`, the
    record holds the queries, keys and values per query head (B, H, T, d), the additive mask (B, 1, T, S) and
    the scaling and soft cap (B,)."""
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    mine = [(r, h, kind) for r, at, h, kind in cells if at == layer]
    if mine:
        query, key = query.clone(), key.clone()
        for r, h, kind in mine:
            if kind == "q":
                query[r, h] = query[0, h]
            else:
                key[r, h] = key[0, h]
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    mask = attention_mask[:, :, :, : key.shape[-2]] if attention_mask is not None else None
    if mask is not None:
        scores = scores + mask
    probs = torch.softmax(scores.float(), dim=-1).to(value.dtype)
    output = torch.matmul(probs, value).transpose(1, 2).contiguous()
    kept = {}
    if record:
        b, t, s = query.shape[0], query.shape[2], key.shape[2]
        full = torch.zeros(b, 1, t, s) if mask is None else mask.float().expand(b, 1, t, s)
        kept = dict(query=query.detach().float(), key=key.detach().float(), value=value.detach().float(),
                    mask=full.detach().clone(), scaling=torch.full((b,), float(scaling)),
                    softcap=torch.full((b,), float(softcap or 0.0)))
    return output, probs, kept


def probabilities(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, scaling: float, softcap: float) -> torch.Tensor:
    """softmax of one layer's attention scores, (H, T, d) x (H, S, d) -> (H, T, S), in float64."""
    scores = q @ k.transpose(-1, -2) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    return torch.softmax(scores + mask, dim=-1)


class ScoreSite(Component):
    """A head's queries or keys at every position: the sites of its attention scores (rows layers, columns heads).
    Exact patching copies them through the attention rule; attribution patching is the first-order step in them
    (through the softmax); AtP* recomputes the softmax (the QK fix)."""

    site: ClassVar[str] = "z"  # the gradient both estimates read: dm/dz of the head's output
    col_axis: ClassVar[str] = "head"
    records: ClassVar[bool] = True
    kind: ClassVar[str]

    def shape(self, g):
        return g.layers, g.heads

    def edit(self, i, j, row, g):
        return (row, i, j, self.kind)

    def attention_rule(self, cells, record):
        return AttentionRule(functools.partial(scored_attention, tuple(cells), record))

    def col_labels(self, g, tokens):
        return [f"H{h}" for h in range(g.heads)]

    def _parts(self, clean: Trace, corrupt: Trace, grads: dict, g: Geometry, i: int):
        """float64 (q, k, v) clean and corrupted (H, T, d), the mask (T, S), scaling, soft cap, dm/dz (H, T, d)."""
        c, x = clean.records[i], corrupt.records[i]
        f = lambda r, key: r[key][0].double()  # noqa: E731
        dz = grads[i][0].double().reshape(-1, g.heads, g.head_dim).transpose(0, 1)
        return ((f(c, "query"), f(c, "key")), (f(x, "query"), f(x, "key"), f(x, "value")), x["mask"][0, 0].double(),
                float(x["scaling"][0]), float(x["softcap"][0]), dz)

    def _patched(self, clean_qk, corrupt_qkv):
        q, k, _ = corrupt_qkv
        return (clean_qk[0], k) if self.kind == "q" else (q, clean_qk[1])

    def estimate(self, clean, corrupt, grads, g):
        """AtP: (n_clean - n_corrupt) . dm/dn, dm/dn through the softmax at the corrupted run (float64)."""
        rows = []
        for i in range(g.layers):
            clean_qk, (q, k, v), mask, scaling, softcap, dz = self._parts(clean, corrupt, grads, g, i)
            n = (q if self.kind == "q" else k).clone().requires_grad_(True)
            probs = probabilities(n, k, mask, scaling, softcap) if self.kind == "q" else \
                probabilities(q, n, mask, scaling, softcap)
            (grad,) = torch.autograd.grad(((probs @ v) * dz).sum(), n)
            delta = (clean_qk[0] - q) if self.kind == "q" else (clean_qk[1] - k)
            rows.append((delta * grad).sum((1, 2)))
        return torch.stack(rows).float()

    def qk_fix(self, clean, corrupt, grads, g):
        """The QK fix: sum_t (A'_t - A_t) . dm/dA_t, with dm/dA_ts = v_s . dm/dz_t (float64)."""
        rows = []
        for i in range(g.layers):
            clean_qk, (q, k, v), mask, scaling, softcap, dz = self._parts(clean, corrupt, grads, g, i)
            base = probabilities(q, k, mask, scaling, softcap)
            patched = probabilities(*self._patched(clean_qk, (q, k, v)), mask, scaling, softcap)
            rows.append(((patched - base) * (dz @ v.transpose(-1, -2))).sum((1, 2)))
        return torch.stack(rows).float()


@COMPONENTS.register
@dataclass
class Queries(ScoreSite):
    name: ClassVar[str] = "queries"
    label: ClassVar[str] = "Head queries"
    kind: ClassVar[str] = "q"


@COMPONENTS.register
@dataclass
class Keys(ScoreSite):
    name: ClassVar[str] = "keys"
    label: ClassVar[str] = "Head keys"
    kind: ClassVar[str] = "k"


# ---------------------------------------------------------------------------------------------
# The method


def first_order(c: Component, clean: Trace, corrupt: Trace, grads: dict, g: Geometry) -> torch.Tensor:
    """AtP with the QK fix: the QK-fixed estimate at query/key sites, plain AtP elsewhere (signed)."""
    return c.qk_fix(clean, corrupt, grads, g) if isinstance(c, ScoreSite) else c.estimate(clean, corrupt, grads, g)


def grad_drop_grads(handle, problem, components: list[Component], corrupt: Trace, g: Geometry, batch: int) -> list[dict]:
    """Per layer l, {site: {layer: dm/da}} at the corrupted run with the gradient through layer l's attention and
    MLP outputs stopped: row l of a batch of the corrupted prompt has both outputs rewritten with their own
    (constant) values, which leaves the forward as it was and the gradient none through them."""
    sites = tuple(sorted({c.site for c in components}))
    out: list[dict] = []
    for start in range(0, g.layers, max(1, batch)):
        dropped = list(range(start, min(g.layers, start + max(1, batch))))
        writes = tuple(Write(site(name, l), value=corrupt.acts[name][l][0], rows=(r,))
                       for r, l in enumerate(dropped) for name in ("attn", "mlp"))
        metric = LogitMetric(position=-1, plus=(problem.target,), minus=(problem.foil,))
        got = trace(handle, problem.corrupt.expand(len(dropped), -1), want=(), writes=writes, keep=1, grads=sites,
                    metric=metric, layers=g.layers)
        for r in range(len(dropped)):
            out.append({s: {i: gr[r:r + 1] for i, gr in got.grads[s].items()} for s in sites})
    return out


def grad_drop(c: Component, estimates: list[torch.Tensor], signed: torch.Tensor, g: Geometry) -> torch.Tensor:
    """Eq. 11: 1/(L - 1) sum over l != the node's layer of |I_l| (the residual stream: 1/L over every l), with
    the sign of the un-dropped estimate `signed`."""
    if g.layers < 2:
        return signed
    total = torch.zeros_like(signed)
    inside = not isinstance(c, Residual)
    for l, est in enumerate(estimates):
        term = est.abs()
        if inside:
            term = term.clone()
            term[l] = 0.0  # dropping the node's own layer removes all of its effect
        total += term
    score = total / (g.layers - 1 if inside else g.layers)
    return torch.where(signed < 0, -score, score)


@METHODS.register
@dataclass
class AtPStar(PatchMethod):
    """AtP* (Kramár et al. 2024): the attribution forward (both prompts, one backward) with the attention rule's
    record for the QK fix, then one forward and backward of L rows of the corrupted prompt for GradDrop."""

    name: ClassVar[str] = "atp*"
    label: ClassVar[str] = "AtP* (QK fix + GradDrop)"
    batch: int = 32

    def run(self, handle, problem, components, g, progress):
        clean, corrupt, grads, m_clean, m_corrupt = attribution_forward(handle, problem, components, g,
                                                                        want=("attn", "mlp"))
        signed = [first_order(c, clean, corrupt, grads[c.site], g) for c in components]
        if progress:
            progress(0.3, "AtP*: GradDrop")
        dropped = grad_drop_grads(handle, problem, components, corrupt, g, self.batch)
        values = []
        for c, s in zip(components, signed):
            per_layer = [first_order(c, clean, corrupt, d[c.site], g) for d in dropped]
            values.append(m_corrupt + grad_drop(c, per_layer, s, g))
        if progress:
            progress(1.0, "AtP*: done")
        return MethodRun(values, m_clean, m_corrupt)


# ---------------------------------------------------------------------------------------------
# False negatives


def top_cells(values: list[float], share: float = TOP_SHARE) -> list[int]:
    """The indices of the ceil(share * n) largest |values| (at least one; ties: the lower index first)."""
    k = max(1, math.ceil(share * len(values)))
    return sorted(sorted(range(len(values)), key=lambda i: (-abs(values[i]), i))[:k])


@dataclass
class FalseNegatives(Result):
    """One component, one estimate: the cells in the exact top share that the estimate's top share misses."""

    component: str
    method: str
    cells: int  # cells of the component
    top: int  # cells in each top share
    missed: list[str] = field(default_factory=list)  # labels ("L3 H2") of the false negatives
    effects: list[float] = field(default_factory=list)  # their exact shares, in the same order
    cut: float = 0.0  # the smallest |exact share| in the exact top share (how near the edge a miss is)

    @property
    def count(self) -> int:
        return len(self.missed)


def false_negatives(component: str, method: str, exact: list[list[float]], estimate: list[list[float]],
                    rows: list[str], cols: list[str], share: float = TOP_SHARE) -> FalseNegatives:
    """The false negatives of `estimate` against `exact` (two grids of shares, the same shape)."""
    flat_exact = [v for row in exact for v in row]
    flat_est = [v for row in estimate for v in row]
    truth, found = top_cells(flat_exact, share), set(top_cells(flat_est, share))
    width = len(cols)
    label = lambda k: rows[k // width] if width == 1 else f"{rows[k // width]} {cols[k % width]}"  # noqa: E731
    missed = [k for k in truth if k not in found]
    return FalseNegatives(component, method, len(flat_exact), len(truth), [label(k) for k in missed],
                          [flat_exact[k] for k in missed], min(abs(flat_exact[k]) for k in truth))

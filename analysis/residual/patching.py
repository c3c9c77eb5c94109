"""Activation patching: which activations of a clean run restore its answer in a corrupted run.

The metric is the logit difference m = logit(target) - logit(foil) at the last position, reported as
the share of the clean - corrupted difference a patch recovers:
    share = (m_patched - m_corrupt) / (m_clean - m_corrupt)
(1: the patch alone restores the clean answer; 0: it changes nothing). The corrupted run is patched
with the clean run's activations ("denoising", as in Meng et al. 2022's causal tracing).

Components (`COMPONENTS`, one class each): the residual stream at one (layer, position); one head's
output at every position; a layer's attention output; a layer's MLP output. Methods (`METHODS`):
- exact: one patched forward per cell, run in batches (row b of a batch carries cell b's patch);
- attribution (Nanda 2023, "Attribution patching"; Syed et al. 2023): the first-order estimate
  (a_clean - a_corrupt) . dm/da at the corrupted run, for every cell from two forwards (clean and
  corrupted, as two rows of one batch) and one backward;
- atp* (atp.py, Kramár et al. 2024): attribution with the QK fix and GradDrop. atp.py also adds a head's
  queries and keys (its attention-score sites) as components.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from analysis.framework.errors import AnatomyError
from analysis.framework.progress import Progress
from analysis.model_access.models import ModelHandle
from analysis.framework.registry import Method, Registry
from analysis.backends import AttentionRule, LogitMetric, Write
from analysis.residual.hooks import Trace, copy, trace



@dataclass(frozen=True)
class Geometry:
    layers: int
    positions: int
    heads: int
    head_dim: int


class Component(Method):
    """One kind of patched activation: its cells (a grid of rows x columns), how to patch one, and the
    first-order estimate of every cell."""

    site: ClassVar[str]
    row_axis: ClassVar[str] = "layer"
    col_axis: ClassVar[str] = ""
    records: ClassVar[bool] = False  # its estimate reads the attention rule's record (queries, keys: atp.py)

    def shape(self, g: Geometry) -> tuple[int, int]:
        raise NotImplementedError

    def edit(self, i: int, j: int, row: int, g: Geometry) -> Write | tuple:
        """Cell (i, j) patched into batch row `row` from the clean prompt in row 0 of the same forward: a seam
        write, or a cell of this component's attention rule (`attention_rule`)."""
        raise NotImplementedError

    def attention_rule(self, cells: tuple, record: bool) -> AttentionRule | None:
        """The attention function that applies `cells` (edits that are not writes) and, with `record`, keeps
        what `estimate` reads; None: this component needs none."""
        return None

    def estimate(self, clean: Trace, corrupt: Trace, grads: dict[int, torch.Tensor], g: Geometry) -> torch.Tensor:
        raise NotImplementedError

    def col_labels(self, g: Geometry, tokens: list[str]) -> list[str]:
        return ["all positions"]


COMPONENTS: Registry[Component] = Registry("patched component")


def _delta(clean: Trace, corrupt: Trace, grads: dict[int, torch.Tensor], site: str, layer: int) -> torch.Tensor:
    """(a_clean - a_corrupt) * dm/da at one layer's site, elementwise (T, width), batch row 0."""
    a = clean.acts[site][layer][0].float()
    b = corrupt.acts[site][layer][0].detach().float()
    return (a - b) * grads[layer][0].float()


@COMPONENTS.register
@dataclass
class Residual(Component):
    name: ClassVar[str] = "residual"
    label: ClassVar[str] = "Residual stream"
    site: ClassVar[str] = "resid"
    col_axis: ClassVar[str] = "position"

    def shape(self, g: Geometry) -> tuple[int, int]:
        return g.layers, g.positions  # states 0..L-1: the input of each layer

    def edit(self, i, j, row, g):
        return copy("resid", i, row, position=j)

    def estimate(self, clean, corrupt, grads, g):
        return torch.stack([_delta(clean, corrupt, grads, "resid", i).sum(-1) for i in range(g.layers)])

    def col_labels(self, g, tokens):
        return [f"{j}: {t}" for j, t in enumerate(tokens)]


@COMPONENTS.register
@dataclass
class Heads(Component):
    name: ClassVar[str] = "heads"
    label: ClassVar[str] = "Attention heads"
    site: ClassVar[str] = "z"
    col_axis: ClassVar[str] = "head"

    def shape(self, g):
        return g.layers, g.heads

    def edit(self, i, j, row, g):
        return copy("z", i, row, head=j)

    def estimate(self, clean, corrupt, grads, g):
        rows = []
        for i in range(g.layers):
            d = _delta(clean, corrupt, grads, "z", i)
            rows.append(d.reshape(d.shape[0], g.heads, g.head_dim).sum((0, 2)))
        return torch.stack(rows)

    def col_labels(self, g, tokens):
        return [f"H{h}" for h in range(g.heads)]


class _Block(Component):
    col_axis: ClassVar[str] = ""

    def shape(self, g):
        return g.layers, 1

    def edit(self, i, j, row, g):
        return copy(self.site, i, row)

    def estimate(self, clean, corrupt, grads, g):
        return torch.stack([_delta(clean, corrupt, grads, self.site, i).sum() for i in range(g.layers)])[:, None]


@COMPONENTS.register
@dataclass
class AttentionOut(_Block):
    name: ClassVar[str] = "attention"
    label: ClassVar[str] = "Attention output"
    site: ClassVar[str] = "attn"


@COMPONENTS.register
@dataclass
class MlpOut(_Block):
    name: ClassVar[str] = "mlp"
    label: ClassVar[str] = "MLP output"
    site: ClassVar[str] = "mlp"


# ---------------------------------------------------------------------------------------------
# The metric and the two methods


@dataclass(frozen=True)
class Problem:
    """One patching problem: the two prompts (as ids of one length) and the scored tokens."""

    clean: torch.Tensor  # (1, T)
    corrupt: torch.Tensor  # (1, T)
    target: int
    foil: int

    def metric(self, logits: torch.Tensor) -> torch.Tensor:
        """logit(target) - logit(foil) at the last position, per batch row."""
        last = logits[:, -1].float()
        return last[:, self.target] - last[:, self.foil]


@dataclass
class MethodRun:
    values: list[torch.Tensor]  # per component: the (estimated) metric after patching each cell, (rows, cols)
    clean: float  # the metric of the clean and of the corrupted run, as this method measured them
    corrupt: float


class PatchMethod(Method):
    def run(self, handle: ModelHandle, problem: Problem, components: list[Component], g: Geometry,
            progress: Progress | None) -> MethodRun:
        raise NotImplementedError


METHODS: Registry[PatchMethod] = Registry("patching method")


@METHODS.register
@dataclass
class Exact(PatchMethod):
    """Every cell is one row of a batch of the corrupted prompt; row 0 of each batch is the clean prompt, whose
    activation the patch copies within the same forward (no separate clean run), and the first batch also
    carries the corrupted prompt unpatched."""

    name: ClassVar[str] = "exact"
    label: ClassVar[str] = "Exact activation patching"
    batch: int = 32

    def run(self, handle, problem, components, g, progress):
        cells = [(c, k, i, j) for k, c in enumerate(components)
                 for i in range(c.shape(g)[0]) for j in range(c.shape(g)[1])]
        out = [torch.zeros(c.shape(g)) for c in components]
        m_clean = m_corrupt = None
        start = 0
        while start < len(cells):
            lead = 1 if m_corrupt is None else 0  # the unpatched corrupted row, first batch only
            chunk = cells[start:start + max(1, self.batch - 1 - lead)]
            edits = [c.edit(i, j, 1 + lead + r, g) for r, (c, _, i, j) in enumerate(chunk)]
            writes = tuple(e for e in edits if isinstance(e, Write))
            ruled = tuple(e for e in edits if not isinstance(e, Write))
            rule = next((c.attention_rule(ruled, False) for c, *_ in chunk if c.records), None)
            ids = torch.cat([problem.clean, problem.corrupt.expand(len(chunk) + lead, -1)])
            got = trace(handle, ids, want=(), writes=writes, keep=1, rule=rule)
            if rule is not None:
                ruled_everywhere(got, g)
            values = problem.metric(got.logits)
            m_clean = float(values[0]) if m_clean is None else m_clean
            m_corrupt = float(values[1]) if m_corrupt is None else m_corrupt
            for r, (_, k, i, j) in enumerate(chunk):
                out[k][i, j] = values[1 + lead + r]
            start += len(chunk)
            if progress:
                progress(start / len(cells), f"exact patching: {start} of {len(cells)} cells")
        return MethodRun(out, m_clean, m_corrupt)


@METHODS.register
@dataclass
class Attribution(PatchMethod):
    """The clean and the corrupted prompt as two rows of one forward that keeps its graph (rows never mix in a
    transformer, so row 0 is the clean run and row 1 the corrupted one), then one backward of the corrupted
    row's metric to every recorded site."""

    name: ClassVar[str] = "attribution"
    label: ClassVar[str] = "Attribution patching"

    def run(self, handle, problem, components, g, progress):
        clean, corrupt, grads, m_clean, m_corrupt = attribution_forward(handle, problem, components, g)
        if progress:
            progress(1.0, "attribution patching: done")
        return MethodRun([m_corrupt + c.estimate(clean, corrupt, grads[c.site], g) for c in components],
                         m_clean, m_corrupt)


def attribution_forward(handle: ModelHandle, problem: Problem, components: list[Component], g: Geometry,
                        want: tuple[str, ...] = ()) -> tuple[Trace, Trace, dict, float, float]:
    """(clean, corrupted, grads {site: {layer: dm/da (1, T, ...)}}, m_clean, m_corrupt) from one forward of both
    prompts (rows 0 and 1) and one backward of the corrupted row's metric; `want`: more sites read."""
    sites = tuple(sorted({c.site for c in components}))
    metric = LogitMetric(position=-1, plus=(problem.target,), minus=(problem.foil,), rows=(1,))
    rule = next((c.attention_rule((), True) for c in components if c.records), None)
    both = trace(handle, torch.cat([problem.clean, problem.corrupt]), want=tuple(sorted({*sites, *want})), keep=1,
                 grads=sites, metric=metric, layers=g.layers, rule=rule)
    metrics = problem.metric(both.logits)
    clean, corrupt = Trace(), Trace()
    grads: dict[str, dict[int, torch.Tensor]] = {s: {} for s in sites}
    for s in both.acts:
        for i, act in both.acts[s].items():
            clean.acts[s][i], corrupt.acts[s][i] = act[0:1], act[1:2]
    for s in sites:
        grads[s] = {i: gr[1:2] for i, gr in both.grads[s].items()}
    for i, record in both.records.items():
        clean.records[i] = {k: v[0:1] for k, v in record.items()}
        corrupt.records[i] = {k: v[1:2] for k, v in record.items()}
    if rule is not None:
        ruled_everywhere(both, g)
    m_clean, m_corrupt = (float(v) for v in metrics.detach())
    return clean, corrupt, grads, m_clean, m_corrupt


def ruled_everywhere(got: Trace, g: Geometry) -> None:
    """An attention rule that did not run in every layer patched or recorded nothing there: say so, never show
    the unpatched run as a patch's effect."""
    if len(got.records) < g.layers:
        raise AnatomyError("This model's attention does not run through transformers' attention interface in every "
                           "layer, so a head's queries and keys cannot be patched here (heads, attention and MLP "
                           "outputs and the residual stream can).")

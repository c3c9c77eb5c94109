"""Every capture and patch of the residual-stream panel, in one place (a backend seam can route it).

One forward of a language model through `trace(...)` records any of four sites per layer and may
overwrite any of them, row by row of the batch:

- `resid`  the residual stream: state 0 is the input of layer 0 (the embeddings as the model scales
           them, positions included), state l the output of layer l - 1, up to state L;
- `z`      the heads' outputs side by side, (B, T, heads * head_dim): the attention output
           projection's input; head h is the slice [h * d, (h + 1) * d);
- `attn`   what a layer's attention adds to the residual stream;
- `mlp`    what a layer's MLP adds.

Hooks are set through `handle.patch()` (held under the model's lock, removed on exit, even on error).
With `grad=True` the forward keeps its graph: the captured tensors are the graph's own, so
`torch.autograd.grad(metric, captured)` gives the metric's gradient at every site in one backward.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from analysis import anatomy
from analysis.models import ModelHandle
from analysis.residual.sites import LayerParts, layer_parts

SITES = ("resid", "z", "attn", "mlp")


@dataclass(frozen=True)
class Edit:
    """Overwrite one row's activation at a site: at `position` (None: every position), in the last-axis
    `span` (None: all of it; a head is a span of `z`), with `value` (broadcast to what it replaces) or, when
    `value` is None, with row `source`'s activation at the same place in the same forward (a clean prompt
    riding in the batch)."""

    site: str
    layer: int
    row: int
    value: torch.Tensor | None = None
    position: int | None = None
    span: tuple[int, int] | None = None
    source: int = 0


@dataclass
class Trace:
    """What one forward recorded: site -> {layer: tensor (B, T, ...)}, and the logits it returned."""

    acts: dict[str, dict[int, torch.Tensor]] = field(default_factory=lambda: {s: {} for s in SITES})
    logits: torch.Tensor | None = None

    def stack(self, site: str) -> torch.Tensor:
        """The site's tensors of every layer, stacked on a new first axis (layer order)."""
        found = self.acts[site]
        return torch.stack([found[k] for k in sorted(found)])


def _first(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _replace_first(output: Any, tensor: torch.Tensor) -> Any:
    return (tensor, *output[1:]) if isinstance(output, tuple) else tensor


def _edited(tensor: torch.Tensor, edits: list[Edit]) -> torch.Tensor:
    """A copy of `tensor` with the edits applied; edits copying from a row of the same forward are applied in
    one indexed copy per (span, source, whole positions or not)."""
    out = tensor.clone()
    groups: dict[tuple, list[Edit]] = {}
    for e in edits:
        if e.value is not None:
            lo, hi = e.span if e.span is not None else (0, out.shape[-1])
            where = slice(None) if e.position is None else e.position
            out[e.row, where, lo:hi] = e.value.to(out.dtype)
        else:
            groups.setdefault((e.span, e.source, e.position is None), []).append(e)
    for (span, source, whole), group in groups.items():
        lo, hi = span if span is not None else (0, out.shape[-1])
        rows = torch.tensor([e.row for e in group], device=out.device)
        if whole:
            out[rows, :, lo:hi] = tensor[source, :, lo:hi]
        else:
            positions = torch.tensor([e.position for e in group], device=out.device)
            out[rows, positions, lo:hi] = tensor[source, positions, lo:hi]
    return out


class _Hooks:
    """The hook functions of one forward: record what is wanted, apply the edits of each (site, layer)."""

    def __init__(self, want: set[str], edits: list[Edit], grad: bool, trace: Trace) -> None:
        self.want, self.grad, self.trace = want, grad, trace
        self.batch: tuple[int, int] | None = None  # (B, T) of the forward
        self.edits: dict[tuple[str, int], list[Edit]] = {}
        for e in edits:
            self.edits.setdefault((e.site, e.layer), []).append(e)

    def _touch(self, site: str, layer: int, tensor: torch.Tensor) -> torch.Tensor | None:
        """The replacement for this activation (None: keep it), recording what is wanted. OPT's MLP works on
        (B * T, D) rows: seen here as (B, T, D), handed back as it came."""
        flat = tensor.shape if tensor.dim() == 2 and self.batch is not None else None
        if flat is not None:
            tensor = tensor.view(*self.batch, -1)
        edits = self.edits.get((site, layer))
        new = _edited(tensor, edits) if edits else None
        if site in self.want:
            kept = new if new is not None else tensor
            self.trace.acts[site][layer] = kept if self.grad else kept.detach()
        return new.view(flat) if new is not None and flat is not None else new

    def state0(self, module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        if self.grad and not hidden.requires_grad:  # frozen embeddings: start the graph here
            hidden = hidden.detach().requires_grad_(True)
            new = self._touch("resid", 0, hidden)
            new = hidden if new is None else new
        else:
            new = self._touch("resid", 0, hidden)
        if new is None:
            return None
        return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})

    def post(self, site: str, layer: int):
        def hook(module, args, output):
            new = self._touch(site, layer, _first(output))
            return None if new is None else _replace_first(output, new)
        return hook

    def z(self, layer: int):
        def hook(module, args):
            new = self._touch("z", layer, args[0])
            return None if new is None else (new, *args[1:])
        return hook


def _attach(patch, parts: list[LayerParts], hooks: _Hooks, sites: set[str]) -> None:
    if "resid" in sites:
        patch.hook(parts[0].block, hooks.state0, pre=True, with_kwargs=True)
        for i, p in enumerate(parts):
            patch.hook(p.block, hooks.post("resid", i + 1))
    for i, p in enumerate(parts):
        if "z" in sites:
            patch.hook(p.out_proj, hooks.z(i), pre=True)
        if "attn" in sites:
            patch.hook(p.attn_add, hooks.post("attn", i))
        if "mlp" in sites:
            patch.hook(p.mlp_add, hooks.post("mlp", i))


def trace(handle: ModelHandle, input_ids: torch.Tensor, *, want: tuple[str, ...] = ("resid",),
          edits: list[Edit] = (), keep: int = 0, grad: bool = False,
          model: torch.nn.Module | None = None) -> Trace:
    """One forward of `model` (default: the handle's language model) on `input_ids` (B, T), recording the
    sites in `want` and applying `edits`; with `keep` > 0 only the last `keep` positions' logits."""
    model = handle.language_model if model is None else model
    parts = layer_parts(model)
    out = Trace()
    hooks = _Hooks(set(want), list(edits), grad, out)
    hooks.batch = tuple(input_ids.shape)
    sites = set(want) | {e.site for e in edits}
    extra = {"logits_to_keep": keep} if keep else {}
    grad_mode = torch.enable_grad() if grad else torch.no_grad()
    with handle.patch() as patch, grad_mode, anatomy.model_step(handle, "running the residual-stream trace"):
        _attach(patch, parts, hooks, sites)
        result = model(input_ids=input_ids.to(handle.device), use_cache=False, **extra)
    out.logits = result.logits if grad else result.logits.detach()
    return out

"""Every capture and patch of the residual-stream panel, in one place, asked of the backend seam
(`analysis.backends`): one forward of the language model is one `Request`, run by hooks here, by an
nnsight trace here or on NDIF, as the deployment configures; this module does not know which.

The panel names four sites per layer (each a seam `Site`, `site(name, layer)`):

- `resid`  the residual stream: state 0 is the input of layer 0 (the embeddings as the model scales
           them, positions included: `block_in[0]`), state l the output of layer l - 1 (`block_out`),
           up to state L;
- `z`      the heads' outputs side by side, (B, T, heads * head_dim): the attention output
           projection's input (`heads`); head h is the slice [h * d, (h + 1) * d);
- `attn`   what a layer's attention adds to the residual stream (`attn_out`);
- `mlp`    what a layer's MLP adds (`mlp_out`).

Patches are seam `Write`s, row by row of the batch: a cell of activation patching copies the clean
prompt's value (batch row 0) into its own row of the same forward. Gradients of the logit difference
come back per site from the same forward (`grads`), for attribution patching.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from analysis.model_access import anatomy
from analysis import backends
from analysis.backends import AttentionRule, LogitMetric, Request, Site, Write
from analysis.model_access.models import ModelHandle

SITES = ("resid", "z", "attn", "mlp")
_SEAM = {"z": "heads", "attn": "attn_out", "mlp": "mlp_out"}


def site(name: str, layer: int) -> Site:
    """The seam's site of the panel's `name` at `layer` (resid: state `layer`)."""
    if name == "resid":
        return Site("block_in", 0) if layer == 0 else Site("block_out", layer - 1)
    return Site(_SEAM[name], layer)


def layers_of(name: str, n: int) -> range:
    """The layers a site has in a model of n decoder layers (resid: states 0..n)."""
    return range(n + 1) if name == "resid" else range(n)


def copy(name: str, layer: int, row: int, *, position: int | None = None, head: int | None = None) -> Write:
    """Patch batch row `row` at the site with the clean prompt's value (batch row 0 of the same forward):
    at one `position` (None: every position), in one `head`'s slice of `z` (None: all of it)."""
    return Write(site(name, layer), rows=(row,), positions=() if position is None else (position,), head=head,
                 source=0)


@dataclass
class Trace:
    """What one forward recorded: site -> {layer: tensor (B, T, ...)}, the gradients asked for (same keys),
    the logits it returned and an attention rule's record per layer (`rule=`; tensors (B, ...))."""

    acts: dict[str, dict[int, torch.Tensor]] = field(default_factory=lambda: {s: {} for s in SITES})
    grads: dict[str, dict[int, torch.Tensor]] = field(default_factory=lambda: {s: {} for s in SITES})
    logits: torch.Tensor | None = None
    records: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)

    def stack(self, site: str) -> torch.Tensor:
        """The site's tensors of every layer, stacked on a new first axis (layer order)."""
        found = self.acts[site]
        return torch.stack([found[k] for k in sorted(found)])


def request(handle: ModelHandle, input_ids: torch.Tensor, *, want: tuple[str, ...] = ("resid",),
            writes: tuple[Write, ...] = (), keep: int = 0, grads: tuple[str, ...] = (),
            metric: LogitMetric | None = None, layers: int | None = None, rule: AttentionRule | None = None) -> Request:
    """The seam request of one forward of the handle's language model on `input_ids` (B, T): the sites in
    `want` recorded, `writes` applied, the logits kept (`keep` > 0: only the last `keep` positions), and with
    `grads`, the gradient of `metric` at those sites; every site at every layer, or at its first `layers` only;
    `rule` replaces every layer's attention function (AtP*'s query/key patches and records, `atp.py`)."""
    n = anatomy.n_layers(handle.language_model)

    def sites(names: tuple[str, ...]) -> tuple[Site, ...]:
        return tuple(site(s, i) for s in names for i in layers_of(s, n) if layers is None or i < layers)

    return Request(inputs={"input_ids": input_ids, "use_cache": False}, reads=sites(want), writes=tuple(writes),
                   logits=keep, grads=sites(grads), metric=metric, rule=rule, root="language_model")


def trace(handle: ModelHandle, input_ids: torch.Tensor, **asked) -> Trace:
    """`request(handle, input_ids, **asked)` run by the configured backend, as a `Trace` on the model's device
    (where the panel reads the captures with the model's own modules)."""
    n = anatomy.n_layers(handle.language_model)
    got = backends.run(handle, request(handle, input_ids, **asked))
    out = Trace(logits=got.logits, records=got.records)
    for found, into in ((got.reads, out.acts), (got.grads, out.grads)):
        for name in SITES:
            for i in layers_of(name, n):
                value = found.get(site(name, i))
                if value is not None:
                    into[name][i] = (value.flatten(2) if name == "z" else value).to(handle.device)
    return out

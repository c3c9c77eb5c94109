"""What a panel asks of one forward pass, and what comes back: `Request` and `Captured`.

A request names *sites* (where in the model a value lives), what to read there, what to write there,
which gradients to take, and whether the logits are needed. It holds plain values only (ints, tuples,
tensors), so the same request can be run by hooks in this process or shipped to NDIF by nnsight.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import torch

# Where a value lives in decoder layer `layer` (see `Site`). In execution order within a layer.
SiteKind = Literal["block_in", "heads", "attn_out", "attn_weights", "mlp_out", "block_out", "final_norm"]
PHASE = {"block_in": 0, "heads": 2, "attn_out": 3, "attn_weights": 3, "mlp_out": 4, "block_out": 5}
RULE_PHASE = 1  # an attention rule runs inside the attention module, before its output projection


@dataclass(frozen=True)
class Site:
    """A place in the model's forward.

    - `block_in`  (B, T, D): the residual stream entering decoder layer `layer` (layer 0: the embeddings);
    - `block_out` (B, T, D): the residual stream leaving decoder layer `layer`;
    - `attn_out`  (B, T, D): what attention adds to the residual stream (the attention module's output;
                  Gemma 2/3: its post-attention norm's);
    - `heads`     (B, T, H, d): each head's output before the output projection (the o_proj input);
    - `attn_weights` (B, H, T, T): the attention probabilities (eager attention only);
    - `mlp_out`   (B, T, D): what the MLP adds (the MLP's output; Gemma 2/3: its post-MLP norm's; OPT: fc2's);
    - `final_norm` (B, T, D): the final norm's output (what the unembedding reads); `layer` is ignored.
    """

    kind: SiteKind
    layer: int = 0

    @property
    def order(self) -> tuple[int, int]:
        """Execution order: sites must be visited in it (nnsight raises OutOfOrderError otherwise)."""
        if self.kind == "final_norm":
            return (10**9, 0)
        return (self.layer, PHASE[self.kind])

    def __str__(self) -> str:
        return self.kind if self.kind == "final_norm" else f"{self.kind}[{self.layer}]"


@dataclass(frozen=True)
class Write:
    """Replace the value at `site` in the batch `rows` (all when empty), at the token `positions` (all
    when empty) and, for `heads`, in one `head`'s slice, before the rest of the model sees it.

    The new value is `value`, broadcast to the selected (rows, positions, width) block: (D,),
    (len(positions), D) or (B, len(positions), D) for residual sites ((d,) or (..., d) for one head); or,
    with `source` instead of `value`, batch row `source`'s own value at the same positions and head in the
    same forward (a clean prompt riding in the batch: activation patching in one forward per batch). A
    copy reads the value as it arrived at the site; writes apply in the order given."""

    site: Site
    value: torch.Tensor | None = None
    positions: tuple[int, ...] = ()
    head: int | None = None
    rows: tuple[int, ...] = ()
    source: int | None = None

    def __post_init__(self) -> None:
        if (self.value is None) == (self.source is None):
            raise ValueError("A write takes either a value or a source row, not both or neither.")


@dataclass(frozen=True)
class LogitMetric:
    """A scalar of the logits for attribution: sum over the batch `rows` (all when empty) of
    sum(logits[row, position, plus]) - sum(logits[row, position, minus]). `position` indexes the logits
    the request keeps (with `logits=1`, -1 is the last token)."""

    position: int = -1
    plus: tuple[int, ...] = ()
    minus: tuple[int, ...] = ()
    rows: tuple[int, ...] = ()

    def plain(self) -> tuple:
        """(rows or None, position, plus, minus): what a trace body reads (no class of ours travels)."""
        return (list(self.rows) or None, self.position, list(self.plus), list(self.minus))


@dataclass(frozen=True)
class AttentionRule:
    """Every attention layer's attention function replaced by `fn`.

    `fn(layer, query, key, value, mask, scaling, softcap) -> (output, probs, record)` receives the
    post-RoPE query (B, H, T, d), key and value (B, H_kv, S, d), the additive mask (or None), and returns
    the attention output (B, T, H, d), the probabilities used and a dict of small tensors to keep per
    layer. It must be a module-level function (or a `functools.partial` of one) that uses torch only,
    so nnsight can ship it to NDIF by value."""

    fn: Callable[..., tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class Request:
    """One forward of the model with `inputs` (the model's keyword arguments).

    `root` picks the module that runs: "model" (the handle's model; a VLM with its images) or
    "language_model" (its text-only causal LM). `logits`: None (not needed: the forward stops after
    the last site), 0 (every position) or k > 0 (the last k positions). `grads` are taken of `metric`
    with respect to those sites (a forward with gradients: nothing stops early)."""

    inputs: dict[str, Any]
    reads: tuple[Site, ...] = ()
    writes: tuple[Write, ...] = ()
    logits: int | None = None
    grads: tuple[Site, ...] = ()
    metric: LogitMetric | None = None
    rule: AttentionRule | None = None
    root: Literal["model", "language_model"] = "model"

    def __post_init__(self) -> None:
        if self.grads and self.metric is None:
            raise ValueError("Gradients need a metric (LogitMetric) to differentiate.")
        if self.grads and self.logits is None:
            object.__setattr__(self, "logits", 0)
        bad = [s for s in self.grads if s.kind == "attn_weights"]
        if bad:
            raise ValueError(f"Gradients are taken at residual, head, attention, MLP or final-norm sites, not {bad[0]}.")

    @property
    def stops_early(self) -> bool:
        return self.logits is None and not self.grads


@dataclass
class Captured:
    """What one request returned, every tensor on the CPU."""

    reads: dict[Site, torch.Tensor] = field(default_factory=dict)
    grads: dict[Site, torch.Tensor] = field(default_factory=dict)
    logits: torch.Tensor | None = None
    records: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # attention rule, per layer
    backend: str = ""

    def __getitem__(self, site: Site) -> torch.Tensor:
        return self.reads[site]

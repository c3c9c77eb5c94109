"""A request turned into steps: which module, its input or its output, in execution order.

Both backends walk the same plan, so they visit the same modules in the same order: the native one
hooks them, the nnsight one touches their envoys in that order (nnsight needs execution order).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from analysis import anatomy
from analysis.backends.request import RULE_PHASE, Request, Site, Write
from analysis.errors import AnatomyError

INPUT, OUTPUT = "input", "output"
WRITABLE = ("block_in", "block_out", "attn_out", "mlp_out", "heads", "final_norm")


@dataclass
class Step:
    """One module's input or output: the sites read and written there.

    `index` per site: which element of a tuple output holds it (attention: 0 output, 1 weights)."""

    order: tuple[int, int]
    module: torch.nn.Module
    where: str  # INPUT or OUTPUT
    reads: list[Site] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    grads: list[Site] = field(default_factory=list)
    rule_layer: int | None = None  # an attention-rule step (the attention call inside this layer)

    def index(self, site: Site) -> int:
        return 1 if site.kind == "attn_weights" else 0


def root_module(handle, request: Request) -> torch.nn.Module:
    return handle.language_model if request.root == "language_model" else handle.model


def locate(root: torch.nn.Module, site: Site) -> tuple[torch.nn.Module, str]:
    """The module whose input or output holds `site`."""
    kind = site.kind
    if kind == "final_norm":
        norm = anatomy.final_norm(root)
        if norm is None:
            raise AnatomyError("This model has no final norm to read.")
        return norm, OUTPUT
    layer = anatomy.check_layer(root, site.layer)
    if kind in ("block_in", "block_out"):
        return anatomy.decoder_layers(root)[layer], INPUT if kind == "block_in" else OUTPUT
    if kind in ("attn_out", "attn_weights"):
        return anatomy.attention_modules(root)[layer], OUTPUT
    if kind == "heads":
        return anatomy.output_projection(root, layer), INPUT
    if kind == "mlp_out":
        return anatomy.mlp_module(root, layer), OUTPUT
    raise AnatomyError(f"Unknown site '{kind}'.")


def plan(root: torch.nn.Module, request: Request) -> list[Step]:
    """The steps of `request` on `root`, sorted in execution order (one step per module and side)."""
    steps: dict[tuple[int, str], Step] = {}

    def step_for(site: Site) -> Step:
        module, where = locate(root, site)
        key = (id(module), where)
        if key not in steps:
            steps[key] = Step(site.order, module, where)
        return steps[key]

    for site in request.reads:
        step_for(site).reads.append(site)
    for write in request.writes:
        if write.site.kind not in WRITABLE:
            raise AnatomyError(f"Cannot write to {write.site}: writable sites are {', '.join(WRITABLE)}.")
        step_for(write.site).writes.append(write)
    for site in request.grads:
        step_for(site).grads.append(site)
    out = list(steps.values())
    if request.rule is not None:
        for layer, attn in anatomy.attention_modules(root).items():
            out.append(Step((layer, RULE_PHASE), attn, INPUT, rule_layer=layer))
    return sorted(out, key=lambda s: s.order)


def model_inputs(request: Request, device) -> dict:
    """The request's inputs on `device`, with `logits_to_keep` when only the last k logits are wanted."""
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in request.inputs.items()}
    if request.logits:
        kwargs["logits_to_keep"] = request.logits
    return kwargs


def head_dim(root: torch.nn.Module) -> int:
    return anatomy.head_layout(root).head_dim


def write_into(tensor: torch.Tensor, write: Write, dh: int) -> None:
    """Apply `write` to `tensor` (B, T, D) in place (the nnsight body inlines the same three lines)."""
    rows = list(write.positions) if write.positions else slice(None)
    cols = slice(None) if write.head is None else slice(write.head * dh, (write.head + 1) * dh)
    tensor[:, rows, cols] = write.value.to(tensor.device, tensor.dtype)


def finish(captured, root: torch.nn.Module) -> None:
    """Shape what came back the same way for both backends: `heads` as (B, T, H, d)."""
    for site, value in list(captured.reads.items()):
        if site.kind == "heads":
            b, t, _ = value.shape
            captured.reads[site] = value.reshape(b, t, -1, head_dim(root))

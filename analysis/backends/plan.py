"""A request turned into steps: which module, its input or its output, in execution order.

Both backends walk the same plan, so they visit the same modules in the same order: the native one
hooks them, the nnsight one touches their envoys in that order (nnsight needs execution order).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from analysis.model_access import anatomy
from analysis.backends.request import RULE_PHASE, Request, Site, Write
from analysis.framework.errors import AnatomyError

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


_LOCATED: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def locate(root: torch.nn.Module, site: Site) -> tuple[torch.nn.Module, str]:
    """The module whose input or output holds `site` (remembered per model: a model's modules do not move,
    and finding them walks its layers, which costs more than a small model's forward when a request
    patches 31 cells)."""
    found = _LOCATED.setdefault(root, {})
    if site not in found:
        found[site] = _locate(root, site)
    return found[site]


def _locate(root: torch.nn.Module, site: Site) -> tuple[torch.nn.Module, str]:
    kind = site.kind
    if kind == "final_norm":
        norm = anatomy.final_norm(root)
        if norm is None:
            raise AnatomyError("This model has no final norm to read.")
        return norm, OUTPUT
    layer = anatomy.check_layer(root, site.layer)
    if kind in ("block_in", "block_out"):
        return anatomy.decoder_layers(root)[layer], INPUT if kind == "block_in" else OUTPUT
    if kind == "attn_weights":
        return anatomy.attention_modules(root)[layer], OUTPUT
    if kind in ("attn_out", "mlp_out"):
        return anatomy.residual_writers(root, layer)[kind == "mlp_out"], OUTPUT
    if kind == "heads":
        return anatomy.output_projection(root, layer), INPUT
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
    found = _LOCATED.setdefault(root, {})
    if "head_dim" not in found:
        found["head_dim"] = anatomy.head_layout(root).head_dim
    return found["head_dim"]


def batch_shape(request: Request) -> tuple[int, int]:
    """(B, T) of the request's token inputs (OPT's MLP works on (B * T, D) rows: seen as (B, T, D))."""
    ids = request.inputs.get("input_ids")
    if ids is None:
        ids = request.inputs.get("inputs_embeds")
    return (int(ids.shape[0]), int(ids.shape[1])) if isinstance(ids, torch.Tensor) else (0, 0)


def write_ops(writes: list[Write], dh: int) -> list[tuple]:
    """A step's writes as (rows, positions, cols, value, source) index operations on a (B, T, width)
    tensor: `new[rows, positions, cols] = value`, or `= old[source, positions, cols]` for a copy.

    rows and positions are slices (every one) or index tensors that broadcast together (one write's
    rows x positions). A run of consecutive one-row copies from the same source row, head and position
    set becomes one operation with paired row and position indices, so patching 31 cells of a batch is
    a handful of indexed copies per layer, not 31."""
    ops: list[tuple] = []
    run: list[Write] = []

    def key(w: Write):
        single = len(w.rows) == 1 and (len(w.positions) <= 1)
        return (w.source, w.head, not w.positions) if w.source is not None and single else None

    def flush() -> None:
        if run:
            rows = torch.tensor([w.rows[0] for w in run])
            positions = slice(None) if not run[0].positions else torch.tensor([w.positions[0] for w in run])
            ops.append((rows, positions, columns(run[0], dh), None, run[0].source))
            run.clear()

    for w in writes:
        if key(w) is not None and (not run or key(run[0]) == key(w)):
            run.append(w)
            continue
        flush()
        if key(w) is not None:
            run.append(w)
            continue
        rows = torch.tensor(w.rows) if w.rows else slice(None)
        positions = torch.tensor(w.positions) if w.positions else slice(None)
        if w.rows and w.positions:  # every listed row at every listed position
            rows, positions = rows[:, None], positions[None, :]
        ops.append((rows, positions, columns(w, dh), w.value, w.source))
    flush()
    return ops


def columns(write: Write, dh: int) -> slice:
    return slice(None) if write.head is None else slice(write.head * dh, (write.head + 1) * dh)


def write_into(old: torch.Tensor, ops: list[tuple], shape: tuple[int, int]) -> torch.Tensor:
    """`old` with the write operations applied (a new tensor; the nnsight body inlines the same lines)."""
    grid = old.view(*shape, -1) if old.dim() == 2 else old  # OPT's fc2: (B * T, D) rows
    new = grid.clone()
    for rows, positions, cols, value, source in ops:
        new[rows, positions, cols] = grid[source, positions, cols] if value is None else value.to(new.device, new.dtype)
    return new.view(old.shape)


def finish(captured, root: torch.nn.Module, request: Request) -> None:
    """Shape what came back the same way for every backend: residual-width values as (B, T, D) (OPT's
    MLP hands back (B * T, D) rows), `heads` as (B, T, H, d), reads and gradients alike."""
    shape = batch_shape(request)
    for found in (captured.reads, captured.grads):
        for site, value in list(found.items()):
            if value.dim() == 2 and site.kind != "attn_weights":
                value = value.reshape(*shape, -1)
            if site.kind == "heads":
                value = value.reshape(*value.shape[:2], -1, head_dim(root))
            found[site] = value

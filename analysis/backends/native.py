"""The local backend: a request run by forward hooks on the handle's own model (what every panel did
before the seam existed). Hooks live inside `handle.patch()`; a capture-only forward stops after the
last module it needs (`anatomy.StopForward`)."""
from __future__ import annotations

import contextvars
from typing import Any

import torch

from analysis.model_access import anatomy
from analysis.backends.plan import (
    INPUT, Step, batch_shape, finish, head_dim, model_inputs, plan, root_module, write_into, write_ops,
)
from analysis.backends.request import AttentionRule, Captured, Request, Site

NAME = "local"
RULE_ATTENTION = "model_inspector_rule"
_ACTIVE: contextvars.ContextVar[tuple[AttentionRule, dict] | None] = contextvars.ContextVar(
    "backend_attention_rule", default=None)


def run(handle, request: Request) -> Captured:
    root = root_module(handle, request)
    steps = plan(root, request)
    captured = Captured(backend=NAME)
    live: dict[Site, torch.Tensor] = {}
    dh = head_dim(root) if any(w.head is not None for w in request.writes) else 0
    shape = batch_shape(request)
    last = steps[-1] if request.stops_early and steps else None
    kwargs = model_inputs(request, handle.device)
    with handle.patch() as patch, torch.set_grad_enabled(bool(request.grads)):
        for step in steps:
            if step.rule_layer is None:
                _hook(patch, step, captured, live, write_ops(step.writes, dh), shape, stop=step is last)
        if request.rule is not None:
            use_rule(patch, root, request.rule, captured.records)
        with anatomy.model_step(handle, "running the model"):
            try:
                out = root(**kwargs)
            except anatomy.StopForward:
                out = None
        if request.logits is not None and out is not None:
            captured.logits = keep_logits(out.logits, request.logits)
        if request.grads:
            metric = logit_metric(out.logits, request)
            tensors = [live[s] for s in request.grads]
            for site, grad in zip(request.grads, torch.autograd.grad(metric, tensors)):
                captured.grads[site] = grad.detach().cpu()
            captured.logits = captured.logits.detach()
    finish(captured, root, request)
    return captured



def keep_logits(logits: torch.Tensor, keep: int) -> torch.Tensor:
    return (logits[:, -keep:] if keep else logits).float().cpu()


def logit_metric(logits: torch.Tensor, request: Request) -> torch.Tensor:
    rows, position, plus, minus = request.metric.plain()
    row = logits[rows if rows is not None else slice(None), position].float()
    return row[:, plus].sum() - row[:, minus].sum()


def _hook(patch, step: Step, captured: Captured, live: dict, ops: list[tuple], shape: tuple[int, int],
          stop: bool) -> None:
    def visit(value: Any) -> Any:
        """Read and write the step's sites in `value` (a tensor or a tuple); the new value or None."""
        parts = list(value) if isinstance(value, tuple) else [value]
        changed = False
        for site in step.reads + step.grads:
            part = parts[step.index(site)]
            if part is None:
                raise anatomy.AnatomyError(f"{site} returned nothing: the model must run eager attention.")
            if site in step.grads and not part.requires_grad:  # frozen weights before it: the graph starts here
                part = parts[step.index(site)] = part.detach().requires_grad_(True)
                changed = True
            if site in step.grads:
                live[site] = part
            if site in step.reads:
                captured.reads[site] = part.detach().cpu()
        if ops:
            parts[0] = write_into(parts[0], ops, shape)
            changed = True
            for site in step.grads:  # the gradient of what flows on
                live[site] = parts[0]
        if stop:
            raise anatomy.StopForward
        if not changed:
            return None
        return tuple(parts) if isinstance(value, tuple) else parts[0]

    if step.where == INPUT:
        def pre(module, args, kwargs):
            first = args[0] if args else kwargs["hidden_states"]
            new = visit(first)
            if new is None:
                return None
            return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})
        patch.hook(step.module, pre, pre=True, with_kwargs=True)
    else:
        patch.hook(step.module, lambda module, args, output: visit(output))


# ---------------------------------------------------------------------------------------------
# An attention rule: transformers' attention interface, switched on for this forward only


def rule_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The registered attention function: calls the active rule and keeps its record per layer."""
    active = _ACTIVE.get()
    if active is None:  # only switched on inside a patch that also sets the rule
        raise RuntimeError("the rule attention ran without a rule")
    rule, records = active
    layer = getattr(module, "layer_idx", None)
    layer = len(records) if layer is None else int(layer)
    output, probs, record = rule.fn(layer, query, key, value, attention_mask, scaling, kwargs.get("softcap"))
    records[layer] = {k: v.detach().cpu() for k, v in record.items()}
    return output, probs


def register_rule_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(RULE_ATTENTION, rule_attention)
    AttentionMaskInterface.register(RULE_ATTENTION, eager_mask)  # unknown names would get no mask


def use_rule(patch, root: torch.nn.Module, rule: AttentionRule, records: dict) -> None:
    register_rule_attention()
    patch.attn_implementation(root, RULE_ATTENTION)
    token = _ACTIVE.set((rule, records))
    patch.call_on_exit(lambda: _ACTIVE.reset(token))


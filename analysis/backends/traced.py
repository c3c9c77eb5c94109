"""The nnsight backend: the same request run by nnsight tracing, in this process or on NDIF.

Locally the handle's model is wrapped (`nnsight.NNsight`) inside `handle.patch()` and unwrapped when
the patch ends, so no other session ever runs an instrumented model. Remotely the handle holds an
nnsight `TransformersModel` built on the meta device (no weights here) and the trace is shipped to NDIF
by `analysis.backends.ndif`.

The trace body below is what nnsight ships to NDIF: it refers only to envoys, plain tuples and tensors
built before the `with` (and the attention rule's function, shipped by value), so nothing of this
server travels with it but the request.
"""
from __future__ import annotations


import torch

from analysis.model_access import anatomy
from analysis.backends.plan import Step, batch_shape, finish, head_dim, model_inputs, plan, root_module, write_ops
from analysis.backends.request import Captured, Request

NAME = "nnsight-local"


def run(handle, request: Request) -> Captured:
    """Run `request` with nnsight on the handle's own model, in this process."""
    root = root_module(handle, request)
    steps = plan(root, request)
    with handle.patch() as patch, torch.set_grad_enabled(bool(request.grads)):
        model = wrap(root, patch)
        program = build_program(model, steps, request, root)
        kwargs = model_inputs(request, handle.device)
        with anatomy.model_step(handle, "running the model (nnsight)"):
            results = trace(model, kwargs, program, request)
    return unpack(results, request, root, NAME)



def wrap(root: torch.nn.Module, patch):
    """`nnsight.NNsight(root)` for the length of `patch`: nnsight installs a controller as each module's
    `forward` (and a source-instrumented body where `.source` is used); both go when the patch ends,
    and a `forward` someone else had set (accelerate's device hooks) comes back."""
    import nnsight
    from nnsight.intervention.source import STATE

    before = {id(m): (m, m.__dict__.get("forward"), m.__dict__.get(STATE)) for m in root.modules()}

    def unwrap() -> None:
        for module, forward, state in before.values():
            for key, old in (("forward", forward), (STATE, state)):
                if old is None:
                    module.__dict__.pop(key, None)
                else:
                    module.__dict__[key] = old

    patch.call_on_exit(unwrap)
    return nnsight.NNsight(root)


def envoy_of(model, module: torch.nn.Module):
    return model.interleaver.envoys[id(module)]


def attention_call(envoy) -> str:
    """The name of the attention-interface call inside an attention module's forward (its last such
    operation). The body looks it up again (`envoy.source`), so wherever it runs, that machine's module
    is the one source-instrumented."""
    names = [n for n in envoy.source.names if n.startswith("attention_interface_")]
    if not names:
        raise anatomy.AnatomyError(f"{type(envoy._module).__name__} does not call transformers' attention "
                                   "interface, so its attention cannot be replaced by a rule.")
    return max(names, key=lambda n: int(n.rsplit("_", 1)[1]))


def build_program(model, steps: list[Step], request: Request, root: torch.nn.Module) -> list[tuple]:
    """The plan as plain tuples for the trace body: (envoy, where, reads [(key, index)], writes [(rows,
    positions, cols, value, source)] (`plan.write_ops`), grads [(key, index)], call, layer, stop)."""
    dh = head_dim(root) if any(w.head is not None for w in request.writes) else 0
    last = steps[-1] if request.stops_early and steps else None
    program = []
    for step in steps:
        envoy = envoy_of(model, step.module)
        if step.rule_layer is not None:
            program.append((envoy, step.where, [], [], [], attention_call(envoy), step.rule_layer, step is last))
            continue
        reads = [(str(s), step.index(s)) for s in step.reads]
        grads = [("grad " + str(s), step.index(s)) for s in step.grads]
        program.append((envoy, step.where, reads, write_ops(step.writes, dh), grads, None, None, step is last))
    return program


def trace(model, kwargs: dict, program: list[tuple], request: Request, backend=None) -> dict:
    """Run the program in one nnsight trace; the saved results by key (every tensor on the CPU)."""
    import nnsight

    keep = request.logits
    rule = request.rule.fn if request.rule is not None else None
    metric = request.metric.plain() if request.metric is not None else None
    shape = batch_shape(request)
    results: dict = {}
    with model.trace(backend=backend, **kwargs) as tracer:
        nnsight.save(results)
        live = []
        for envoy, where, reads, writes, grads, call, layer, stop in program:
            if call is not None:
                call = getattr(envoy.source, call)
                args, kw = call.inputs
                out, probs, record = rule(layer, args[1], args[2], args[3], args[4], kw.get("scaling"),
                                          kw.get("softcap"))
                call.skip((out, probs))  # the eager attention it replaces never runs
                results[("record", layer)] = {k: v.detach().cpu() for k, v in record.items()}
                continue
            value = envoy.output if where == "output" else envoy.input
            parts = list(value) if isinstance(value, tuple) else [value]
            changed = False
            for key, index in grads:
                if not parts[index].requires_grad:  # frozen weights before it: the graph starts here
                    parts[index] = parts[index].detach().requires_grad_(True)
                    changed = True
            for key, index in reads:
                if parts[index] is not None:
                    results[key] = parts[index].detach().cpu()
            if writes:  # plan.write_into, inlined: nothing of this server's code travels with the trace
                old = parts[0]
                grid = old.view(*shape, -1) if old.dim() == 2 else old
                new = grid.clone()
                for rows, positions, cols, patch_value, source in writes:
                    if patch_value is None:
                        new[rows, positions, cols] = grid[source, positions, cols]
                    else:
                        new[rows, positions, cols] = patch_value.to(new.device, new.dtype)
                parts[0] = new.view(old.shape)
                changed = True
            if changed and where == "output":
                envoy.output = tuple(parts) if isinstance(value, tuple) else parts[0]
            elif changed:
                envoy.input = parts[0]
            for key, index in grads:
                live.append((key, parts[index]))
            if stop:
                tracer.stop()
        if keep is not None:
            logits = model.output.logits
            results["logits"] = (logits[:, -keep:] if keep else logits).detach().float().cpu()
            if live:
                rows, position, plus, minus = metric
                row = logits[rows if rows is not None else slice(None), position].float()
                total = row[:, plus].sum() - row[:, minus].sum()
                with total.backward(inputs=[tensor for _, tensor in live]):  # no weight gradients
                    for key, tensor in reversed(live):
                        results[key] = tensor.grad.detach().cpu()
    return results


def unpack(results: dict, request: Request, root: torch.nn.Module, name: str) -> Captured:
    """The trace's saved results as a `Captured` (the same shapes the native backend returns)."""
    captured = Captured(backend=name)
    for site in request.reads:
        if str(site) not in results:
            raise anatomy.AnatomyError(f"{site} returned nothing: the model must run eager attention.")
        captured.reads[site] = results[str(site)]
    for site in request.grads:
        captured.grads[site] = results["grad " + str(site)]
    captured.logits = results.get("logits")
    captured.records = {key[1]: value for key, value in results.items()
                        if isinstance(key, tuple) and key[0] == "record"}
    finish(captured, root, request)
    return captured

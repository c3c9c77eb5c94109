"""The nnsight path's overhead against the native (hook) path on the zoo's real model.

    python benchmarks/backend_bench.py [--repeats 5] [--threads 1] [--model zoo:smollm2-135m-instruct]

For each capture-based panel's typical request (same inputs, same model, both backends, interleaved
run by run so a neighbour's load hits both alike) it times the median wall-clock seconds, and the floor
measured in the same run: the plain forward that request needs (`model(...)`, no hooks, no trace; a
stopped capture's floor is a forward of the layers it runs; attribution's is a forward of both prompts
and one backward to the embeddings). Ratios: nnsight / native (goal <= 1.3) and each / floor. It also
checks, on every request, that both backends return the same tensors (max |difference|). The residual
panel's requests are the ones `analysis/residual/hooks.py` builds for its capital-france pair. Writes
benchmarks/results/backend_bench.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402

import torch  # noqa: E402

from analysis.model_access import anatomy  # noqa: E402
from analysis import backends
from analysis.backends import LogitMetric, Request, Site  # noqa: E402
from analysis.model_access.models import ModelSpec, load_model  # noqa: E402
from analysis.residual import ResidualParams, pairs_for  # noqa: E402
from analysis.residual import hooks  # noqa: E402
from analysis.residual.analysis import _problem  # noqa: E402
from analysis.residual.patching import COMPONENTS, Geometry  # noqa: E402
from analysis.sharpness import Recorder, Temperature  # noqa: E402
from analysis.sharpness.attention import attention_rule  # noqa: E402

OUT = RESULTS / "backend_bench.json"


def cases(handle) -> dict:
    """name -> (request, floor): each panel's request and the plain forward it needs."""
    torch.manual_seed(0)
    n = handle.info.layers
    batch = torch.randint(100, 20_000, (4, 32))  # SAE-V / reconstruction: a batch of texts
    prompt = torch.randint(100, 20_000, (1, 64))  # sharpness: one prompt, every layer's rule
    mid = n // 2
    lm = handle.language_model
    layers = anatomy.decoder_layers(lm)

    def stopped_floor(ids, layer):
        def run():
            def stop(*a):
                raise anatomy.StopForward
            h = layers[layer].register_forward_hook(stop)
            try:
                lm(input_ids=ids, use_cache=False)
            except anatomy.StopForward:
                pass
            finally:
                h.remove()
        return run

    rec = Recorder()
    return {
        "sae_v_activations (layer n/2, stop)": (
            Request(inputs={"input_ids": batch, "use_cache": False}, reads=(Site("block_out", mid),),
                    root="language_model"), stopped_floor(batch, mid)),
        "reconstruction_targets (last layer, stop)": (
            Request(inputs={"input_ids": batch, "use_cache": False}, reads=(Site("block_out", n - 1),),
                    root="language_model"), stopped_floor(batch, n - 1)),
        "caption_verification (last-position logits)": (
            Request(inputs={"input_ids": batch, "use_cache": False}, logits=1, root="language_model"),
            lambda: lm(input_ids=batch, use_cache=False, logits_to_keep=1)),
        "logit_lens (every layer + logits)": (
            Request(inputs={"input_ids": batch, "use_cache": False}, logits=1, root="language_model",
                    reads=tuple(Site("block_out", i) for i in range(n))),
            lambda: lm(input_ids=batch, use_cache=False, logits_to_keep=1)),
        "sharpness (attention rule in every layer)": (
            Request(inputs={"input_ids": prompt, "use_cache": False}, logits=1, root="language_model",
                    rule=attention_rule(Temperature.adaptive(), rec)),
            lambda: lm(input_ids=prompt, use_cache=False, logits_to_keep=1)),
        **residual_cases(handle),
    }


def residual_cases(handle) -> dict:
    """The residual-stream panel's three kinds of forward on its first pair (SmolLM2: capital-france)."""
    lm = handle.language_model
    problem = _problem(handle, ResidualParams(), pairs_for(handle)[0])
    layout = anatomy.head_layout(lm)
    g = Geometry(handle.info.layers, problem.clean.shape[1], layout.heads, layout.head_dim)
    cells = [(i, j) for i in range(g.layers) for j in range(g.positions)][:31]  # exact: a full later batch
    writes = tuple(COMPONENTS.create("residual").edit(i, j, 1 + r, g) for r, (i, j) in enumerate(cells))
    rows = torch.cat([problem.clean, problem.corrupt.expand(len(cells), -1)])
    both = torch.cat([problem.clean, problem.corrupt])
    metric = LogitMetric(-1, plus=(problem.target,), minus=(problem.foil,), rows=(1,))

    def attribution_floor():
        with torch.enable_grad():
            embeds = anatomy.input_embeddings(lm)(both).detach().requires_grad_(True)
            logits = lm(inputs_embeds=embeds, use_cache=False, logits_to_keep=1).logits
            torch.autograd.grad(logits[1, -1, problem.target] - logits[1, -1, problem.foil], [embeds])

    return {
        "residual_lens (4 sites x every layer + every logit)": (
            hooks.request(handle, problem.clean, want=hooks.SITES),
            lambda: lm(input_ids=problem.clean, use_cache=False)),
        "residual_exact (32 rows: 31 cells copied from row 0)": (
            hooks.request(handle, rows, want=(), writes=writes, keep=1),
            lambda: lm(input_ids=rows, use_cache=False, logits_to_keep=1)),
        "residual_attribution (2 rows, 4 sites' gradients)": (
            hooks.request(handle, both, want=hooks.SITES, keep=1, grads=hooks.SITES, metric=metric, layers=g.layers),
            attribution_floor),
    }


def difference(a, b) -> float:
    pairs = [(a.logits, b.logits)] + [(a.reads[s], b.reads[s]) for s in a.reads]
    pairs += [(a.grads[s], b.grads[s]) for s in a.grads]
    pairs += [(a.records[k][f], b.records[k][f]) for k in a.records for f in a.records[k]]
    return max([float((x - y).abs().max()) for x, y in pairs if x is not None] + [0.0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: least disturbed by a shared machine)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    handle = load_model(ModelSpec.parse(args.model))
    rows = []
    for name, (request, floor) in cases(handle).items():
        got = {}
        for backend in ("local", "nnsight-local"):  # warm-up (imports, first allocations) and the check
            with backends.using(backend):
                got[backend] = backends.run(handle, request)
        times = {"floor": [], "local": [], "nnsight-local": []}
        for _ in range(args.repeats):
            for which in ("floor", "local", "nnsight-local"):
                t0 = time.perf_counter()
                if which == "floor":
                    with handle.session():
                        floor()
                else:
                    with backends.using(which):
                        backends.run(handle, request)
                times[which].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"case": name, "seconds": med, "nnsight_over_native": med["nnsight-local"] / med["local"],
                     "native_over_floor": med["local"] / med["floor"],
                     "nnsight_over_floor": med["nnsight-local"] / med["floor"],
                     "max_abs_difference": difference(got["local"], got["nnsight-local"])})
        print(f"{name:45s} floor {med['floor']:.3f}s  native {med['local']:.3f}s  nnsight {med['nnsight-local']:.3f}s"
              f"  nnsight/native {rows[-1]['nnsight_over_native']:.2f}  |diff| {rows[-1]['max_abs_difference']:.1e}")
    worst = max(r["nnsight_over_native"] for r in rows)
    result = {"model": handle.spec.label, "parameters": handle.info.parameters, "repeats": args.repeats,
              "device": str(handle.device), "torch_threads": torch.get_num_threads(), "machine": platform.processor()
              or platform.machine(), "cpus": os.cpu_count(), "cases": rows, "worst_nnsight_over_native": worst,
              "goal": 1.3}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"worst nnsight/native {worst:.2f} (goal <= 1.3); wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

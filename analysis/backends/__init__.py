"""The backend seam: one forward pass of a model, asked for as data, run by whichever backend the
deployment configures. Panels build a `Request`, call `run(handle, request)` and get a `Captured`;
they never know which backend ran it.

Backends (configuration `[backend] kind`, `analysis/framework/config.py`):

- `local`          forward hooks on the handle's model in this process (`native.py`; the default);
- `nnsight-local`  the same request as an nnsight trace on the handle's model, in this process (`traced.py`);
- `ndif`           models listed in `[backend] remote_models` run on NDIF through nnsight (`ndif.py`);
                   every other model keeps running locally.

The API (everything a panel needs; `request.py` has the details):

    from analysis import backends
    from analysis.backends import Request, Site, Write, LogitMetric, AttentionRule

    got = backends.run(handle, Request(inputs={"input_ids": ids}, reads=(Site("block_out", 5),)))
    got[Site("block_out", 5)]          # (B, T, D) on the CPU; the forward stopped after layer 5

Sites (`Site(kind, layer)`, visited in execution order whatever order they are given in):
`block_in` / `block_out` (the residual stream entering / leaving a decoder layer; block_in 0 is the
embeddings), `attn_out`, `mlp_out` (what attention / the MLP add to the residual stream: Gemma 2/3's
sandwich norms' outputs, OPT's fc2), `heads` (each head's output before the output projection,
(B, T, H, d)), `attn_weights` (eager attention's probabilities, (B, H, T, T)), `final_norm` (what the
unembedding reads).

A request may also
- keep the logits: `logits=0` (every position) or `logits=k` (the last k); None: not needed, so the
  forward stops after the last site it reads;
- write: `Write(site, value, positions=(...), head=h, rows=(...))` replaces the value in those batch
  rows at those positions (one head's slice of `heads`) before the rest of the model sees it; with
  `source=r` instead of a value, it copies batch row r's own value there (a clean prompt riding in the
  batch: one forward patches one cell per row);
- take gradients: `grads=(sites...)` with `metric=LogitMetric(position, plus, minus, rows)` gives
  d metric / d value at each site (attribution patching; nothing is accumulated on the weights);
- replace the attention function: `rule=AttentionRule(fn)` runs `fn` in every attention layer
  instead of softmax attention and returns its per-layer record (attention sharpness);
- run the text-only language model of a VLM: `root="language_model"`.

The residual-stream panel asks everything through `analysis/residual/hooks.py`: the logit lens reads
`block_in` 0 and every `block_out` (the final norm and unembedding are applied to them afterwards);
activation patching is batches of the corrupted prompt with the clean one in row 0 and one `source=0`
write per row; attribution patching is one forward of both prompts with `grads` of the corrupted row's
`LogitMetric`.

What stays local: analyses with their own decode loop and cache surgery (KV-cache eviction), generation,
and searches that run the model thousands of times on its weights (the prompt-reconstruction attack's
candidate search). `local_only(handle, what)` says so in one line when the handle is remote.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

from analysis.backends.request import AttentionRule, Captured, LogitMetric, Request, Site, Write

__all__ = ["AttentionRule", "Captured", "LogitMetric", "Request", "Site", "Write", "run", "load", "name_for",
           "using", "local_only", "KINDS"]

KINDS = ("local", "nnsight-local", "ndif")
_FORCED: contextvars.ContextVar[str | None] = contextvars.ContextVar("backend_forced", default=None)


def name_for(handle) -> str:
    """The backend that runs `handle`'s requests: 'ndif' for a remote model, else the configured
    local kind ('local' or 'nnsight-local'; `using(...)` overrides it)."""
    if is_remote(handle):
        return "ndif"
    forced = _FORCED.get()
    if forced is not None:
        return forced
    from analysis.framework import config

    kind = config.current().backend.kind
    return kind if kind != "ndif" else "local"


def run(handle, request: Request) -> Captured:
    """Run `request` on `handle`'s model with its backend; every returned tensor is on the CPU."""
    name = name_for(handle)
    if name == "ndif":
        from analysis.backends import ndif

        return ndif.run(handle, request)
    if name == "nnsight-local":
        from analysis.backends import traced

        return traced.run(handle, request)
    from analysis.backends import native

    return native.run(handle, request)


def load(spec):
    """A `ModelHandle` for `spec`: an NDIF model (`ndif:owner/name`: config and tokenizer here, weights
    there) or, for every other source, `analysis.model_access.models.load_model`."""
    if spec.source == "ndif":
        from analysis.backends import ndif

        return ndif.load_remote(spec)
    from analysis.model_access.models import load_model

    return load_model(spec)


@contextlib.contextmanager
def using(name: str) -> Iterator[None]:
    """Run local models' requests with backend `name` inside the block (tests, benchmarks)."""
    if name not in ("local", "nnsight-local"):
        raise ValueError(f"unknown local backend '{name}' (local or nnsight-local)")
    token = _FORCED.set(name)
    try:
        yield
    finally:
        _FORCED.reset(token)


def is_remote(handle) -> bool:
    return getattr(handle, "remote", None) is not None


def local_only(handle, what: str) -> str | None:
    """One line saying that `what` runs only on a model loaded here, when `handle` runs on NDIF."""
    if not is_remote(handle):
        return None
    return (f"{what} needs the model's weights in this server's memory (its own decode loop and cache), "
            f"so it stays local: {handle.spec.label} runs on NDIF. Pick a local or zoo model for it.")

"""The attention function that applies a temperature rule, and the request that switches it on.

`tempered_attention` computes eager attention with a temperature rule and records one query row (the
answer position) of every layer. It runs as the attention rule of a backend request
(`analysis/backends`): the local backend switches it on through transformers' attention interface
inside `handle.patch()`, the nnsight backend replaces each layer's attention call with it in the trace
(locally or on NDIF). Either way the rule travels with the request, so two sessions never see each
other's temperature.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Iterator

import torch

from analysis import backends
from analysis.model_access.models import ModelHandle
from analysis.sharpness.errors import SharpnessError
from analysis.sharpness.rules import Rule, Temperature, method_softmax, row_entropy


@dataclass
class Recorder:
    """One query row (default: the last) of every attention layer in the latest forward: logits, probs, β."""

    scores: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (B, H, T) logits s
    probs: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (B, H, T) used
    raw_entropy: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (B, H)
    beta: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (B, H)
    calls: int = 0
    row: int = -1  # the query position recorded

    def clear(self) -> None:
        self.scores.clear(), self.probs.clear(), self.raw_entropy.clear(), self.beta.clear()
        self.calls = 0


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, H_kv, T, d) -> (B, H_kv * groups, T, d), each KV head serving `groups` query heads."""
    if groups == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


def tempered_attention(method: Rule, layers: tuple[int, ...] | None, row: int, record: bool, layer: int, query, key,
                       value, attention_mask, scaling=None, softcap=None):
    """Eager attention with the rule `method` in layer `layer` if it is among `layers` (None: all), else
    plain softmax (dropout never applied: analysis runs in eval mode).

    Returns (output (B, T, H, d), probabilities used, record of query row `row`: its logits s, the
    probabilities, the entropy of plain softmax(s) and the β applied), the signature of a backend's
    `AttentionRule`. Its arguments are what a remote request ships by value, so they are the rule's method
    and plain values, never its `Temperature` (a result class: with it would go the result-loading code,
    which refers to this checkout's modules by name, and NDIF has none of them)."""
    if layers is not None and layer not in layers:
        method = None
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    groups = query.shape[1] // key.shape[1]
    key = _repeat_kv(key, groups)
    value = _repeat_kv(value, groups)
    scores = torch.matmul(query, key.transpose(2, 3)).mul_(scaling)
    if softcap:  # Gemma 2: the logits as used are soft-capped, cap * tanh(s / cap), before the mask
        scores = torch.tanh(scores / softcap).mul_(softcap)
    if attention_mask is not None:
        scores.add_(attention_mask[:, :, :, : key.shape[-2]])
    row_scores = scores[:, :, row, :].float().clone() if record else None
    probs, _, _ = method_softmax(scores, method, inplace=True)  # scores is ours: overwrite it
    probs = probs.to(value.dtype)
    output = torch.matmul(probs, value).transpose(1, 2).contiguous()
    kept = {}
    if record:
        raw_entropy = row_entropy(row_scores)
        kept = dict(scores=row_scores, probs=probs[:, :, row, :].float().clone(), raw_entropy=raw_entropy,
                    beta=torch.ones_like(raw_entropy) if method is None else method.beta(raw_entropy))
    return output, probs, kept


def attention_rule(rule: Temperature, recorder: Recorder | None = None) -> backends.AttentionRule:
    row = recorder.row if recorder is not None else -1
    return backends.AttentionRule(functools.partial(tempered_attention, rule.rule, rule.layers, row,
                                                    recorder is not None))


@contextlib.contextmanager
def temperature_patch(handle: ModelHandle, rule: Temperature, recorder: Recorder | None = None,
                      model: torch.nn.Module | None = None) -> Iterator[torch.nn.Module]:
    """Inside: `model` (default: the handle's language model) attends with `rule` when called directly
    (tests and references; analyses send a request through `tempered_logits`); restored after."""
    from analysis.backends import native

    model = handle.language_model if model is None else model
    records: dict = {}
    with handle.patch() as p, torch.no_grad():
        native.use_rule(p, model, attention_rule(rule, recorder), records)
        yield model
    if recorder is not None:
        _fill(recorder, records)


def tempered_logits(handle: ModelHandle, input_ids: torch.Tensor, rule: Temperature,
                    recorder: Recorder | None = None, *, keep: int = 0, attention_mask: torch.Tensor | None = None,
                    position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token logits (B, T, V) of the language model with `rule` applied in every head; with `keep` > 0
    only the last `keep` positions' (the output layer over every position is a large share of a real
    model's forward). `attention_mask` may be a 4-D additive mask (with `position_ids`)."""
    inputs = {"input_ids": input_ids, "use_cache": False}
    if attention_mask is not None:
        inputs["attention_mask"] = attention_mask
    if position_ids is not None:
        inputs["position_ids"] = position_ids
    request = backends.Request(inputs=inputs, logits=keep, rule=attention_rule(rule, recorder),
                               root="language_model")
    got = backends.run(handle, request)
    if recorder is not None:
        recorder.clear()
        _fill(recorder, got.records)
        _check_recorded(handle, recorder)
    return got.logits.float()


def _fill(recorder: Recorder, records: dict[int, dict[str, torch.Tensor]]) -> None:
    for layer, kept in sorted(records.items()):
        recorder.scores[layer] = kept["scores"]
        recorder.probs[layer] = kept["probs"]
        recorder.raw_entropy[layer] = kept["raw_entropy"]
        recorder.beta[layer] = kept["beta"]
    recorder.calls = len(records)


def _check_recorded(handle: ModelHandle, recorder: Recorder) -> None:
    if not recorder.probs:
        raise SharpnessError(
            f"{handle.spec.label} does not compute attention through transformers' attention interface "
            "(no attention layer called it), so its attention weights cannot be read or re-tempered. "
            "Pick a Llama-, GPT-2- or LLaVA-family model."
        )

"""The attention function that applies a temperature rule, and the patch that switches it on.

One attention function, registered once with transformers' `AttentionInterface` under
`ATTENTION_NAME`, computes eager attention with a temperature rule and records one query row (the
answer position) of every layer. It is switched on only inside `handle.patch()` (config
`_attn_implementation` swapped and restored), and its settings travel in a `ContextVar`, so two
sessions never see each other's temperature.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Iterator

import torch

from analysis.models import ModelHandle
from analysis.sharpness.errors import SharpnessError
from analysis.sharpness.rules import SOFTMAX, Temperature, row_entropy, rule_beta, tempered_softmax

ATTENTION_NAME = "model_inspector_temperature"


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


@dataclass
class _Active:
    rule: Temperature
    recorder: Recorder | None


_ACTIVE: contextvars.ContextVar[_Active | None] = contextvars.ContextVar("sharpness_active", default=None)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, H_kv, T, d) -> (B, H_kv * groups, T, d), each KV head serving `groups` query heads."""
    if groups == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


def _record(recorder: Recorder, module, rule: Temperature, row_scores: torch.Tensor, probs: torch.Tensor) -> None:
    layer = getattr(module, "layer_idx", None)
    layer = recorder.calls if layer is None else int(layer)
    recorder.calls += 1
    raw_entropy = row_entropy(row_scores)
    recorder.scores[layer] = row_scores
    recorder.probs[layer] = probs[:, :, recorder.row, :].float().detach()
    recorder.raw_entropy[layer] = raw_entropy
    recorder.beta[layer] = rule_beta(rule, raw_entropy)


def temperature_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention with a temperature rule; signature of transformers' attention functions.

    Dropout is never applied (analysis runs in eval mode). Returns (output, probabilities used).
    """
    active = _ACTIVE.get()
    rule = active.rule.in_layer(getattr(module, "layer_idx", None)) if active is not None else SOFTMAX
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    groups = query.shape[1] // key.shape[1]
    key = _repeat_kv(key, groups)
    value = _repeat_kv(value, groups)
    scores = torch.matmul(query, key.transpose(2, 3)).mul_(scaling)
    softcap = kwargs.get("softcap")
    if softcap:  # Gemma 2: the logits as used are soft-capped, cap * tanh(s / cap), before the mask
        scores = torch.tanh(scores / softcap).mul_(softcap)
    if attention_mask is not None:
        scores.add_(attention_mask[:, :, :, : key.shape[-2]])
    recorder = active.recorder if active is not None else None
    row_scores = scores[:, :, recorder.row, :].float().clone() if recorder is not None else None
    probs, _, _ = tempered_softmax(scores, rule, inplace=True)  # scores is ours: overwrite it
    probs = probs.to(value.dtype)
    output = torch.matmul(probs, value).transpose(1, 2).contiguous()
    if recorder is not None:
        _record(recorder, module, rule, row_scores, probs)
    return output, probs


def register_attention() -> None:
    """Register the attention function (and the eager mask it needs) under `ATTENTION_NAME`.

    Registering only adds a name; nothing uses it until a patch switches a model's config to it.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTENTION_NAME, temperature_attention)
    # Without a mask entry transformers treats an unknown implementation as mask-free.
    AttentionMaskInterface.register(ATTENTION_NAME, eager_mask)


@contextlib.contextmanager
def temperature_patch(handle: ModelHandle, rule: Temperature, recorder: Recorder | None = None,
                      model: torch.nn.Module | None = None) -> Iterator[torch.nn.Module]:
    """Inside: `model` (default: the handle's language model) attends with `rule`; restored after."""
    register_attention()
    model = handle.language_model if model is None else model
    with handle.patch() as p, torch.no_grad():
        p.attn_implementation(model, ATTENTION_NAME)
        token = _ACTIVE.set(_Active(rule, recorder))
        p.call_on_exit(lambda: _ACTIVE.reset(token))
        yield model


def tempered_logits(handle: ModelHandle, input_ids: torch.Tensor, rule: Temperature,
                    recorder: Recorder | None = None, *, keep: int = 0, attention_mask: torch.Tensor | None = None,
                    position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token logits (B, T, V) of the language model with `rule` applied in every head; with `keep` > 0
    only the last `keep` positions' (the output layer over every position is a large share of a real
    model's forward). `attention_mask` may be a 4-D additive mask (with `position_ids`)."""
    extra = {"logits_to_keep": keep} if keep else {}
    if attention_mask is not None:
        extra["attention_mask"] = attention_mask.to(handle.device)
    if position_ids is not None:
        extra["position_ids"] = position_ids.to(handle.device)
    with temperature_patch(handle, rule, recorder) as lm:
        if recorder is not None:
            recorder.clear()
        logits = lm(input_ids=input_ids.to(handle.device), use_cache=False, **extra).logits
    if recorder is not None:
        _check_recorded(handle, recorder)
    return logits.float()


def _check_recorded(handle: ModelHandle, recorder: Recorder) -> None:
    if not recorder.probs:
        raise SharpnessError(
            f"{handle.spec.label} does not compute attention through transformers' attention interface "
            "(no attention layer called it), so its attention weights cannot be read or re-tempered. "
            "Pick a Llama-, GPT-2- or LLaVA-family model."
        )

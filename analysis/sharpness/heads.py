"""Per layer/head statistics of the recorded query row: entropy, largest weight, weight on the answer item."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from analysis.framework.results import Result
from analysis.sharpness.attention import Recorder
from analysis.sharpness.rules import entropy_nats


@dataclass
class HeadStats(Result):
    """Per [layer][head] statistics of the answer position's attention row."""

    entropy: list[list[float]]  # nats
    entropy_norm: list[list[float]]  # H / ln(keys attended)
    max_weight: list[list[float]]
    target_weight: list[list[float]]  # weight on the answer item's tokens (max retrieval: the largest)
    spread: list[list[float]]  # δ = max - min logit over attended keys
    raw_entropy: list[list[float]]  # entropy of plain softmax(s) in this run (what β is chosen from)
    beta: list[list[float]]  # inverse temperature applied


def row_stats(scores: torch.Tensor, probs: torch.Tensor, target: list[list[int]], drop_sink: bool) -> dict:
    """Statistics of rows (B, H, T). `target[b]` are positions; with drop_sink key 0 is removed."""
    valid = scores > torch.finfo(torch.float32).min / 2
    if drop_sink:
        scores, probs, valid = scores[..., 1:], probs[..., 1:], valid[..., 1:]
        probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-30)
        target = [[t - 1 for t in ts if t > 0] for ts in target]
    keys = valid.sum(-1).clamp_min(2).float()
    ent = entropy_nats(probs)
    big = torch.where(valid, scores, torch.full_like(scores, -float("inf"))).amax(-1)
    small = torch.where(valid, scores, torch.full_like(scores, float("inf"))).amin(-1)
    mask = torch.zeros_like(probs, dtype=torch.bool)
    for b, ts in enumerate(target):
        mask[b, :, ts] = True
    return dict(
        entropy=ent, entropy_norm=ent / keys.log(), max_weight=probs.amax(-1),
        target_weight=(probs * mask).sum(-1), spread=big - small,
    )


def head_stats(recorder: Recorder, target: list[list[int]], drop_sink: bool) -> list[dict]:
    """Per-sample statistics from a recorded forward: a list over layers of dicts of (B, H) tensors."""
    out = []
    for layer in sorted(recorder.probs):
        st = row_stats(recorder.scores[layer], recorder.probs[layer], target, drop_sink)
        st["raw_entropy"] = recorder.raw_entropy[layer]
        st["beta"] = recorder.beta[layer]
        out.append(st)
    return out


def mean_stats(per_batch: list[list[dict]]) -> HeadStats:
    """Average batches' per-layer stats over samples -> HeadStats."""
    keys = [f for f in HeadStats.__dataclass_fields__]
    layers = len(per_batch[0])
    values = {}
    for k in keys:
        rows = []
        for layer in range(layers):
            stacked = torch.cat([batch[layer][k] for batch in per_batch], dim=0)  # (N, H)
            rows.append(stacked.mean(0).tolist())
        values[k] = rows
    return HeadStats(**values)


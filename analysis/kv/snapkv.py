"""SnapKV and PyramidKV: the last w queries vote for the older entries; PyramidKV sizes each layer's
budget by depth with its official schedule. Both select after the current queries attend, as their
official code does (the prompt attends over every entry; the compressed keys and values are stored)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch.nn.functional as F

from analysis.kv.base import Policy, group_reduce, keep_rows, recent_rows, top_plus_recent
from analysis.framework.registry import SettingsError
from analysis.framework.settings import setting


@dataclass
class SnapKV(Policy):
    """SnapKV (Li et al., 2024): the last w queries vote (attention summed over the window and over the
    query heads of a KV group), votes are average-pooled with kernel k, the top C - w older entries plus
    the last w are kept (FasterDecoding/SnapKV, snapkv/monkeypatch/snapkv_utils.py, SnapKVCluster.update_kv).
    The official code compresses the prompt once; here the same rule also runs at every decode step whose
    cache exceeds C (the window's attention renormalised over the entries still cached, as kvpress's
    DecodingPress recomputes it), so it holds C like the others."""

    name: ClassVar[str] = "snapkv"
    label: ClassVar[str] = "SnapKV"
    colour: ClassVar[str] = "#9467bd"
    summary: ClassVar[str] = "last w queries vote, pooled with kernel k; at prefill and every decode step"
    timing_source: ClassVar[str] = ("FasterDecoding/SnapKV@e216ddc snapkv/monkeypatch/llama_hijack_4_37.py l. 86-126: "
                                    "the compressed keys are stored, the prompt attends over all of them")
    decode: ClassVar[bool] = True

    snap_window: int = setting(8, label="SnapKV window w", low=1, high=4096,
                               help="SnapKV's observation window: the last w queries vote.")
    kernel: int = setting(5, label="SnapKV pooling kernel", low=1, high=31, step=2,
                          help="Width of SnapKV's average pooling over the votes (odd).")

    def validate(self) -> None:
        if self.kernel % 2 == 0:
            raise SettingsError(f"The SnapKV pooling kernel must be a positive odd number, got {self.kernel}.")
        super().validate()

    def min_budget(self) -> int:
        return self.snap_window + 1

    def budget_reason(self) -> str:
        return f"the window of {self.snap_window} plus one voted entry"

    def select(self, layer, attn, state):
        w, t = self.snap_window, state.length
        c = self.layer_budget(layer, state.n_layers, state.prompt_len)
        decoding = state.phase != "prefill"
        rows = recent_rows(state, attn, w) if self.decode else None
        if t <= c or (decoding and not self.decode):
            if rows is not None:
                keep_rows(state, rows, None)
            return None
        window = attn[:, :, -w:].float() if rows is None else rows
        if decoding:  # earlier queries' rows, renormalised over the entries still cached
            window = window / window.sum(-1, keepdim=True).clamp_min(1e-30)
        votes = group_reduce(window[..., : t - w].sum(2), state.groups, "sum")  # (B, H_kv, T - w)
        k = self.kernel
        pooled = F.avg_pool1d(votes.flatten(0, 1)[:, None], k, stride=1, padding=k // 2)[:, 0]
        keep = top_plus_recent(pooled.reshape(votes.shape), c - w, t)
        if rows is not None:
            keep_rows(state, rows, keep)
        return keep

    def held(self, n_layers, prompt_len, length):
        budgets = [self.layer_budget(i, n_layers, prompt_len) for i in range(n_layers)]
        if self.decode:
            return [min(length, c) for c in budgets]
        return [min(prompt_len, c) + length - prompt_len for c in budgets]  # compressed once, then grows


@dataclass
class PyramidKV(SnapKV):
    """PyramidKV (Cai et al., 2024): SnapKV's vote with per-layer budgets by depth, with its official
    schedule (Zefan-Cai/PyramidKV pyramidkv/pyramidkv_utils.py, PyramidKVCluster.update_kv l. 205-238):
    a prompt shorter than C is not compressed, one shorter than 2(C - w) gets SnapKV's uniform budget C,
    and a longer one gets older-entry budgets falling linearly from 2(C - w) - (C - w)//beta at the first
    layer (at most the prompt's older entries) in whole steps, plus the window w. Each layer is then held
    at its budget at every decode step, like SnapKV above."""

    name: ClassVar[str] = "pyramidkv"
    label: ClassVar[str] = "PyramidKV"
    colour: ClassVar[str] = "#8c564b"
    summary: ClassVar[str] = "SnapKV's vote, budgets falling with depth (official schedule)"
    beta: ClassVar[int] = 20

    def layer_budget(self, layer: int, n_layers: int, prompt_len: int) -> int:
        return self.schedule(n_layers, prompt_len)[layer]

    def schedule(self, n_layers: int, prompt_len: int) -> list[int]:
        """Entries each layer keeps after a prompt of `prompt_len` tokens (C for every layer below 2(C - w))."""
        c, w = self.budget, self.snap_window
        if n_layers < 2 or prompt_len < c or prompt_len < 2 * (c - w):  # not compressed / uniform: C each
            return [c] * n_layers
        low = (c - w) // self.beta
        high = 2 * (c - w) - low
        if high >= prompt_len - w:
            high = prompt_len - w
            low = 2 * (c - w) - high
        steps = (high - low) // (n_layers - 1)
        return [high - layer * steps + w for layer in range(n_layers)]


@dataclass
class SnapKVPrefill(SnapKV):
    """SnapKV as the official code runs it: the prompt is compressed once, then the cache grows by one
    entry per decode step, so it holds more than C when the answer is predicted."""

    name: ClassVar[str] = "snapkv_prefill"
    label: ClassVar[str] = "SnapKV, prefill only (grows after)"
    colour: ClassVar[str] = "#c5b0d5"
    summary: ClassVar[str] = "compresses the prompt once, then grows"
    variant: ClassVar[bool] = True
    grows: ClassVar[bool] = True
    decode: ClassVar[bool] = False


@dataclass
class PyramidKVPrefill(PyramidKV):
    """PyramidKV compressing the prompt once; the cache then grows by one entry per decode step."""

    name: ClassVar[str] = "pyramidkv_prefill"
    label: ClassVar[str] = "PyramidKV, prefill only (grows after)"
    colour: ClassVar[str] = "#c49c94"
    summary: ClassVar[str] = "compresses the prompt once with per-layer budgets, then grows"
    variant: ClassVar[bool] = True
    grows: ClassVar[bool] = True
    decode: ClassVar[bool] = False

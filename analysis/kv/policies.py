"""Eviction policies: one small dataclass per policy, registered in `POLICIES` in the order the page lists them.

A policy owns its settings (dataclass fields, validated in `validate()` with a message for the user),
its identity (`name`, `label`, `colour`) and its timing (`base.py`): every policy here selects after the
current query attends, as its official code does; MorphKV (`morphkv.py`) selects before. SnapKV and
PyramidKV are in `snapkv.py`. The rule of each policy, with the official file and line it follows, is
in docs/readme_kv.md.

Adding a policy is one class registered below (see `TOVA` for the smallest one); the page, the CLI,
the budget sweep and the benchmarks pick it up from `POLICIES`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from analysis.kv.base import (  # noqa: F401  (the policies' face: helpers re-exported)
    POLICIES, LayerState, Policy, Selection, gather_kv, gather_q, group_reduce, keep_rows, recent_rows,
    top_plus_recent,
)
from analysis.kv.morphkv import MorphKV, MorphKV8903
from analysis.kv.snapkv import PyramidKV, PyramidKVPrefill, SnapKV, SnapKVPrefill
from analysis.framework.settings import setting


@dataclass
class FullCache(Policy):
    name: ClassVar[str] = "full"
    label: ClassVar[str] = "Full cache"
    colour: ClassVar[str] = "#444444"
    summary: ClassVar[str] = "keeps everything (the reference)"

    def select(self, layer, attn, state):
        return None

    def held(self, n_layers, prompt_len, length):
        return [length] * n_layers


@dataclass
class StreamingLLM(Policy):
    """Attention sinks: the first S tokens plus the most recent C - S (Xiao et al., 2024), cut after
    every forward whose cache exceeds C (mit-han-lab/streaming-llm, kv_cache.py StartRecentKVCache)."""

    name: ClassVar[str] = "streaming_llm"
    label: ClassVar[str] = "StreamingLLM"
    colour: ClassVar[str] = "#1f77b4"
    summary: ClassVar[str] = "first S sink tokens + the last C - S"
    timing_source: ClassVar[str] = ("mit-han-lab/streaming-llm@2e50426 examples/eval_long_ppl.py l. 83-93: "
                                    "`kv_cache(past_key_values)` after the token's forward")

    sinks: int = setting(4, label="Sinks S (StreamingLLM)", low=0, high=256,
                         help="StreamingLLM always keeps the first S tokens.")

    def min_budget(self) -> int:
        return self.sinks + 1

    def budget_reason(self) -> str:
        return f"{self.sinks} sinks plus one recent token"

    def select(self, layer, attn, state):
        c, t = self.budget, state.length
        if t <= c:
            return None
        b, h = state.positions.shape[:2]
        idx = torch.cat([torch.arange(self.sinks), torch.arange(t - (c - self.sinks), t)])
        return idx.to(attn.device).expand(b, h, -1)


@dataclass
class H2O(Policy):
    """Heavy hitters (Zhang et al., 2023): attention accumulated over every query seen, the top
    round(share * C) of the older entries, plus the last C - round(share * C) tokens. Cut after every
    forward whose cache exceeds C, prefill included (FMInference/H2O, h2o_hf/utils_real_drop/modify_llama.py,
    H2OKVCache_LayerWise). The paper's experiments split the budget half/half (heavy_ratio = recent_ratio)."""

    name: ClassVar[str] = "h2o"
    label: ClassVar[str] = "H2O"
    colour: ClassVar[str] = "#ff7f0e"
    summary: ClassVar[str] = "accumulated attention (heavy hitters) + recent tokens"
    timing_source: ClassVar[str] = ("FMInference/H2O@0ee6a85 h2o_hf/utils_real_drop/modify_llama.py l. 324-330: "
                                    "softmax, then `self.kv_cache(past_key_value, attn_weights)`, then "
                                    "`attn_output = attn_weights @ value_states` over every entry")

    # below 1: some recent tokens are always kept
    heavy_share: float = setting(0.5, label="H2O heavy-hitter share", low=0.0, high=0.95, step=0.05,
                                 help="Share of the budget for heavy hitters; the rest keeps the most recent "
                                      "tokens (H2O used half/half).")

    def heavy(self) -> int:
        return round(self.budget * self.heavy_share)

    def min_budget(self) -> int:
        c = 1
        while c - round(c * self.heavy_share) < 1:
            c += 1
        return c

    def budget_reason(self) -> str:
        return "at least one recent token after the heavy hitters"

    def select(self, layer, attn, state):
        new = group_reduce(attn.float().sum(2), state.groups, "sum")  # (B, H_kv, T): this forward's column sums
        acc = state.scratch.get("acc")
        if acc is not None:
            new[..., : acc.shape[-1]] += acc
        state.scratch["acc"] = new
        c, t = self.budget, state.length
        if t <= c:
            return None
        recent = c - self.heavy()
        keep = top_plus_recent(new[..., : t - recent], self.heavy(), t)
        state.scratch["acc"] = new.gather(-1, keep)
        return keep


@dataclass
class TOVA(Policy):
    """Token omission via attention (Oren et al., 2024): the top C entries by the last query's attention
    averaged over all query heads, the same set for every KV head; cut after every forward whose cache
    exceeds C (schwartz-lab-NLP/TOVA, src/tova_cache.py, TOVACache.reduce)."""

    name: ClassVar[str] = "tova"
    label: ClassVar[str] = "TOVA"
    colour: ClassVar[str] = "#2ca02c"
    summary: ClassVar[str] = "top C by the current query's attention, mean over heads"
    timing_source: ClassVar[str] = ("schwartz-lab-NLP/TOVA@9c7d09b src/convert_models/llama_custom.py l. 93-113: "
                                    "`attn_output` from every entry, then `past_key_value.reduce(...)`")

    def select(self, layer, attn, state):
        c, t = self.budget, state.length
        if t <= c:
            return None
        score = attn[:, :, -1, :].float().mean(1)  # (B, T)
        keep = score.topk(c, dim=-1).indices.sort(dim=-1).values
        return keep[:, None, :].expand(-1, state.positions.shape[1], -1)


for _cls in (FullCache, StreamingLLM, H2O, TOVA, SnapKV, PyramidKV, MorphKV, MorphKV8903, SnapKVPrefill,
             PyramidKVPrefill):
    POLICIES.register(_cls)

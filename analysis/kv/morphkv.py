"""MorphKV (Ghadia et al., ICML 2025): at every decode step, before the current query attends, the
queries of the most recent tokens score the older cache entries; the best older entries and the most
recent tokens stay. Two rules from ghadiaravi13/MorphKV, both selecting before the current query
attends (`morphkv/models/patch_llama.py`: `morphkv_mask` returns the mask that is added to the current
query's logits before its softmax, 36fefc7 l. 244 / 8903d2a l. 263):

- `MorphKV` (the default): the code released with the paper, `patch_llama.py` at 36fefc7 (b9e8fb6 the
  same rule two lines lower), kept verbatim at HEAD as `patch_llama copy.py`, and `patch_mistral.py`,
  `patch_qwen2.py`, `patch_phi3.py` at every commit. `WIN_SIZE` = W queries are cached per layer
  (`update_win_queries`, `morph_cache.py` l. 145-151: the last W, the current one included); the W - 1
  before the current one score the older entries (all but the last W + 1) with a softmax *per query
  head* (l. 217); the KV cache keeps, per KV head, the top `MAX_CAPACITY - W` by the *max over the
  group's query heads* of those scores, fused over the rows by max or sum (l. 218-226), plus the last
  W + 1; the current query attends, per query head, to that head's own top `MAX_CAPACITY - W` plus the
  last W + 1 (l. 229-236 and 244).
- `MorphKV8903` (a labelled variant): the Llama rule of 8903d2a (2025-06-21, HEAD), l. 235-263: the W
  queries before the current one (cached attention rows), the group's logits *summed, then one softmax*
  over the older entries, fused over the rows; the current query attends per head as above. HEAD caches
  those rows and prunes them with the per-query-head mask while the KV cache is pruned by the group's
  mask (l. 258-261, `morph_cache.py` `cleanup`), so after the first eviction a GQA model's rows no longer
  line up with the cache; we compute the rows against the entries actually cached.

Both hold `MAX_CAPACITY + 1` entries; we set `MAX_CAPACITY = C - 1` so MorphKV holds exactly C like the
others, and, as the official code does, never evict the prompt in its prefill forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from analysis.kv.base import Policy, Selection, group_reduce, top_plus_recent
from analysis.framework.settings import setting


@dataclass
class MorphKV(Policy):
    """MorphKV as released with the paper (36fefc7 / b9e8fb6): per-head softmax, then the max over the
    query heads of a KV group; W - 1 scoring queries; the last W + 1 entries kept."""

    name: ClassVar[str] = "morphkv"
    label: ClassVar[str] = "MorphKV"
    colour: ClassVar[str] = "#d62728"
    summary: ClassVar[str] = "last W + 1 tokens + top older entries by the recent queries' attention (release rule)"
    timing: ClassVar[str] = "before"
    timing_source: ClassVar[str] = ("ghadiaravi13/MorphKV@36fefc7 morphkv/models/patch_llama.py l. 317-337: "
                                    "`morphkv_mask` masks the current query's logits (l. 244) before its softmax")

    morph_window: int = setting(8, label="MorphKV window W", low=2, high=4096,
                                help="MorphKV's WIN_SIZE: the last W + 1 tokens always stay; the queries of the "
                                     "last W tokens are cached and those before the current one score the "
                                     "older entries (W - 1 of them in the released code, W in the 8903d2a variant).")
    fusion: str = setting("max", label="MorphKV fusion", choices=["max", "sum"],
                          help="How MorphKV fuses the scoring queries' rows.")

    def min_budget(self) -> int:
        return self.morph_window + 2

    def budget_reason(self) -> str:
        return f"the last W + 1 = {self.morph_window + 1} tokens plus one scored entry"

    def query_window(self) -> int:
        return self.morph_window  # update_win_queries keeps the last WIN_SIZE queries, the current one included

    def scores(self, rows: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(per KV head (B, H_kv, R, old), per query head (B, H_q, R, old)) scores of the older entries."""
        per_head = rows.softmax(-1)  # softmax over the older entries, one per query head (l. 217)
        return group_reduce(per_head, groups, "max"), per_head  # max over the group (l. 222 / 225)

    def select_before(self, layer, logits, state):
        w, t, c = self.morph_window, state.length, self.budget
        if state.phase == "prefill" or t <= c:
            return None
        old = t - (w + 1)  # [..., :-(WIN_SIZE+1)]: the last W + 1 entries always stay
        rows = logits[:, :, :-1, :old].double()  # the cached queries before the current one
        if rows.shape[2] == 0:
            return None
        per_kv, per_q = self.scores(rows, state.groups)
        keep = top_plus_recent(self.fuse(per_kv), c - w - 1, t)  # topk(MAX_CAPACITY - WIN_SIZE), MAX_CAPACITY = C - 1
        attend = top_plus_recent(self.fuse(per_q), c - w - 1, t)
        return Selection(keep=keep, attend=attend)

    def fuse(self, scores: torch.Tensor) -> torch.Tensor:
        return scores.amax(2) if self.fusion == "max" else scores.sum(2)

    def held(self, n_layers, prompt_len, length):
        return [min(length, self.budget) if length > prompt_len else prompt_len] * n_layers


@dataclass
class MorphKV8903(MorphKV):
    """The 8903d2a Llama rule: W scoring queries, the group's logits summed before one softmax."""

    name: ClassVar[str] = "morphkv_8903d2a"
    label: ClassVar[str] = "MorphKV variant (8903d2a Llama rule: group logits summed, then softmax)"
    colour: ClassVar[str] = "#e377c2"
    summary: ClassVar[str] = "HEAD's Llama rule: one softmax over the group's summed logits, W scoring queries"
    variant: ClassVar[bool] = True
    timing_source: ClassVar[str] = ("ghadiaravi13/MorphKV@8903d2a morphkv/models/patch_llama.py l. 338-341 and 263: "
                                    "the mask is added to the current query's logits before its softmax")

    def query_window(self) -> int:
        return self.morph_window + 1  # W cached rows before the current one (l. 225: cat(attn_cache, current))

    def scores(self, rows, groups):
        summed = group_reduce(rows, groups, "sum").softmax(-1)  # .view(b, key_heads, -1, q, k).sum(dim=2), softmax
        return summed, rows.softmax(-1)

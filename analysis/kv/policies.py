"""Eviction policies: one small dataclass per policy, registered in `POLICIES`.

A policy owns its settings (dataclass fields, validated in `validate()` with a message for the user)
and its identity (`name`, `label`, `colour`). The runner calls `select(layer, attn, state)` after the
attention of every forward pass of every evictable layer:

- `attn` (B, H_q, q, T): the eager attention probabilities of this forward's q queries over the T
  entries now cached (the previous step's kept entries plus this forward's new ones);
- `state.positions` (B, H_kv, T): the original position of each entry;
- the return value is the sorted keep indices (B, H_kv, K) into the cache, or None to keep everything.

So the query of a step attends to what the previous step kept plus itself, and eviction happens after
its attention, as in every official implementation cited below. The budget C is the number of entries
held per layer and KV head after eviction; every policy in the main comparison holds exactly C whenever
the context is longer than C (PyramidKV: C on average over layers). The rule of each policy, with the
official file it follows, is in docs/readme_kv.md.

Adding a policy is one registered class (see `TOVA` for the smallest one); the page, the CLI, the
budget sweep and the benchmark pick it up from `POLICIES`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from analysis.registry import Method, Registry, SettingsError
from analysis.settings import setting

POLICIES: Registry = Registry("eviction policy")


@dataclass
class LayerState:
    """What a policy sees of one layer: original positions of the cached entries and its own scratch."""

    positions: torch.Tensor  # (B, H_kv, T) long, original position of each cache entry
    phase: str  # "prefill" (the first forward) | "decode" (every later forward, one token each)
    groups: int  # query heads per KV head
    n_layers: int = 1  # decoder layers (PyramidKV sizes budgets by depth)
    scratch: dict = field(default_factory=dict)  # per-policy buffers, gathered by the policy itself

    @property
    def length(self) -> int:
        return self.positions.shape[-1]


# ---------------------------------------------------------------------------------------------
# Tensor helpers shared by the policies


def gather_kv(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """x (B, H_kv, T, ...) gathered along T by keep (B, H_kv, K)."""
    idx = keep.reshape(*keep.shape, *([1] * (x.dim() - 3))).expand(*keep.shape, *x.shape[3:])
    return x.gather(2, idx)


def gather_q(x: torch.Tensor, keep: torch.Tensor, groups: int) -> torch.Tensor:
    """x (B, H_q, R, T) per query head, gathered along T by the keep indices of each head's KV group."""
    idx = keep.repeat_interleave(groups, dim=1)[:, :, None, :].expand(-1, -1, x.shape[2], -1)
    return x.gather(3, idx)


def group_reduce(x: torch.Tensor, groups: int, how: str) -> torch.Tensor:
    """(B, H_q, ...) -> (B, H_kv, ...) by summing or taking the max over the query heads of a KV group
    (query head h belongs to KV head h // groups, as in transformers' repeat_kv)."""
    x = x.reshape(x.shape[0], x.shape[1] // groups, groups, *x.shape[2:])
    return x.sum(2) if how == "sum" else x.amax(2)


def top_plus_recent(scores: torch.Tensor, keep_top: int, length: int) -> torch.Tensor:
    """Sorted indices: the top `keep_top` of `scores` (B, H_kv, T_old) and every index from T_old on."""
    b, h, old = scores.shape
    top = scores.topk(keep_top, dim=-1).indices if keep_top > 0 else scores.new_zeros(b, h, 0, dtype=torch.long)
    recent = torch.arange(old, length, device=scores.device).expand(b, h, -1)
    return torch.cat([top, recent], dim=-1).sort(dim=-1).values


def recent_rows(state: LayerState, attn: torch.Tensor, n: int) -> torch.Tensor:
    """Attention rows (B, H_q, <=n, T) of the last n queries (earlier forwards and this one), aligned with
    the current cache: an entry cached after a query was read is 0 in that query's row."""
    rows = attn.float()[:, :, -n:]
    old = state.scratch.get("rows")
    if old is not None and rows.shape[2] < n:
        old = F.pad(old, (0, rows.shape[-1] - old.shape[-1]))
        rows = torch.cat([old, rows], dim=2)[:, :, -n:]
    return rows


def keep_rows(state: LayerState, rows: torch.Tensor, keep: torch.Tensor | None) -> None:
    """Store the rows for the next step, gathered to the entries that survive."""
    state.scratch["rows"] = rows if keep is None else gather_q(rows, keep, state.groups)


# ---------------------------------------------------------------------------------------------
# The base class


@dataclass
class Policy(Method):
    """Chooses which cache entries to keep after the attention of one forward pass."""

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    variant: ClassVar[bool] = False  # a labelled variant: shown in its own table, not in the main comparison
    grows: ClassVar[bool] = False  # holds more than C entries during decoding (prefill-only variants)

    budget: int = 64  # C, set by the analysis (KvParams.budget validates it); not a setting of its own

    def min_budget(self) -> int:
        """The smallest budget this policy's settings allow."""
        return 1

    def budget_reason(self) -> str:
        return "at least one entry"

    def validate(self) -> None:
        need = self.min_budget()
        if self.budget < need:
            raise SettingsError(f"A budget of {self.budget} is too small for {self.label}: it needs at least "
                                f"{need} entries ({self.budget_reason()}).")

    def layer_budget(self, layer: int, n_layers: int) -> int:
        return self.budget

    def select(self, layer: int, attn: torch.Tensor, state: LayerState) -> torch.Tensor | None:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# Policies


@POLICIES.register
@dataclass
class FullCache(Policy):
    name: ClassVar[str] = "full"
    label: ClassVar[str] = "Full cache"
    colour: ClassVar[str] = "#444444"
    summary: ClassVar[str] = "keeps everything (the reference)"

    def select(self, layer, attn, state):
        return None


@POLICIES.register
@dataclass
class StreamingLLM(Policy):
    """Attention sinks: the first S tokens plus the most recent C - S (Xiao et al., 2024), cut after
    every forward whose cache exceeds C (mit-han-lab/streaming-llm, kv_cache.py StartRecentKVCache)."""

    name: ClassVar[str] = "streaming_llm"
    label: ClassVar[str] = "StreamingLLM"
    colour: ClassVar[str] = "#1f77b4"
    summary: ClassVar[str] = "first S sink tokens + the last C - S"

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


@POLICIES.register
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


@POLICIES.register
@dataclass
class TOVA(Policy):
    """Token omission via attention (Oren et al., 2024): the top C entries by the last query's attention
    averaged over all query heads, the same set for every KV head; cut after every forward whose cache
    exceeds C (schwartz-lab-NLP/TOVA, src/tova_cache.py, TOVACache.reduce)."""

    name: ClassVar[str] = "tova"
    label: ClassVar[str] = "TOVA"
    colour: ClassVar[str] = "#2ca02c"
    summary: ClassVar[str] = "top C by the current query's attention, mean over heads"

    def select(self, layer, attn, state):
        c, t = self.budget, state.length
        if t <= c:
            return None
        score = attn[:, :, -1, :].float().mean(1)  # (B, T)
        keep = score.topk(c, dim=-1).indices.sort(dim=-1).values
        return keep[:, None, :].expand(-1, state.positions.shape[1], -1)


@POLICIES.register
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
        c = self.layer_budget(layer, state.n_layers)
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


@POLICIES.register
@dataclass
class PyramidKV(SnapKV):
    """SnapKV's vote with per-layer budgets shrinking linearly with depth, mean C (Cai et al., 2024):
    the first layer keeps 2C - C/beta, the last C/beta (never below w + 1). Each layer is held at its
    budget at every decode step, like SnapKV above."""

    name: ClassVar[str] = "pyramidkv"
    label: ClassVar[str] = "PyramidKV"
    colour: ClassVar[str] = "#8c564b"
    summary: ClassVar[str] = "SnapKV's vote, budgets falling with depth (mean C)"
    beta: ClassVar[int] = 20

    def layer_budget(self, layer: int, n_layers: int) -> int:
        c = self.budget
        low = max(self.snap_window + 1, round(c / self.beta))
        high = 2 * c - low
        return c if n_layers < 2 else round(high - (high - low) * layer / (n_layers - 1))


@POLICIES.register
@dataclass
class MorphKV(Policy):
    """MorphKV (Ghadia et al., ICML 2025), as ghadiaravi13/MorphKV morphkv/models/patch_llama.py
    `morphkv_mask` computes it at every decode step whose cache exceeds C:

    - the R queries before the current token score the older entries (all but the last R + 1);
    - the query heads of a KV group are combined *before* the softmax: their logits are summed, then
      softmax over the older entries, per window query;
    - the R rows are fused by max or sum; the top C - R - 1 older entries are kept, plus the last R + 1.

    The official code keeps MAX_CAPACITY - R older entries plus R + 1 recent, i.e. MAX_CAPACITY + 1; we
    set MAX_CAPACITY = C - 1 so MorphKV holds exactly C like the others. Eager attention returns
    probabilities, not logits; the sum of logits over a group equals the sum of log-probabilities up to a
    per-query constant, which the softmax cancels."""

    name: ClassVar[str] = "morphkv"
    label: ClassVar[str] = "MorphKV"
    colour: ClassVar[str] = "#d62728"
    summary: ClassVar[str] = "last R + 1 tokens + top older entries by the R previous queries' attention"

    morph_window: int = setting(8, label="MorphKV window R", low=1, high=4096,
                                help="MorphKV's recent window: the R queries before the current token score the "
                                     "older entries.")
    fusion: str = setting("max", label="MorphKV fusion", choices=["max", "sum"],
                          help="How MorphKV fuses the R window rows.")

    def min_budget(self) -> int:
        return self.morph_window + 2

    def budget_reason(self) -> str:
        return f"the last R + 1 = {self.morph_window + 1} tokens plus one scored entry"

    def select(self, layer, attn, state):
        r, t, c = self.morph_window, state.length, self.budget
        rows = recent_rows(state, attn, r + 1)  # the R queries before the current one, and the current one
        if state.phase == "prefill" or t <= c:
            keep_rows(state, rows, None)
            return None
        window = rows[:, :, :-1]  # the R queries before the current token
        old = t - (r + 1)
        logp = window[..., :old].clamp_min(torch.finfo(window.dtype).tiny).log()  # logits up to a per-row constant
        scores = group_reduce(logp, state.groups, "sum").softmax(-1)  # (B, H_kv, R, old)
        fused = scores.amax(2) if self.fusion == "max" else scores.sum(2)
        keep = top_plus_recent(fused, c - r - 1, t)
        keep_rows(state, rows, keep)
        return keep


@POLICIES.register
@dataclass
class MorphKVMaxGroup(MorphKV):
    """Our earlier reading of MorphKV, kept as a labelled variant: the last R rows *including* the current
    query, each query head's row renormalised over the older entries (all but the last R) and fused,
    then the max over the query heads of a KV group; the top C - R older entries plus the last R."""

    name: ClassVar[str] = "morphkv_maxgroup"
    label: ClassVar[str] = "MorphKV variant (max over group, window with the current row)"
    colour: ClassVar[str] = "#e377c2"
    summary: ClassVar[str] = "our earlier reading: per-head fused scores, max over the group"
    variant: ClassVar[bool] = True

    def min_budget(self) -> int:
        return self.morph_window + 1

    def budget_reason(self) -> str:
        return f"the last R = {self.morph_window} tokens plus one scored entry"

    def select(self, layer, attn, state):
        r, t, c = self.morph_window, state.length, self.budget
        rows = recent_rows(state, attn, r)
        if state.phase == "prefill" or t <= c:
            keep_rows(state, rows, None)
            return None
        distant = rows[..., : t - r]
        distant = distant / distant.sum(-1, keepdim=True).clamp_min(1e-30)
        fused = distant.sum(2) if self.fusion == "sum" else distant.amax(2)  # (B, H_q, T - R)
        keep = top_plus_recent(group_reduce(fused, state.groups, "max"), c - r, t)
        keep_rows(state, rows, keep)
        return keep


@POLICIES.register
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


@POLICIES.register
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

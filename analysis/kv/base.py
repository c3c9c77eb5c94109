"""What every eviction policy shares: the per-layer state the runner keeps, the tensor helpers, the
`Policy` base class and the `POLICIES` registry (the policies themselves: `policies.py`).

Two timings, each policy following its official code (`Policy.timing`):

- "after" (StreamingLLM, H2O, TOVA, SnapKV, PyramidKV): the current forward's queries attend to every
  entry cached so far plus their own, then the runner asks `select(layer, attn, state)` which entries
  to keep, with `attn` (B, H_q, q, T) the eager attention probabilities of this forward's q queries;
- "before" (MorphKV): at a decode step the runner first asks `select_before(layer, logits, state)`,
  with `logits` (B, H_q, n, T) the attention logits of the last n cached queries (the current one
  last) over the T entries now cached (the current token's included); the current query then attends
  only to what the selection lets it see, and the cache keeps the selection's entries.

In both, `state.positions` (B, H_kv, T) holds the original position of each entry, and a selection's
indices (sorted) point into the T entries. The budget C is the number of entries a layer and KV head
holds after a step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from analysis.framework.registry import Method, Registry, SettingsError

POLICIES: Registry = Registry("eviction policy")


@dataclass
class LayerState:
    """What a policy sees of one layer: original positions of the cached entries and its own scratch."""

    positions: torch.Tensor  # (B, H_kv, T) long, original position of each cache entry
    phase: str  # "prefill" (the first forward) | "decode" (every later forward, one token each)
    groups: int  # query heads per KV head
    n_layers: int = 1  # decoder layers (PyramidKV sizes budgets by depth)
    scratch: dict = field(default_factory=dict)  # per-policy buffers, gathered by the policy itself
    prompt_len: int = 0  # tokens of the first forward (PyramidKV's schedule reads it)

    @property
    def length(self) -> int:
        return self.positions.shape[-1]


@dataclass
class Selection:
    """A "before" policy's choice at one decode step: the entries the cache keeps (per KV head) and the
    entries the current query attends to (per query head; None: the kept ones)."""

    keep: torch.Tensor  # (B, H_kv, K) sorted indices into the T entries
    attend: torch.Tensor | None = None  # (B, H_q, K') sorted indices


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
    """Sorted indices: the top `keep_top` of `scores` (B, H, T_old) and every index from T_old on."""
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
    """Chooses which cache entries to keep, after (`select`) or before (`select_before`) the current
    query attends, as its official code does (`timing`, with the file and line in `timing_source`)."""

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    variant: ClassVar[bool] = False  # a labelled variant: shown in its own table, not in the main comparison
    grows: ClassVar[bool] = False  # holds more than C entries during decoding (prefill-only variants)
    timing: ClassVar[str] = "after"  # "after" | "before": when the selection runs relative to the query's attention
    timing_source: ClassVar[str] = ""  # where the official code shows its timing (docs/readme_kv.md)

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

    def layer_budget(self, layer: int, n_layers: int, prompt_len: int) -> int:
        """Entries this layer holds once its cache is longer (PyramidKV: by depth and prompt length)."""
        return self.budget

    def query_window(self) -> int:
        """Queries a "before" policy reads (the current one included); 0 for "after" policies."""
        return 0

    def select(self, layer: int, attn: torch.Tensor, state: LayerState) -> torch.Tensor | None:
        """"after" policies: the sorted keep indices (B, H_kv, K), or None to keep everything."""
        raise NotImplementedError

    def select_before(self, layer: int, logits: torch.Tensor, state: LayerState) -> Selection | None:
        """"before" policies, at a decode step: what to keep and what the current query sees (None: all)."""
        raise NotImplementedError

    def held(self, n_layers: int, prompt_len: int, length: int) -> list[int]:
        """Entries each layer holds once `length` tokens are read (the prompt's `prompt_len` in one
        forward): what the quality tables claim, checked against the measured cache in the tests."""
        return [min(length, self.budget)] * n_layers

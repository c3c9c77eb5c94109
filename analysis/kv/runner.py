"""The runner: one manual decode loop with the eviction in the attention itself; the only code that
touches the model.

One attention function, registered once with transformers' `AttentionInterface` under `ATTENTION_NAME`,
is switched on inside `handle.patch()` (the config's `_attn_implementation` swapped and restored). For
each evictable layer it computes the model's own eager attention and, at the moment the policy's
official code does (`Policy.timing`, base.py), asks the policy which cache entries to keep: "after"
policies see this forward's attention probabilities; "before" policies (MorphKV) see the logits of their
cached queries, and the current query then attends only to what they let it see. The runner gathers
`cache.layers[l].keys/values` and a parallel tensor of original positions. Manual decoding passes
absolute `position_ids`, so RoPE and learned position embeddings stay right after entries vanish (keys
are cached post-RoPE).

Conventions: batch 1; a budget C is the number of entries kept per layer and KV head. Every policy of the
main comparison holds exactly C from the moment the context exceeds C (StreamingLLM, H2O, TOVA and SnapKV
cut after the prefill forward as their official code does, MorphKV at the first decode step as its code
does, and all of them at every later step; PyramidKV holds its official per-layer schedule); the
prefill-only SnapKV/PyramidKV variants grow after the prefill. Sliding-window layers are never evicted.
"""
from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from analysis.model_access.anatomy import attention_modules, head_layout
from analysis.kv.base import LayerState, Policy, Selection, gather_kv
from analysis.kv.params import KvEvictionError
from analysis.model_access.models import ModelHandle
from analysis.framework.progress import Progress

ATTENTION_NAME = "model_inspector_kv_eviction"
BOUND = "_model_inspector_kv_evictor"  # the attribute a patch sets on each evictable attention module


@dataclass
class Trace:
    """Raw outcome of one run (tensors; not serialised)."""

    tokens: list[int]
    prompt_len: int
    logits: torch.Tensor  # (N - P, V) on the CPU: predictions for tokens[P:]
    kept: list[list[torch.Tensor | None]]  # [decode step][layer] -> (H_kv, K) positions after eviction
    prefill_kept: list[torch.Tensor | None]  # [layer] after the prefill forward
    cache_len: list[list[int]]  # [decode step][layer]
    cache_bytes: list[int]  # [decode step] measured
    analytic_bytes: list[int]  # [decode step] 2 * sum_l H_kv * d * T_l * bytes
    step_time: list[float]  # [decode step] seconds
    attention: list[list[torch.Tensor]] | None = None  # [decode step][layer] -> (H_q, T) last-query row
    cache: object = None  # the final DynamicCache (for inspection in tests)
    forked: list[int] | None = None  # tokens[:fork_at] + the greedy continuation from there (see run_policy)
    timing: str = "after"  # the policy's: "before" means a step's query saw that step's kept set
    layer_bytes: list[list[int]] | None = None  # [decode step][layer] measured (sliding-window layers apart)


def _new_cache(lm: torch.nn.Module):
    from transformers import DynamicCache

    return DynamicCache(config=lm.config)


def evictable_layers(handle: ModelHandle) -> list[int]:
    """Layers whose cache a policy may shrink; raises KvEvictionError when there are none."""
    from transformers.cache_utils import DynamicLayer

    lm = handle.language_model
    modules = attention_modules(lm)
    if not modules:
        raise KvEvictionError(
            f"{handle.spec.label} has no attention modules this panel recognises, so its cache cannot be evicted."
        )
    cache = _new_cache(lm)
    if len(cache.layers) < len(modules):
        return sorted(modules)  # lazily built cache: plain dynamic layers
    layers = [i for i in sorted(modules) if type(cache.layers[i]) is DynamicLayer]
    if not layers:
        raise KvEvictionError(
            f"{handle.spec.label} cannot be evicted: every layer's cache is sliding-window (already bounded) "
            "or not a plain key-value cache, and sliding-window layers are never evicted."
        )
    return layers


# ---------------------------------------------------------------------------------------------
# The attention function


def register_attention() -> None:
    """Register the attention function (and the eager mask it needs) under `ATTENTION_NAME`; nothing
    uses it until a patch switches a model's config to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTENTION_NAME, kv_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, eager_mask)  # without it transformers builds no mask


def _plain_eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention for a modeling file without its own `eager_attention_forward`."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    probs = scores.softmax(-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def _eager_of(module: torch.nn.Module) -> Callable:
    """The model's own eager attention (its modeling file's `eager_attention_forward`)."""
    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None) or _plain_eager


def kv_attention(module, query, key, value, attention_mask, **kwargs):
    eager = _eager_of(module)
    bound = module.__dict__.get(BOUND)
    if bound is None:  # a layer that is not evicted (sliding window)
        return eager(module, query, key, value, attention_mask, **kwargs)
    evictor, layer = bound
    return evictor.attend(layer, module, eager, query, key, value, attention_mask, kwargs)


# ---------------------------------------------------------------------------------------------
# One run's eviction state


class Evictor:
    """The eviction of one run: per layer, the entries' original positions, the policy's state and the
    cached queries of a "before" policy; applied inside the attention function."""

    def __init__(self, handle: ModelHandle, policy: Policy, cache, record_attention: bool) -> None:
        self.policy, self.cache, self.record = policy, cache, record_attention
        self.modules = attention_modules(handle.language_model)
        layout = head_layout(handle)
        self.n_kv, self.groups = layout.kv_heads, layout.groups
        self.states: dict[int, LayerState] = {}
        self.phase = "prefill"
        self.start = 0  # original position of the first token of the current forward
        self.attention: list[torch.Tensor | None] = [None] * len(self.modules)  # last query's row, per layer
        self.queries = policy.query_window()

    def attach(self, patch, layers: list[int]) -> None:
        register_attention()
        for layer in layers:
            patch.setattr(self.modules[layer], BOUND, (self, layer))

    def check_attached(self, handle: ModelHandle, layers: list[int]) -> None:
        missing = [layer for layer in layers if layer not in self.states]
        if missing:
            raise KvEvictionError(
                f"{handle.spec.label} does not compute attention through transformers' attention interface "
                f"(layers {missing[:5]} never called it), so its cache cannot be evicted here.")

    def _state(self, layer: int, n_new: int, device) -> LayerState:
        new_pos = torch.arange(self.start, self.start + n_new, device=device).expand(1, self.n_kv, -1)
        state = self.states.get(layer)
        if state is None:
            state = self.states[layer] = LayerState(positions=new_pos.clone(), phase=self.phase, groups=self.groups,
                                                    n_layers=len(self.modules), prompt_len=n_new)
        else:
            state.positions = torch.cat([state.positions, new_pos], dim=-1)
            state.phase = self.phase
        return state

    def attend(self, layer, module, eager, query, key, value, mask, kwargs):
        state = self._state(layer, query.shape[2], query.device)
        selection = None
        if self.queries:  # a "before" policy: its cached queries, the current one last
            old = state.scratch.get("queries")
            q = query if old is None else torch.cat([old, query], dim=2)
            state.scratch["queries"] = q[:, :, -self.queries:]
        if self.phase == "decode":
            mask = None  # one query over entries all in its past: nothing to mask
            if self.policy.timing == "before":
                selection = self.policy.select_before(layer, self._window_logits(state, key, kwargs), state)
                if selection is not None:
                    mask = self._attend_mask(selection, key.shape[2], query)
        out, weights = eager(module, query, key, value, mask, **kwargs)
        if self.record:
            self.attention[layer] = weights[0, :, -1, :].float().cpu()
        if selection is not None:
            keep = selection.keep
        elif self.policy.timing == "after":
            keep = self.policy.select(layer, weights, state)
        else:
            keep = None
        if keep is not None:
            cached = self.cache.layers[layer]
            cached.keys = gather_kv(cached.keys, keep)
            cached.values = gather_kv(cached.values, keep)
            state.positions = state.positions.gather(-1, keep)
        return out, weights

    def _window_logits(self, state: LayerState, key: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """(B, H_q, n, T) attention logits of the cached queries over the entries now cached."""
        q = state.scratch["queries"].float()
        b, hq, n, d = q.shape
        scaling = kwargs.get("scaling")
        scaling = d ** -0.5 if scaling is None else scaling
        logits = torch.matmul(q.view(b, self.n_kv, self.groups, n, d), key.float()[:, :, None].transpose(-1, -2))
        logits = logits.view(b, hq, n, -1) * scaling
        softcap = kwargs.get("softcap")
        return torch.tanh(logits / softcap) * softcap if softcap else logits

    def _attend_mask(self, selection: Selection, length: int, query: torch.Tensor) -> torch.Tensor:
        """Additive mask (B, H_q, 1, T): 0 on the entries each query head may see, the dtype's minimum elsewhere."""
        attend = selection.attend
        if attend is None:
            attend = selection.keep.repeat_interleave(self.groups, dim=1)
        mask = torch.full((*attend.shape[:2], 1, length), torch.finfo(query.dtype).min, dtype=query.dtype,
                          device=query.device)
        return mask.scatter_(-1, attend[:, :, None, :], 0.0)

    def kept(self) -> list[torch.Tensor | None]:
        """[layer] -> (H_kv, K) original positions now cached (None: a layer that is not evicted)."""
        return [self.states[i].positions[0].cpu() if i in self.states else None for i in range(len(self.modules))]

    def fork(self) -> dict:
        return {"cache": copy.deepcopy(self.cache), "states": copy.deepcopy(self.states)}

    def resume(self, fork: dict) -> None:
        self.cache, self.states = fork["cache"], fork["states"]


# ---------------------------------------------------------------------------------------------
# The decode loop


def _step(lm, evictor: Evictor, token: int, pos: int, device) -> torch.Tensor:
    """One decode forward of `token` at absolute position `pos`; its next-token logits."""
    evictor.start = pos
    out = lm(input_ids=torch.tensor([[token]], device=device), position_ids=torch.tensor([[pos]], device=device),
             cache=evictor.cache, use_cache=True)
    return out.logits[0, -1].float()


def run_policy(handle: ModelHandle, tokens: list[int], prompt_len: int, policy: Policy, *,
               generate: int = 0, record_attention: bool = False, progress: Progress | None = None,
               fork_at: int | None = None, fork_generate: int = 0, stop_at: int | None = None) -> Trace:
    """Prefill tokens[:prompt_len], decode the rest of `tokens` one at a time (teacher forcing), then
    `generate` more tokens greedily (ending early after the token `stop_at`, e.g. end-of-text). Batch 1.

    With `fork_at` (prompt_len <= fork_at < len(tokens), `fork_generate` >= 1), the run also keeps the
    cache and the policy's state as they are once tokens[:fork_at] have been read and, after the
    teacher-forced pass, continues from there greedily: Trace.forked holds the same tokens as
    run_policy(handle, tokens[:fork_at], prompt_len, policy, generate=fork_generate).tokens (the same
    forwards on the same inputs), without reading the shared prefix a second time."""
    lm, device = handle.language_model, handle.device
    evictor = Evictor(handle, policy, _new_cache(lm), record_attention)
    if fork_at is not None and not (prompt_len <= fork_at < len(tokens) and fork_generate >= 1):
        fork_at = None  # nothing to share: the caller runs the continuation on its own
    seq, fork, logits = list(tokens), {}, []
    record = _Record(handle, lm)
    layers = evictable_layers(handle)
    # inference mode, not just no_grad: no version counters or view tracking on each of the ~1,000
    # small forwards of an analysis (the H2O link's analysis: 2.23 -> 1.96 s on one thread)
    with handle.patch() as p, torch.inference_mode():
        p.attn_implementation(lm, ATTENTION_NAME)
        evictor.attach(p, layers)
        out = lm(input_ids=torch.tensor([seq[:prompt_len]], device=device),
                 position_ids=torch.arange(prompt_len, device=device)[None], cache=evictor.cache, use_cache=True,
                 logits_to_keep=1)
        evictor.check_attached(handle, layers)
        logits.append(out.logits[0, -1].float())
        prefill_kept = evictor.kept()
        evictor.phase = "decode"
        if fork_at == prompt_len:  # tokens[:fork_at] read: the continuation starts from here
            fork = {**evictor.fork(), "first": int(logits[-1].argmax())}
        target_len = len(seq) + generate
        if len(seq) == prompt_len and generate:
            seq.append(int(logits[-1].argmax()))
        for pos in range(prompt_len, target_len - 1):
            if stop_at is not None and pos >= len(tokens) and seq[pos] == stop_at:
                break  # the generated text ended
            p.checkpoint()  # other users waiting for the model go first, between decode steps
            t0 = time.perf_counter()
            logits.append(_step(lm, evictor, seq[pos], pos, device))
            record.step(evictor, time.perf_counter() - t0)
            if pos + 1 == len(seq) and len(seq) < target_len:
                seq.append(int(logits[-1].argmax()))
            if progress:
                done = pos + 1 - prompt_len
                progress(done / max(1, target_len - 1 - prompt_len), f"{policy.label}: step {done}")
            if pos + 1 == fork_at:
                fork = {**evictor.fork(), "first": int(logits[-1].argmax())}
        cache, forked = evictor.cache, None
        if fork:  # the continuation, on the state kept at fork_at (the teacher-forced pass is done)
            evictor.resume(fork)
            forked = list(tokens[:fork_at]) + [fork["first"]]
            for pos in range(fork_at, fork_at + fork_generate - 1):
                p.checkpoint()
                forked.append(int(_step(lm, evictor, forked[pos], pos, device).argmax()))
    n_pred = len(seq) - prompt_len
    return Trace(tokens=seq, prompt_len=prompt_len, logits=torch.stack(logits[:n_pred]).cpu(), kept=record.kept,
                 prefill_kept=prefill_kept, cache_len=record.cache_len, cache_bytes=record.cache_bytes,
                 analytic_bytes=record.analytic, step_time=record.step_time,
                 attention=record.attention if record_attention else None, cache=cache, forked=forked,
                 timing=policy.timing, layer_bytes=record.layer_bytes)


class _Record:
    """What each decode step leaves behind: kept positions, cache lengths and bytes, time, attention rows."""

    def __init__(self, handle: ModelHandle, lm) -> None:
        bytes_per = torch.finfo(next(lm.parameters()).dtype).bits // 8
        self.per_entry = 2 * handle.info.kv_heads * handle.info.head_dim * bytes_per
        self.kept, self.cache_len, self.cache_bytes, self.analytic, self.step_time = [], [], [], [], []
        self.layer_bytes: list[list[int]] = []
        self.attention: list[list[torch.Tensor | None]] = []

    def step(self, evictor: Evictor, seconds: float) -> None:
        cache = evictor.cache
        self.step_time.append(seconds)
        self.kept.append(evictor.kept())
        lens = [c.get_seq_length() for c in cache.layers]
        self.cache_len.append(lens)
        self.layer_bytes.append([c.keys.nbytes + c.values.nbytes if c.is_initialized else 0 for c in cache.layers])
        self.cache_bytes.append(sum(self.layer_bytes[-1]))
        self.analytic.append(self.per_entry * sum(lens))
        if evictor.record:
            self.attention.append(list(evictor.attention))

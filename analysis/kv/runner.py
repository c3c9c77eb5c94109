"""The runner: one manual decode loop with the eviction hooks; the only code that touches the model.

A forward hook on every attention module sees the eager attention probabilities of the current forward,
asks the policy which cache entries to keep, and index-gathers `cache.layers[l].keys/values` plus a
parallel tensor of original positions. Manual decoding passes absolute `position_ids`, so RoPE and learned
position embeddings stay right after entries vanish (keys are cached post-RoPE).

Conventions: batch 1; a budget C is the number of entries kept per layer and KV head; eviction happens
after the attention of a forward, so the query of a step still sees what the previous step kept plus
itself. Every policy of the main comparison holds exactly C from the moment the context exceeds C
(StreamingLLM, H2O, TOVA and SnapKV cut after the prefill forward as their official code does, MorphKV at
the first decode step as its code does, and all of them after every later step); the prefill-only
SnapKV/PyramidKV variants grow after the prefill. Sliding-window layers are never evicted.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Callable

import torch

from analysis.anatomy import attention_modules
from analysis.kv.params import KvEvictionError
from analysis.kv.policies import LayerState, Policy, gather_kv
from analysis.models import ModelHandle

Progress = Callable[[float, str], None]


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


class Evictor:
    """The hooks of one run: after each attention forward of an evictable layer, ask the policy which
    entries to keep and gather the cache (and the entries' original positions) to them."""

    def __init__(self, handle: ModelHandle, policy: Policy, cache, record_attention: bool) -> None:
        self.policy, self.cache, self.record = policy, cache, record_attention
        self.modules = attention_modules(handle.language_model)
        self.n_kv, self.groups = handle.info.kv_heads, handle.info.heads // handle.info.kv_heads
        self.states: dict[int, LayerState] = {}
        self.phase = "prefill"
        self.start = 0  # original position of the first token of the current forward
        self.attention: list[torch.Tensor | None] = [None] * len(self.modules)  # last query's row, per layer

    def attach(self, patch, layers: list[int]) -> None:
        for layer in layers:
            patch.hook(self.modules[layer], self.pre_hook, pre=True, with_kwargs=True)
            patch.hook(self.modules[layer], self.post_hook(layer), with_kwargs=True)

    def pre_hook(self, module, args, kwargs):
        if self.phase == "decode":
            kwargs["attention_mask"] = None  # one query over entries all in its past: nothing to mask
        return args, kwargs

    def post_hook(self, layer: int):
        def hook(module, args, kwargs, output):
            attn = output[1]
            if attn is None:
                raise KvEvictionError("The attention module returned no probabilities (eager attention is required).")
            new_pos = torch.arange(self.start, self.start + attn.shape[2], device=attn.device).expand(1, self.n_kv, -1)
            state = self.states.get(layer)
            if state is None:
                state = self.states[layer] = LayerState(positions=new_pos.clone(), phase=self.phase,
                                                        groups=self.groups, n_layers=len(self.modules))
            else:
                state.positions = torch.cat([state.positions, new_pos], dim=-1)
                state.phase = self.phase
            if self.record:
                self.attention[layer] = attn[0, :, -1, :].float().cpu()
            keep = self.policy.select(layer, attn, state)
            if keep is not None:
                cached = self.cache.layers[layer]
                cached.keys = gather_kv(cached.keys, keep)
                cached.values = gather_kv(cached.values, keep)
                state.positions = state.positions.gather(-1, keep)
        return hook

    def kept(self) -> list[torch.Tensor | None]:
        """[layer] -> (H_kv, K) original positions now cached (None: a layer that is not evicted)."""
        return [self.states[i].positions[0].cpu() if i in self.states else None for i in range(len(self.modules))]

    def fork(self) -> dict:
        return {"cache": copy.deepcopy(self.cache), "states": copy.deepcopy(self.states)}

    def resume(self, fork: dict) -> None:
        self.cache, self.states = fork["cache"], fork["states"]


def _step(lm, evictor: Evictor, token: int, pos: int, device) -> torch.Tensor:
    """One decode forward of `token` at absolute position `pos`; its next-token logits."""
    evictor.start = pos
    out = lm(input_ids=torch.tensor([[token]], device=device), position_ids=torch.tensor([[pos]], device=device),
             cache=evictor.cache, use_cache=True)
    return out.logits[0, -1].float()


def run_policy(handle: ModelHandle, tokens: list[int], prompt_len: int, policy: Policy, *,
               generate: int = 0, record_attention: bool = False, progress: Progress | None = None,
               fork_at: int | None = None, fork_generate: int = 0) -> Trace:
    """Prefill tokens[:prompt_len], decode the rest of `tokens` one at a time (teacher forcing), then
    `generate` more tokens greedily. Batch 1.

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
    # inference mode, not just no_grad: no version counters or view tracking on each of the ~1,000
    # small forwards of an analysis (the H2O link's analysis: 2.23 -> 1.96 s on one thread)
    with handle.patch() as p, torch.inference_mode():
        p.attn_implementation(lm, "eager")
        evictor.attach(p, evictable_layers(handle))
        out = lm(input_ids=torch.tensor([seq[:prompt_len]], device=device),
                 position_ids=torch.arange(prompt_len, device=device)[None], cache=evictor.cache, use_cache=True,
                 logits_to_keep=1)
        logits.append(out.logits[0, -1].float())
        prefill_kept = evictor.kept()
        evictor.phase = "decode"
        if fork_at == prompt_len:  # tokens[:fork_at] read: the continuation starts from here
            fork = {**evictor.fork(), "first": int(logits[-1].argmax())}
        target_len = len(seq) + generate
        if len(seq) == prompt_len and generate:
            seq.append(int(logits[-1].argmax()))
        for pos in range(prompt_len, target_len - 1):
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
                 attention=record.attention if record_attention else None, cache=cache, forked=forked)


class _Record:
    """What each decode step leaves behind: kept positions, cache lengths and bytes, time, attention rows."""

    def __init__(self, handle: ModelHandle, lm) -> None:
        bytes_per = torch.finfo(next(lm.parameters()).dtype).bits // 8
        self.per_entry = 2 * handle.info.kv_heads * handle.info.head_dim * bytes_per
        self.kept, self.cache_len, self.cache_bytes, self.analytic, self.step_time = [], [], [], [], []
        self.attention: list[list[torch.Tensor | None]] = []

    def step(self, evictor: Evictor, seconds: float) -> None:
        cache = evictor.cache
        self.step_time.append(seconds)
        self.kept.append(evictor.kept())
        lens = [c.get_seq_length() for c in cache.layers]
        self.cache_len.append(lens)
        self.cache_bytes.append(sum(c.keys.nbytes + c.values.nbytes for c in cache.layers if c.is_initialized))
        self.analytic.append(self.per_entry * sum(lens))
        if evictor.record:
            self.attention.append(list(evictor.attention))

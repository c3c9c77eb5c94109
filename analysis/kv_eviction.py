"""KV-cache eviction: which cached tokens each policy keeps, and what that costs.

Policies are small classes behind one interface, `select(layer, attn, state) -> keep | None`, looked
up by a stable name in `POLICIES`. The runner that touches the model (`run_policy`) exists once: a
forward hook on every attention module sees the eager attention probabilities of the current forward,
asks the policy which cache entries to keep, and index-gathers `cache.layers[l].keys/values` plus a
parallel tensor of original positions. Manual decoding passes absolute `position_ids`, so RoPE and
learned position embeddings stay right after entries vanish (keys are cached post-RoPE).

Conventions: batch 1; a budget C is the number of entries kept per layer and KV head; eviction
happens after the attention of a forward, so the query of a step still sees what the previous step
kept plus itself. Decode-time policies (StreamingLLM, H2O, TOVA, MorphKV) cut the prompt in one go at
the first decode step and then stay at exactly C; SnapKV cuts at the end of prefill and then grows.
Sliding-window layers are never evicted.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch
import torch.nn.functional as F

from analysis.anatomy import attention_modules
from analysis.models import ModelHandle, ModelLoadError
from analysis.results import Result
from analysis.tasks import tasks_for

Progress = Callable[[float, str], None]


class KvEvictionError(ModelLoadError):
    """Bad parameters or a model whose cache cannot be evicted; the message is for the user."""


# ---------------------------------------------------------------------------------------------
# Parameters


@dataclass
class KvParams(Result):
    policy: str = "morphkv"
    budget: int = 64  # C: cache entries kept per layer and KV head
    sinks: int = 4  # StreamingLLM: first S tokens always kept
    window: int = 8  # H2O recent tokens, SnapKV observation window, MorphKV R
    kernel: int = 5  # SnapKV pooling kernel (odd)
    fusion: str = "max"  # MorphKV: fuse the R renormalised rows by "sum" or "max"
    prompt: str = ""  # empty: the built-in key-value recall task
    new_tokens: int = 24  # tokens generated after a custom prompt (and for the text comparison)
    seed: int = 0  # key-value task sample
    pairs: int = 2  # key-value task: needles (key/value pairs) in the context
    queries: int = 1  # key-value task: needles asked after the context
    prefill: float = 0.5  # share of the context prefilled in one forward; the rest is decoded token by token
    examples: int = 1  # budget sweep: key-value prompts averaged (seeds seed, seed+1, ...)
    context: int = 192  # key-value task: context length in tokens
    sweep: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75])  # budgets, share of context


# ---------------------------------------------------------------------------------------------
# Policies: one interface, one registry


@dataclass
class LayerState:
    """What a policy sees of one layer: original positions of the cached entries and its own scratch."""

    positions: torch.Tensor  # (B, H_kv, T) long, original position of each cache entry
    phase: str  # "prefill" | "decode"
    groups: int  # query heads per KV head
    n_layers: int = 1  # decoder layers (PyramidKV sizes budgets by depth)
    scratch: dict = field(default_factory=dict)  # per-policy buffers, gathered by the policy itself

    @property
    def length(self) -> int:
        return self.positions.shape[-1]


def gather_kv(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """x (B, H_kv, T, ...) gathered along T by keep (B, H_kv, K)."""
    idx = keep.reshape(*keep.shape, *([1] * (x.dim() - 3))).expand(*keep.shape, *x.shape[3:])
    return x.gather(2, idx)


def gather_q(x: torch.Tensor, keep: torch.Tensor, groups: int) -> torch.Tensor:
    """x (B, H_q, R, T) per query head, gathered along T by the keep indices of each head's KV group."""
    idx = keep.repeat_interleave(groups, dim=1)[:, :, None, :].expand(-1, -1, x.shape[2], -1)
    return x.gather(3, idx)


def group_reduce(x: torch.Tensor, groups: int, how: str) -> torch.Tensor:
    """(B, H_q, T) -> (B, H_kv, T) by summing or taking the max over the query heads of a group."""
    b, h, t = x.shape
    x = x.reshape(b, h // groups, groups, t)
    return x.sum(2) if how == "sum" else x.amax(2)


def top_plus_recent(scores: torch.Tensor, keep_top: int, length: int) -> torch.Tensor:
    """Sorted indices: the top `keep_top` of `scores` (B, H_kv, T_old) and every index from T_old on."""
    b, h, old = scores.shape
    top = scores.topk(keep_top, dim=-1).indices if keep_top > 0 else scores.new_zeros(b, h, 0, dtype=torch.long)
    recent = torch.arange(old, length, device=scores.device).expand(b, h, -1)
    return torch.cat([top, recent], dim=-1).sort(dim=-1).values


class Policy:
    """Chooses which cache entries to keep after the attention of one forward pass."""

    name: ClassVar[str]
    label: ClassVar[str]

    def __init__(self, params: KvParams) -> None:
        self.p = params

    def min_budget(self) -> int:
        return 1

    def select(self, layer: int, attn: torch.Tensor, state: LayerState) -> torch.Tensor | None:
        """attn (B, H_q, q, T): probabilities of this forward's queries over the current cache.
        Returns keep indices (B, H_kv, K) into the cache, or None to keep everything."""
        raise NotImplementedError


POLICIES: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    POLICIES[cls.name] = cls
    return cls


@register
class FullCache(Policy):
    name, label = "full", "Full cache"

    def select(self, layer, attn, state):
        return None


@register
class StreamingLLM(Policy):
    """Attention sinks: the first S tokens plus the most recent C - S (Xiao et al., 2024)."""

    name, label = "streaming_llm", "StreamingLLM"

    def min_budget(self) -> int:
        return self.p.sinks + 1

    def select(self, layer, attn, state):
        c, t = self.p.budget, state.length
        if state.phase == "prefill" or t <= c:
            return None
        b, h = state.positions.shape[:2]
        idx = torch.cat([torch.arange(self.p.sinks), torch.arange(t - (c - self.p.sinks), t)])
        return idx.to(attn.device).expand(b, h, -1)


@register
class H2O(Policy):
    """Heavy hitters: attention accumulated over every query seen, plus a recent window (Zhang et al., 2023)."""

    name, label = "h2o", "H2O"

    def min_budget(self) -> int:
        return self.p.window + 1

    def select(self, layer, attn, state):
        new = group_reduce(attn.float().sum(2), state.groups, "sum")  # (B, H_kv, T)
        acc = state.scratch.get("acc")
        if acc is not None:
            new[..., : acc.shape[-1]] += acc
        state.scratch["acc"] = new
        c, t = self.p.budget, state.length
        if state.phase == "prefill" or t <= c:
            return None
        keep = top_plus_recent(new[..., : t - self.p.window], c - self.p.window, t)
        state.scratch["acc"] = new.gather(-1, keep)
        return keep


@register
class TOVA(Policy):
    """Token omission via attention: top C by the last query's attention averaged over all heads (Oren et al., 2024)."""

    name, label = "tova", "TOVA"

    def select(self, layer, attn, state):
        c, t = self.p.budget, state.length
        if state.phase == "prefill" or t <= c:
            return None
        score = attn[:, :, -1, :].float().mean(1)  # (B, T)
        keep = score.topk(c, dim=-1).indices.sort(dim=-1).values
        return keep[:, None, :].expand(-1, state.positions.shape[1], -1)


@register
class SnapKV(Policy):
    """Prompt compression once at prefill: the last w queries vote, scores are pooled (Li et al., 2024)."""

    name, label = "snapkv", "SnapKV"

    def min_budget(self) -> int:
        return self.p.window + 1

    def select(self, layer, attn, state):
        return self.snap(attn, state, self.p.budget)

    def snap(self, attn, state, c: int):
        t, w = state.length, self.p.window
        if state.phase != "prefill" or t <= c:
            return None  # decoding then grows the cache
        votes = attn[:, :, -w:, : t - w].float().sum(2)  # (B, H_q, T - w)
        votes = group_reduce(votes, state.groups, "sum")
        k = self.p.kernel
        pooled = F.avg_pool1d(votes.flatten(0, 1)[:, None], k, stride=1, padding=k // 2)[:, 0]
        return top_plus_recent(pooled.reshape(votes.shape), c - w, t)


@register
class PyramidKV(SnapKV):
    """SnapKV's prefill vote with per-layer budgets shrinking linearly with depth, mean C (Cai et al., 2024):
    the first layer keeps 2C - C/beta, the last C/beta (never below window + 1)."""

    name, label = "pyramidkv", "PyramidKV"
    beta: ClassVar[int] = 20

    def layer_budget(self, layer: int, n_layers: int) -> int:
        c = self.p.budget
        low = max(self.p.window + 1, round(c / self.beta))
        high = 2 * c - low
        return c if n_layers < 2 else round(high - (high - low) * layer / (n_layers - 1))

    def select(self, layer, attn, state):
        return self.snap(attn, state, self.layer_budget(layer, state.n_layers))


@register
class MorphKV(Policy):
    """MorphKV (ICML 2025): keep the last R; score older tokens by the last R queries' attention,
    renormalised over the older tokens only, fused by sum or max over the R rows, max over the query
    heads of a KV group; keep the top C - R per KV head. Evicts every decode step, so the cache stays at C."""

    name, label = "morphkv", "MorphKV"

    def min_budget(self) -> int:
        return self.p.window + 1

    def select(self, layer, attn, state):
        r = self.p.window
        rows = attn[:, :, -r:, :].float()  # (B, H_q, q', T)
        old = state.scratch.get("rows")
        if old is not None:  # earlier rows never saw the newer entries: zero there
            old = F.pad(old, (0, rows.shape[-1] - old.shape[-1]))
            rows = torch.cat([old, rows], dim=2)[:, :, -r:]
        state.scratch["rows"] = rows
        c, t = self.p.budget, state.length
        if state.phase == "prefill" or t <= c:
            return None
        distant = rows[..., : t - r]
        distant = distant / distant.sum(-1, keepdim=True).clamp_min(1e-30)
        fused = distant.sum(2) if self.p.fusion == "sum" else distant.amax(2)  # (B, H_q, T - R)
        keep = top_plus_recent(group_reduce(fused, state.groups, "max"), c - r, t)
        state.scratch["rows"] = gather_q(rows, keep, state.groups)
        return keep


def make_policy(params: KvParams) -> Policy:
    if params.policy not in POLICIES:
        raise KvEvictionError(f"Unknown policy '{params.policy}' (choose one of {', '.join(POLICIES)}).")
    if params.fusion not in ("sum", "max"):
        raise KvEvictionError(f"MorphKV fusion must be 'sum' or 'max', not '{params.fusion}'.")
    if params.kernel < 1 or params.kernel % 2 == 0:
        raise KvEvictionError("The SnapKV pooling kernel must be a positive odd number.")
    policy = POLICIES[params.policy](params)
    if params.policy != "full" and params.budget < policy.min_budget():
        raise KvEvictionError(
            f"A budget of {params.budget} is too small for {policy.label}: it needs at least "
            f"{policy.min_budget()} entries (window / sinks plus one)."
        )
    return policy


# ---------------------------------------------------------------------------------------------
# The runner: one manual decode loop with the eviction hooks


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


def run_policy(handle: ModelHandle, tokens: list[int], prompt_len: int, policy: Policy, *,
               generate: int = 0, record_attention: bool = False, progress: Progress | None = None) -> Trace:
    """Prefill tokens[:prompt_len], decode the rest of `tokens` one at a time (teacher forcing), then
    `generate` more tokens greedily. Batch 1."""
    lm = handle.language_model
    modules = attention_modules(lm)
    layers = evictable_layers(handle)
    device = handle.device
    n_heads, n_kv = handle.info.heads, handle.info.kv_heads
    states: dict[int, LayerState] = {}
    cache = _new_cache(lm)
    phase = {"now": "prefill"}
    step_pos = {"start": 0}  # original position of the first token of the current forward
    attention_log: list[torch.Tensor | None] = [None] * len(modules)

    def pre_hook(module, args, kwargs):
        if phase["now"] == "decode":
            kwargs["attention_mask"] = None  # one query over entries all in its past: nothing to mask
        return args, kwargs

    def post_hook(layer: int):
        def hook(module, args, kwargs, output):
            attn = output[1]
            if attn is None:
                raise KvEvictionError("The attention module returned no probabilities (eager attention is required).")
            cached = cache.layers[layer]
            q = attn.shape[2]
            new_pos = torch.arange(step_pos["start"], step_pos["start"] + q, device=attn.device)
            state = states.get(layer)
            if state is None:
                state = states[layer] = LayerState(
                    positions=new_pos.expand(1, n_kv, -1).clone(), phase=phase["now"], groups=n_heads // n_kv,
                    n_layers=len(modules))
            else:
                state.positions = torch.cat([state.positions, new_pos.expand(1, n_kv, -1)], dim=-1)
                state.phase = phase["now"]
            if record_attention:
                attention_log[layer] = attn[0, :, -1, :].float().cpu()
            keep = policy.select(layer, attn, state)
            if keep is not None:
                cached.keys = gather_kv(cached.keys, keep)
                cached.values = gather_kv(cached.values, keep)
                state.positions = state.positions.gather(-1, keep)
        return hook

    seq = list(tokens)
    kept, cache_len, cache_bytes, analytic, step_time, attn_rows, logits = [], [], [], [], [], [], []
    bytes_per = torch.finfo(next(lm.parameters()).dtype).bits // 8
    with handle.patch() as p, torch.no_grad():
        p.attn_implementation(lm, "eager")
        for layer in layers:
            p.hook(modules[layer], pre_hook, pre=True, with_kwargs=True)
            p.hook(modules[layer], post_hook(layer), with_kwargs=True)
        ids = torch.tensor([seq[:prompt_len]], device=device)
        out = lm(input_ids=ids, position_ids=torch.arange(prompt_len, device=device)[None], cache=cache,
                 use_cache=True, logits_to_keep=1)
        logits.append(out.logits[0, -1].float())
        prefill_kept = [states[i].positions[0].cpu() if i in states else None for i in range(len(modules))]
        phase["now"] = "decode"
        target_len = len(seq) + generate
        if len(seq) == prompt_len and generate:
            seq.append(int(logits[-1].argmax()))
        for pos in range(prompt_len, target_len - 1):
            step_pos["start"] = pos
            t0 = time.perf_counter()
            out = lm(input_ids=torch.tensor([[seq[pos]]], device=device),
                     position_ids=torch.tensor([[pos]], device=device), cache=cache, use_cache=True)
            step_time.append(time.perf_counter() - t0)
            logits.append(out.logits[0, -1].float())
            if pos + 1 == len(seq) and len(seq) < target_len:
                seq.append(int(logits[-1].argmax()))
            kept.append([states[i].positions[0].cpu() if i in states else None for i in range(len(modules))])
            lens = [c.get_seq_length() for c in cache.layers]
            cache_len.append(lens)
            cache_bytes.append(sum(c.keys.nbytes + c.values.nbytes for c in cache.layers if c.is_initialized))
            analytic.append(2 * n_kv * handle.info.head_dim * bytes_per * sum(lens))
            if record_attention:
                attn_rows.append(list(attention_log))
            if progress:
                done = pos + 1 - prompt_len
                progress(done / max(1, target_len - 1 - prompt_len), f"{policy.label}: step {done}")
    n_pred = len(seq) - prompt_len
    return Trace(tokens=seq, prompt_len=prompt_len, logits=torch.stack(logits[:n_pred]).cpu(), kept=kept,
                 prefill_kept=prefill_kept, cache_len=cache_len, cache_bytes=cache_bytes, analytic_bytes=analytic,
                 step_time=step_time, attention=attn_rows if record_attention else None, cache=cache)


# ---------------------------------------------------------------------------------------------
# The task: a key-value recall prompt (or the user's own prompt)


@dataclass
class KvTask(Result):
    """tokens[:prefill_len] is prefilled in one forward; every later token is fed one at a time (teacher
    forcing), so eviction also happens while the rest of the context is read. tokens[:context_len] is the
    context; the questions and answers follow it."""

    tokens: list[int]
    prefill_len: int
    context_len: int
    answer_positions: list[int] = field(default_factory=list)  # tokens scored for retrieval accuracy
    needle_positions: list[list[int]] = field(default_factory=list)  # per answer: its key and value positions
    source: str = "key-value recall"


def _with_questions(context: list[int], questions: list[tuple[list[int], int, list[int]]], prefill: float,
                    source: str) -> KvTask:
    """Append each (asking tokens, answer token, needle positions) to the context."""
    tokens, answers, needles = list(context), [], []
    for ask, answer, needle in questions:
        tokens += [*ask, answer]
        answers.append(len(tokens) - 1)
        needles.append(list(needle))
    prefill_len = max(1, min(len(context), round(prefill * len(context))))
    return KvTask(tokens=tokens, prefill_len=prefill_len, context_len=len(context), answer_positions=answers,
                  needle_positions=needles, source=source)


def _plain_ids(tokenizer, vocab_size: int) -> list[int]:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return [i for i in range(min(vocab_size, len(tokenizer))) if i not in special]


def synthetic_kv_task(tokenizer, vocab_size: int, *, context: int, pairs: int, seed: int, queries: int | None = None,
                      prefill: float = 0.5) -> KvTask:
    """Filler tokens with `pairs` key/value token pairs scattered in them, then `queries` keys asked
    ("key" -> value). Any vocabulary works; a model not trained on this format scores near chance."""
    rng = random.Random(seed)
    ids = _plain_ids(tokenizer, vocab_size)
    if len(ids) < 3 * pairs + 4:
        raise KvEvictionError("The vocabulary is too small for the key-value task.")
    rng.shuffle(ids)
    keys, values, filler = ids[:pairs], ids[pairs:2 * pairs], ids[2 * pairs:]
    body = [rng.choice(filler) for _ in range(max(context - 2 * pairs, pairs))]
    slots = sorted(rng.sample(range(len(body)), pairs))
    ctx, where = [], {}
    for i, tok in enumerate(body):
        ctx.append(tok)
        if i in slots:
            j = slots.index(i)
            where[j] = (len(ctx), len(ctx) + 1)
            ctx += [keys[j], values[j]]
    asked = rng.sample(range(pairs), min(pairs, queries or pairs))
    return _with_questions(ctx, [([keys[j]], values[j], where[j]) for j in asked], prefill,
                           "synthetic key-value recall")


def shapes_kv_task(tokenizer, *, context: int, pairs: int, seed: int, queries: int = 1,
                   prefill: float = 0.5) -> KvTask:
    """Shapes World's multi-needle prompt (`needle_example`, the format shapes-lm was trained on):
    "<s> needle : f3 k2 41 f9 ... query k2 = 41". With queries > 1 further needles are asked in turn
    ("... = 41 query k0 = 7"), which is beyond the training format."""
    from analysis.zoo import shapes_world as sw

    rng = random.Random(seed)
    try:
        prompt, _, _ = sw.needle_example(rng, context, max(1, min(pairs, len(sw.KEYS))))
    except ValueError as exc:
        raise KvEvictionError(f"Cannot build the key-value prompt: {exc}.") from exc
    words = prompt.split()
    asked, body = words[-2], words[:-3]
    needles = {w: (i, i + 1) for i, w in enumerate(body[:-1]) if w in sw.KEYS}
    order = ([asked] + [k for k in needles if k != asked])[:max(1, queries)]
    ids = tokenizer(" ".join(body + ["query", "="] + [body[needles[k][1]] for k in order]),
                    add_special_tokens=False)["input_ids"]
    if len(ids) != len(body) + 2 + len(order):
        raise KvEvictionError("This tokenizer does not map Shapes World words to single tokens.")
    ctx, query_id, eq_id = ids[:len(body)], ids[len(body)], ids[len(body) + 1]
    questions = [([query_id, ctx[needles[k][0]], eq_id], ctx[needles[k][1]], needles[k]) for k in order]
    return _with_questions(ctx, questions, prefill, "Shapes World key-value recall")


def build_task(handle: ModelHandle, params: KvParams, seed: int | None = None) -> KvTask:
    """The user's prompt followed by the full cache's greedy continuation, or the key-value task."""
    tok = handle.tokenizer
    seed = params.seed if seed is None else seed
    if not 0.0 < params.prefill <= 1.0:
        raise KvEvictionError("The prefilled share of the context must be in (0, 1].")
    if params.prompt.strip():
        ids = tok(params.prompt, add_special_tokens=True)["input_ids"]
        if len(ids) < 2:
            raise KvEvictionError("The prompt is too short: it needs at least two tokens.")
        _check_length(handle, len(ids) + 2 * max(2, params.new_tokens))
        full = run_policy(handle, ids, len(ids), FullCache(params), generate=max(2, params.new_tokens))
        task = _with_questions(ids, [], params.prefill, "custom prompt")
        task.tokens = full.tokens
        return task
    task = tasks_for(handle).kv_task(handle, context=params.context, pairs=params.pairs, seed=seed,
                                     queries=params.queries, prefill=params.prefill)
    _check_length(handle, len(task.tokens) + params.new_tokens)
    return task


def _check_length(handle: ModelHandle, n: int) -> None:
    limit = handle.info.max_positions
    if limit and n > limit:
        raise KvEvictionError(f"{n} tokens (context, questions and generated text) exceed the model's "
                              f"{limit} positions; use a shorter context or prompt.")


# ---------------------------------------------------------------------------------------------
# Metrics against the full cache on identical tokens


@dataclass
class PolicyRun(Result):
    policy: str
    label: str
    budget: int
    kl: list[float]  # per predicted token, KL(full || policy) in nats
    top1: list[float]  # 1 where the policy's top token equals the full cache's
    dnll: list[float]  # NLL of the true next token, policy minus full (nats)
    recall: list[list[float]]  # [decode step][layer]: full-cache attention mass on the entries present
    needle_survival: list[list[float]]  # [layer][kv head]: share of needles present when asked for
    accuracy: float | None  # share of answers predicted right (key-value task)
    answers: list[int]  # predicted token at each answer position
    cache_len: list[float]  # per decode step, entries per KV head, mean over the evictable layers
    cache_bytes: list[int]
    analytic_bytes: list[int]
    step_ms: list[float]

    @property
    def mean_kl(self) -> float:
        return sum(self.kl) / max(1, len(self.kl))

    @property
    def agreement(self) -> float:
        return sum(self.top1) / max(1, len(self.top1))

    @property
    def mean_recall(self) -> float:
        flat = [x for row in self.recall for x in row]
        return sum(flat) / max(1, len(flat))


def present_positions(trace: Trace, step: int, layer: int) -> torch.Tensor:
    """(H_kv, K) original positions the query of decode step `step` attended to in `layer`."""
    before = trace.prefill_kept[layer] if step == 0 else trace.kept[step - 1][layer]
    new = torch.full((before.shape[0], 1), trace.prompt_len + step, dtype=before.dtype)
    return torch.cat([before, new], dim=1)


def compare(full: Trace, run: Trace, task: KvTask, policy: Policy, layers: list[int], groups: int) -> PolicyRun:
    lp_full = full.logits.log_softmax(-1)
    lp = run.logits.log_softmax(-1)
    target = torch.tensor(task.tokens[task.prefill_len:])
    kl = (lp_full.exp() * (lp_full - lp)).sum(-1)
    top1 = (lp_full.argmax(-1) == lp.argmax(-1)).float()
    rows = torch.arange(len(target))
    dnll = lp_full[rows, target] - lp[rows, target]
    recall = []
    for step, oracle_layers in enumerate(full.attention or []):
        per_layer = []
        for layer in layers:
            present = present_positions(run, step, layer)
            oracle = oracle_layers[layer]  # (H_q, T)
            kept = present.repeat_interleave(groups, dim=0)
            per_layer.append(float(oracle.gather(1, kept).sum(1).mean()))
        recall.append(per_layer)
    survival = _needle_survival(run, task, layers)
    preds = [int(lp[a - task.prefill_len].argmax()) for a in task.answer_positions]
    accuracy = (sum(int(p == task.tokens[a]) for p, a in zip(preds, task.answer_positions)) / len(preds)
                if preds else None)
    return PolicyRun(
        policy=policy.name, label=policy.label, budget=policy.p.budget, kl=kl.tolist(), top1=top1.tolist(),
        dnll=dnll.tolist(), recall=recall, needle_survival=survival, accuracy=accuracy, answers=preds,
        cache_len=[sum(lens[l] for l in layers) / len(layers) for lens in run.cache_len], cache_bytes=run.cache_bytes,
        analytic_bytes=run.analytic_bytes, step_ms=[1000 * t for t in run.step_time],
    )


def _needle_survival(run: Trace, task: KvTask, layers: list[int]) -> list[list[float]]:
    n_heads = run.prefill_kept[layers[0]].shape[0]
    hits = torch.zeros(len(layers), n_heads)
    count = 0
    for answer, needles in zip(task.answer_positions, task.needle_positions):
        step = answer - task.prefill_len - 1  # the decode step whose logits predict `answer`
        if step < 0 or not needles:
            continue
        count += len(needles)
        for li, layer in enumerate(layers):
            present = present_positions(run, step, layer)
            for n in needles:
                hits[li] += (present == n).any(dim=1).float()
    return (hits / max(1, count)).tolist() if count else []


# ---------------------------------------------------------------------------------------------
# What the page, the CLI and the benchmark call


@dataclass
class SweepPoint(Result):
    policy: str
    share: float  # budget as a share of the context
    budget: int
    accuracy: float | None
    mean_kl: float
    agreement: float
    recall: float
    cache: float = 0.0  # entries per KV head when the last token is predicted (mean over layers and prompts)


@dataclass
class GeneratedText(Result):
    policy: str
    label: str
    text: str
    tokens: list[str]
    matches_full: list[bool]  # token by token against the full cache's generation


@dataclass
class KvResult(Result):
    params: KvParams
    model: str
    task: KvTask
    token_text: list[str]
    layers: list[int]  # evictable layers
    kv_heads: int
    runs: list[PolicyRun]  # every policy at the chosen budget (full cache first)
    kept: list[list[list[list[int]]]]  # chosen policy: [layer][kv head][decode step] -> positions after eviction
    full_accuracy: float | None
    texts: list[GeneratedText] = field(default_factory=list)

    def run(self, policy: str) -> PolicyRun:
        return next(r for r in self.runs if r.policy == policy)


def check_params(handle: ModelHandle, params: KvParams, task: KvTask) -> Policy:
    policy = make_policy(params)
    context = task.context_len
    if params.policy != "full" and params.budget >= context:
        raise KvEvictionError(
            f"The budget ({params.budget} entries) is not smaller than the context ({context} tokens), so "
            f"nothing would be evicted. Choose a budget below {context}.")
    return policy


def _policy_runs(handle, task, params, names, full, layers, progress, share=(0.0, 1.0)) -> list[PolicyRun]:
    groups = handle.info.heads // handle.info.kv_heads
    runs = []
    for i, name in enumerate(names):
        pol = make_policy(KvParams.from_dict({**params.to_dict(), "policy": name}))
        if progress:
            progress(share[0] + (share[1] - share[0]) * i / len(names), f"{pol.label} ...")
        trace = full if name == "full" else run_policy(handle, task.tokens, task.prefill_len, pol)
        runs.append(compare(full, trace, task, pol, layers, groups))
    return runs


def analyze(handle: ModelHandle, params: KvParams, progress: Progress | None = None) -> KvResult:
    """Every policy at the chosen budget on identical tokens, with the chosen policy's kept sets."""
    layers = evictable_layers(handle)
    task = build_task(handle, params)
    policy = check_params(handle, params, task)
    full = run_policy(handle, task.tokens, task.prefill_len, FullCache(params), record_attention=True)
    names = ["full"] + [n for n in POLICIES if n != "full"]
    runs = _policy_runs(handle, task, params, names, full, layers, progress, (0.0, 0.7))
    chosen = full if policy.name == "full" else run_policy(handle, task.tokens, task.prefill_len, policy)
    kept = [[[step[layer][h].tolist() for step in chosen.kept] for h in range(handle.info.kv_heads)]
            for layer in layers]
    texts = generate_texts(handle, params, task, names, progress)
    if progress:
        progress(1.0, "done")
    return KvResult(
        params=params, model=handle.spec.label, task=task,
        token_text=[str(t) for t in handle.tokenizer.convert_ids_to_tokens(task.tokens)],
        layers=layers, kv_heads=handle.info.kv_heads, runs=runs, kept=kept,
        full_accuracy=runs[0].accuracy, texts=texts,
    )


def generate_texts(handle, params, task, names, progress=None) -> list[GeneratedText]:
    """Greedy continuation under each policy, after the context and the first question."""
    start = task.answer_positions[0] if task.answer_positions else task.context_len
    out, reference = [], None
    for i, name in enumerate(names):
        if progress:
            progress(0.7 + 0.3 * i / len(names), f"generating ({name}) ...")
        pol = make_policy(KvParams.from_dict({**params.to_dict(), "policy": name}))
        trace = run_policy(handle, task.tokens[:start], task.prefill_len, pol, generate=max(2, params.new_tokens))
        new = trace.tokens[start:]
        eos = handle.tokenizer.eos_token_id
        if eos is not None and eos in new:  # show the answer, not the padding of end-of-text tokens after it
            new = new[:new.index(eos)]
        reference = new if reference is None else reference
        out.append(GeneratedText(
            policy=name, label=pol.label, text=handle.tokenizer.decode(new),
            tokens=[str(t) for t in handle.tokenizer.convert_ids_to_tokens(new)],
            matches_full=[a == b for a, b in zip(new, reference)]))
    return out


@dataclass
class SweepResult(Result):
    model: str
    context: int
    points: list[SweepPoint]
    full_accuracy: float | None


def budget_sweep(handle: ModelHandle, params: KvParams, progress: Progress | None = None) -> SweepResult:
    """Accuracy, KL, agreement and recall of every policy at budgets given as shares of the context,
    averaged over `params.examples` prompts (accuracy over all their answers)."""
    layers = evictable_layers(handle)
    groups = handle.info.heads // handle.info.kv_heads
    names = [n for n in POLICIES if n != "full"]
    n_ex = 1 if params.prompt.strip() else max(1, params.examples)
    sums: dict[tuple[str, float], list[float]] = {}
    full_hits, full_n, context = 0.0, 0, 0
    total, done = n_ex * len(names) * len(params.sweep), 0
    for ex in range(n_ex):
        task = build_task(handle, params, seed=params.seed + ex)
        context = task.context_len
        full = run_policy(handle, task.tokens, task.prefill_len, FullCache(params), record_attention=True)
        n_ans = len(task.answer_positions)
        full_run = compare(full, full, task, FullCache(params), layers, groups)
        full_hits += (full_run.accuracy or 0.0) * n_ans
        full_n += n_ans
        for share in params.sweep:
            for name in names:
                p = _sweep_params(params, name, share, task.context_len)
                pol = make_policy(p)
                if progress:
                    progress(done / total, f"{pol.label} at {share:.0%} ...")
                run = compare(full, run_policy(handle, task.tokens, task.prefill_len, pol), task, pol, layers, groups)
                acc = sums.setdefault((name, share), [0.0, 0.0, 0.0, 0.0, 0.0, p.budget, 0.0])
                acc[0] += (run.accuracy or 0.0) * n_ans
                acc[1] += n_ans
                acc[2] += run.mean_kl / n_ex
                acc[3] += run.agreement / n_ex
                acc[4] += run.mean_recall / n_ex
                acc[6] += (run.cache_len[-1] if run.cache_len else 0.0) / n_ex
                done += 1
    points = [SweepPoint(policy=name, share=share, budget=int(v[5]), accuracy=v[0] / v[1] if v[1] else None,
                         mean_kl=v[2], agreement=v[3], recall=v[4], cache=v[6])
              for (name, share), v in sums.items()]
    return SweepResult(model=handle.spec.label, context=context, points=points,
                       full_accuracy=full_hits / full_n if full_n else None)


def _sweep_params(params: KvParams, name: str, share: float, context: int) -> KvParams:
    p = KvParams.from_dict({**params.to_dict(), "policy": name})
    p.budget = max(POLICIES[name](p).min_budget(), min(context - 1, round(share * context)))
    return p


# ---------------------------------------------------------------------------------------------
# Command line


def cli(argv: list[str]) -> int:
    import argparse

    from analysis.models import ModelSpec, load_model

    ap = argparse.ArgumentParser(prog="python -m analysis kv", description="KV-cache eviction policies.")
    ap.add_argument("--model", default="zoo:shapes-lm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    ap.add_argument("--policy", default="morphkv", choices=list(POLICIES))
    ap.add_argument("--budget", type=int, default=KvParams.budget)
    ap.add_argument("--window", type=int, default=KvParams.window)
    ap.add_argument("--sinks", type=int, default=KvParams.sinks)
    ap.add_argument("--kernel", type=int, default=KvParams.kernel)
    ap.add_argument("--fusion", default="max", choices=["sum", "max"])
    ap.add_argument("--prompt", default="")
    ap.add_argument("--new-tokens", type=int, default=KvParams.new_tokens)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--context", type=int, default=KvParams.context, help="key-value task context length")
    ap.add_argument("--examples", type=int, default=1, help="key-value prompts averaged in --sweep")
    ap.add_argument("--pairs", type=int, default=KvParams.pairs, help="needles in the key-value context")
    ap.add_argument("--queries", type=int, default=KvParams.queries, help="needles asked after the context")
    ap.add_argument("--prefill", type=float, default=KvParams.prefill, help="share of the context prefilled")
    ap.add_argument("--sweep", action="store_true", help="budget sweep (25/50/75%% of the context) instead")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    params = KvParams(policy=args.policy, budget=args.budget, window=args.window, sinks=args.sinks,
                      kernel=args.kernel, fusion=args.fusion, prompt=args.prompt, new_tokens=args.new_tokens,
                      seed=args.seed, context=args.context, examples=args.examples, pairs=args.pairs,
                      queries=args.queries, prefill=args.prefill)
    handle = load_model(ModelSpec.parse(args.model))
    result = budget_sweep(handle, params) if args.sweep else analyze(handle, params)
    if args.json:
        print(result.to_json())
    elif args.sweep:
        print(f"context {result.context} tokens; full-cache accuracy {result.full_accuracy}")
        print("| policy | share | budget | accuracy | mean KL | top-1 agreement | recall |")
        print("|---|---|---|---|---|---|---|")
        for pt in result.points:
            acc = "n/a" if pt.accuracy is None else f"{pt.accuracy:.2f}"
            print(f"| {pt.policy} | {pt.share:.0%} | {pt.budget} | {acc} | {pt.mean_kl:.4f} | "
                  f"{pt.agreement:.2f} | {pt.recall:.3f} |")
    else:
        print(f"{result.task.source}: context {result.task.context_len} tokens, budget {params.budget}")
        print("| policy | accuracy | mean KL | top-1 agreement | recall | cache entries (last step) |")
        print("|---|---|---|---|---|---|")
        for r in result.runs:
            acc = "n/a" if r.accuracy is None else f"{r.accuracy:.2f}"
            print(f"| {r.label} | {acc} | {r.mean_kl:.4f} | {r.agreement:.2f} | {r.mean_recall:.3f} | "
                  f"{r.cache_len[-1] if r.cache_len else 0:g} |")
    return 0

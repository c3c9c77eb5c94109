"""KV-cache eviction: which cached tokens each policy keeps, and what that costs.

Policies are small dataclasses in `analysis/kv/policies.py` (re-exported here), registered in
`POLICIES`; each owns and validates its settings. The runner that touches the model (`run_policy`)
exists once: a forward hook on every attention module sees the eager attention probabilities of the
current forward, asks the policy which cache entries to keep, and index-gathers
`cache.layers[l].keys/values` plus a parallel tensor of original positions. Manual decoding passes
absolute `position_ids`, so RoPE and learned position embeddings stay right after entries vanish (keys
are cached post-RoPE).

Conventions: batch 1; a budget C is the number of entries kept per layer and KV head; eviction
happens after the attention of a forward, so the query of a step still sees what the previous step
kept plus itself. Every policy of the main comparison holds exactly C from the moment the context
exceeds C (StreamingLLM, H2O, TOVA and SnapKV cut after the prefill forward as their official code
does, MorphKV at the first decode step as its code does, and all of them after every later step);
the prefill-only SnapKV/PyramidKV variants grow after the prefill. Sliding-window layers are never evicted.
"""
from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from analysis.anatomy import attention_modules
from analysis.kv.policies import (  # noqa: F401  (re-exported: the page, tests and benchmark use kv.X)
    H2O, POLICIES, TOVA, FullCache, LayerState, MorphKV, MorphKVMaxGroup, Policy, PyramidKV, PyramidKVPrefill,
    SnapKV, SnapKVPrefill, StreamingLLM, gather_kv, gather_q, group_reduce, setting_fields, top_plus_recent,
)
from analysis.models import ModelHandle, ModelLoadError
from analysis.registry import SettingsError, check_range
from analysis.results import Result
from analysis.tasks import tasks_for

Progress = Callable[[float, str], None]


class KvEvictionError(ModelLoadError):
    """Bad parameters or a model whose cache cannot be evicted; the message is for the user."""


# ---------------------------------------------------------------------------------------------
# Parameters


@dataclass
class KvParams(Result):
    """Everything one analysis needs. The settings of each policy (sinks, heavy_share, snap_window, kernel,
    morph_window, fusion) belong to its class in analysis/kv/policies.py, which validates them; they are
    stored here flat, by the field names of those classes, so a URL or a saved analysis carries them."""

    policy: str = "morphkv"
    budget: int = 64  # C: cache entries kept per layer and KV head
    sinks: int = StreamingLLM.sinks  # StreamingLLM: first S tokens always kept
    heavy_share: float = H2O.heavy_share  # H2O: share of the budget for heavy hitters (rest: recent tokens)
    snap_window: int = SnapKV.snap_window  # SnapKV / PyramidKV observation window w
    kernel: int = SnapKV.kernel  # SnapKV pooling kernel (odd)
    morph_window: int = MorphKV.morph_window  # MorphKV's R
    fusion: str = MorphKV.fusion  # MorphKV: fuse the R rows by "sum" or "max"
    prompt: str = ""  # empty: the built-in key-value recall task
    new_tokens: int = 24  # tokens generated after a custom prompt (and for the text comparison)
    seed: int = 0  # key-value task sample
    pairs: int = 2  # key-value task: needles (key/value pairs) in the context
    queries: int = 1  # key-value task: needles asked after the context
    prefill: float = 0.5  # share of the context prefilled in one forward; the rest is decoded token by token
    examples: int = 1  # budget sweep: key-value prompts averaged (seeds seed, seed+1, ...)
    context: int = 192  # key-value task: context length in tokens
    sweep: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75])  # budgets, share of context

    def settings(self) -> dict:
        return {k: v for k, v in self.to_dict().items() if k not in ("policy",)}

    @property
    def generated(self) -> int:
        """Tokens each policy generates for the text comparison (and after a custom prompt): at least two."""
        return max(2, self.new_tokens)


PARAM_LIMITS = {  # the task's own numeric settings: (label, low, high, integer)
    "context": ("Context length", 8, 100_000, True),
    "pairs": ("Needles (key-value pairs)", 1, 64, True),
    "queries": ("Questions", 1, 64, True),
    "examples": ("Prompts averaged", 1, 10_000, True),
    "new_tokens": ("Generated tokens", 0, 4096, True),
    "seed": ("Seed", 0, 2**31 - 1, True),
}


def make_policy(params: KvParams, name: str | None = None, budget: int | None = None) -> Policy:
    """The policy `name` (default: params.policy) with the settings in params, validated."""
    settings = params.settings()
    if budget is not None:
        settings["budget"] = budget
    return POLICIES.create(name or params.policy, **settings)


def main_policies() -> list[str]:
    """The policies of the equal-entries comparison (labelled variants left out)."""
    return [name for name, cls in POLICIES.items() if not getattr(cls, "variant", False)]


def validate_params(params: KvParams, *, check_budget: bool = True) -> None:
    """One validation path for the CLI, the URL and the page: raises SettingsError with a one-line message.
    Every policy's settings are checked by its class (at the chosen budget when `check_budget`)."""
    POLICIES.get(params.policy)
    check_range("Budget C", params.budget, low=1, integer=True)
    for name, (what, low, high, integer) in PARAM_LIMITS.items():
        check_range(what, getattr(params, name), low=low, high=high, integer=integer)
    check_range("Prefilled share", params.prefill, low=0.0, high=1.0)
    if params.prefill <= 0:
        raise SettingsError(f"Prefilled share must be in (0, 1], got {params.prefill}.")
    if not params.sweep:
        raise SettingsError("The budget sweep needs at least one budget share.")
    for share in params.sweep:
        check_range("Sweep budget share", share, low=0.0, high=1.0)
        if not 0 < share < 1:
            raise SettingsError(f"Sweep budget shares must be strictly between 0 and 1, got {share}.")
    for name in POLICIES:
        make_policy(params, name, None if check_budget else 10**9)


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
    lm = handle.language_model
    modules = attention_modules(lm)
    layers = evictable_layers(handle)
    device = handle.device
    n_heads, n_kv = handle.info.heads, handle.info.kv_heads
    states: dict[int, LayerState] = {}
    cache = _new_cache(lm)
    box = {"cache": cache}  # the cache the hooks evict from: the fork's own copy while it continues
    if fork_at is not None and not (prompt_len <= fork_at < len(tokens) and fork_generate >= 1):
        fork_at = None  # nothing to share: the caller runs the continuation on its own
    fork: dict = {}
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
            cached = box["cache"].layers[layer]
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
    # inference mode, not just no_grad: no version counters or view tracking on each of the ~1,000
    # small forwards of an analysis (the H2O link's analysis: 2.23 -> 1.96 s on one thread)
    with handle.patch() as p, torch.inference_mode():
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

        def keep_fork(pos: int) -> None:  # tokens[:pos] read: the continuation starts from here
            if pos == fork_at:
                fork.update(cache=copy.deepcopy(box["cache"]), states=copy.deepcopy(states),
                            first=int(logits[-1].argmax()))

        keep_fork(prompt_len)
        target_len = len(seq) + generate
        if len(seq) == prompt_len and generate:
            seq.append(int(logits[-1].argmax()))
        for pos in range(prompt_len, target_len - 1):
            p.checkpoint()  # other users waiting for the model go first, between decode steps
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
            keep_fork(pos + 1)
        forked = None
        if fork:  # the continuation, on the state kept at fork_at (the teacher-forced pass is done)
            box["cache"] = fork["cache"]
            states.clear()
            states.update(fork["states"])
            forked = list(tokens[:fork_at]) + [fork["first"]]
            for pos in range(fork_at, fork_at + fork_generate - 1):
                p.checkpoint()
                step_pos["start"] = pos
                out = lm(input_ids=torch.tensor([[forked[pos]]], device=device),
                         position_ids=torch.tensor([[pos]], device=device), cache=box["cache"], use_cache=True)
                forked.append(int(out.logits[0, -1].argmax()))
    n_pred = len(seq) - prompt_len
    return Trace(tokens=seq, prompt_len=prompt_len, logits=torch.stack(logits[:n_pred]).cpu(), kept=kept,
                 prefill_kept=prefill_kept, cache_len=cache_len, cache_bytes=cache_bytes, analytic_bytes=analytic,
                 step_time=step_time, attention=attn_rows if record_attention else None, cache=cache, forked=forked)


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
    if params.prompt.strip():
        ids = tok(params.prompt, add_special_tokens=True)["input_ids"]
        if len(ids) < 2:
            raise KvEvictionError("The prompt is too short: it needs at least two tokens.")
        _check_length(handle, len(ids) + 2 * params.generated)
        full = run_policy(handle, ids, len(ids), FullCache(), generate=params.generated)
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
        policy=policy.name, label=policy.label, budget=policy.budget, kl=kl.tolist(), top1=top1.tolist(),
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
    validate_params(params)
    policy = make_policy(params)
    context = task.context_len
    if params.policy != "full" and params.budget >= context:
        raise KvEvictionError(
            f"The budget ({params.budget} entries) is not smaller than the context ({context} tokens), so "
            f"nothing would be evicted. Choose a budget below {context}.")
    return policy


def _policy_runs(handle, task, params, names, full, layers, progress, share=(0.0, 1.0),
                 keep: str | None = None, texts: tuple[str, ...] = ()) -> tuple[list[PolicyRun], Trace | None, dict]:
    """Each named policy run and compared with the full cache; also the trace of policy `keep`, and for
    the policies in `texts` their generated continuation (forked from the same run: see run_policy)."""
    groups = handle.info.heads // handle.info.kv_heads
    start, generate = text_start(task), params.generated
    runs, kept, forked = [], None, {}
    for i, name in enumerate(names):
        pol = make_policy(params, name)
        if progress:
            progress(share[0] + (share[1] - share[0]) * i / len(names), f"{pol.label} ...")
        trace = full if name == "full" else run_policy(
            handle, task.tokens, task.prefill_len, pol, fork_at=start if name in texts else None,
            fork_generate=generate)
        runs.append(compare(full, trace, task, pol, layers, groups))
        if name == keep:
            kept = trace
        if name in texts and trace.forked is not None:
            forked[name] = trace.forked
    return runs, kept, forked


def text_start(task: KvTask) -> int:
    """Where the generated-text comparison starts: the first answer, or the end of a custom prompt."""
    return task.answer_positions[0] if task.answer_positions else task.context_len


def analyze(handle: ModelHandle, params: KvParams, progress: Progress | None = None) -> KvResult:
    """Every policy at the chosen budget on identical tokens, with the chosen policy's kept sets."""
    layers = evictable_layers(handle)
    task = build_task(handle, params)
    policy = check_params(handle, params, task)
    names = ["full"] + [n for n in POLICIES if n != "full"]
    text_names = [n for n in names if n in main_policies() or n == policy.name]  # variants: only when chosen
    # Each policy that shows generated text continues from its own run once the prompt is read (a fork:
    # the same forwards as a separate run over the prompt, without reading it twice); the full cache's
    # run is this one, which _policy_runs reuses for "full".
    full = run_policy(handle, task.tokens, task.prefill_len, FullCache(), record_attention=True,
                      fork_at=text_start(task), fork_generate=params.generated)
    # the chosen policy's kept sets come from its own run among them (check_params accepts only the
    # registered policies, all in `names`; make_policy(params) is the same policy with the same
    # settings, and runs are deterministic), not from a second run
    runs, chosen, forked = _policy_runs(handle, task, params, names, full, layers, progress, (0.0, 0.9),
                                        keep=policy.name, texts=tuple(text_names))
    kept = [[[step[layer][h].tolist() for step in chosen.kept] for h in range(handle.info.kv_heads)]
            for layer in layers]
    texts = generate_texts(handle, params, task, text_names, progress, forked=forked)
    if progress:
        progress(1.0, "done")
    return KvResult(
        params=params, model=handle.spec.label, task=task,
        token_text=[str(t) for t in handle.tokenizer.convert_ids_to_tokens(task.tokens)],
        layers=layers, kv_heads=handle.info.kv_heads, runs=runs, kept=kept,
        full_accuracy=runs[0].accuracy, texts=texts,
    )


def generate_texts(handle, params, task, names, progress=None, forked: dict | None = None) -> list[GeneratedText]:
    """Greedy continuation under each policy, after the context and the first question. `forked`: the
    continuations already generated by the policies' own runs (run_policy's fork), by policy name."""
    start = text_start(task)
    forked = forked or {}
    out, reference = [], None
    for i, name in enumerate(names):
        pol = make_policy(params, name)
        if name in forked:
            tokens = forked[name]
        else:
            if progress:
                progress(0.9 + 0.1 * i / len(names), f"generating ({name}) ...")
            tokens = run_policy(handle, task.tokens[:start], task.prefill_len, pol,
                                generate=params.generated).tokens
        new = tokens[start:]
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


def budget_sweep(handle: ModelHandle, params: KvParams, progress: Progress | None = None,
                 names: list[str] | None = None) -> SweepResult:
    """Accuracy, KL, agreement, recall and cache held of every policy (or of `names`) at budgets given as
    shares of the context, averaged over `params.examples` prompts (accuracy over all their answers)."""
    validate_params(params, check_budget=False)
    layers = evictable_layers(handle)
    groups = handle.info.heads // handle.info.kv_heads
    names = [n for n in (names or POLICIES) if n != "full"]
    n_ex = 1 if params.prompt.strip() else max(1, params.examples)
    sums: dict[tuple[str, float], list[float]] = {}
    full_hits, full_n, context = 0.0, 0, 0
    total, done = n_ex * len(names) * len(params.sweep), 0
    for ex in range(n_ex):
        task = build_task(handle, params, seed=params.seed + ex)
        context = task.context_len
        full = run_policy(handle, task.tokens, task.prefill_len, FullCache(), record_attention=True)
        n_ans = len(task.answer_positions)
        full_run = compare(full, full, task, FullCache(), layers, groups)
        full_hits += (full_run.accuracy or 0.0) * n_ans
        full_n += n_ans
        for share in params.sweep:
            for name in names:
                pol = make_policy(params, name, _sweep_budget(params, name, share, task.context_len))
                if progress:
                    progress(done / total, f"{pol.label} at {share:.0%} ...")
                run = compare(full, run_policy(handle, task.tokens, task.prefill_len, pol), task, pol, layers, groups)
                acc = sums.setdefault((name, share), [0.0, 0.0, 0.0, 0.0, 0.0, pol.budget, 0.0])
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


def _sweep_budget(params: KvParams, name: str, share: float, context: int) -> int:
    floor = make_policy(params, name, 10**9).min_budget()
    return max(floor, min(context - 1, round(share * context)))


# ---------------------------------------------------------------------------------------------
# Command line


class _Parser:
    """argparse whose errors become one SettingsError line (analysis/__main__.py prints `error: ...`)."""

    @staticmethod
    def make(**kwargs):
        import argparse

        class Parser(argparse.ArgumentParser):
            def error(self, message):  # noqa: D401 - argparse hook
                raise SettingsError(f"{message} (see python -m analysis kv --help).")

        return Parser(**kwargs)


def cli(argv: list[str]) -> int:
    from analysis.models import ModelSpec, load_model

    d = KvParams()
    ap = _Parser.make(prog="python -m analysis kv", description="KV-cache eviction policies.")
    ap.add_argument("--model", default="zoo:shapes-lm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    ap.add_argument("--policy", default=d.policy, help=f"one of {', '.join(POLICIES)}")
    ap.add_argument("--budget", type=int, default=d.budget, help="C: entries kept per layer and KV head")
    ap.add_argument("--sinks", type=int, default=d.sinks, help="StreamingLLM: sink tokens S")
    ap.add_argument("--heavy-share", type=float, default=d.heavy_share,
                    help="H2O: share of the budget for heavy hitters (the rest keeps recent tokens)")
    ap.add_argument("--snap-window", type=int, default=d.snap_window, help="SnapKV/PyramidKV observation window w")
    ap.add_argument("--kernel", type=int, default=d.kernel, help="SnapKV/PyramidKV pooling kernel (odd)")
    ap.add_argument("--morph-window", type=int, default=d.morph_window, help="MorphKV recent window R")
    ap.add_argument("--fusion", default=d.fusion, help="MorphKV fusion: max or sum")
    ap.add_argument("--window", type=float, default=None, help=argparse_suppress())
    ap.add_argument("--prompt", default="")
    ap.add_argument("--new-tokens", type=int, default=d.new_tokens)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--context", type=int, default=d.context, help="key-value task context length")
    ap.add_argument("--examples", type=int, default=d.examples, help="key-value prompts averaged in --sweep")
    ap.add_argument("--pairs", type=int, default=d.pairs, help="needles in the key-value context")
    ap.add_argument("--queries", type=int, default=d.queries, help="needles asked after the context")
    ap.add_argument("--prefill", type=float, default=d.prefill, help="share of the context prefilled, in (0, 1]")
    ap.add_argument("--sweep", nargs="?", const=",".join(map(str, d.sweep)), default=None,
                    help="budget sweep instead, at these shares of the context (default 0.25,0.5,0.75)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    if args.window is not None:
        raise SettingsError("--window is gone: each policy has its own (--snap-window for SnapKV/PyramidKV, "
                            "--morph-window for MorphKV's R; H2O splits the budget with --heavy-share).")
    sweep = d.sweep
    if args.sweep is not None:
        try:
            sweep = [float(x) for x in args.sweep.split(",") if x.strip()]
        except ValueError:
            raise SettingsError(f"--sweep takes comma-separated shares of the context, got '{args.sweep}'.") from None
    params = KvParams(policy=args.policy, budget=args.budget, sinks=args.sinks, heavy_share=args.heavy_share,
                      snap_window=args.snap_window, kernel=args.kernel, morph_window=args.morph_window,
                      fusion=args.fusion, prompt=args.prompt, new_tokens=args.new_tokens, seed=args.seed,
                      context=args.context, examples=args.examples, pairs=args.pairs, queries=args.queries,
                      prefill=args.prefill, sweep=sweep)
    validate_params(params, check_budget=args.sweep is None)  # before loading the model: bad input fails fast
    handle = load_model(ModelSpec.parse(args.model))
    result = budget_sweep(handle, params) if args.sweep is not None else analyze(handle, params)
    if args.json:
        print(result.to_json())
    elif args.sweep is not None:
        print(f"context {result.context} tokens; full-cache accuracy {result.full_accuracy}")
        print("| policy | share | budget | accuracy | mean KL | top-1 agreement | recall | cache held |")
        print("|---|---|---|---|---|---|---|---|")
        for pt in result.points:
            acc = "n/a" if pt.accuracy is None else f"{pt.accuracy:.2f}"
            print(f"| {POLICIES.label(pt.policy)} | {pt.share:.0%} | {pt.budget} | {acc} | {pt.mean_kl:.4f} | "
                  f"{pt.agreement:.2f} | {pt.recall:.3f} | {pt.cache:g} |")
    else:
        print(f"{result.task.source}: context {result.task.context_len} tokens, budget {params.budget}")
        print("| policy | accuracy | mean KL | top-1 agreement | recall | cache entries (last step) |")
        print("|---|---|---|---|---|---|")
        for r in result.runs:
            acc = "n/a" if r.accuracy is None else f"{r.accuracy:.2f}"
            print(f"| {r.label} | {acc} | {r.mean_kl:.4f} | {r.agreement:.2f} | {r.mean_recall:.3f} | "
                  f"{r.cache_len[-1] if r.cache_len else 0:g} |")
    return 0


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS

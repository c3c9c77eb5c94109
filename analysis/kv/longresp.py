"""The long-response evaluation (MorphKV's claim: long answers at constant memory). The prompt is read in
one forward; every policy then writes its own answer greedily with its cache held at C from the first
generated token; each answer is compared with the full cache's, position by position, and checked item
by item against the task's ground truth (analysis/tasks/long_response.py).

Per generated position i (each policy's own text):
- `top1[i]`: the policy's token equals the full cache's greedy choice after the same prefix;
- `kl[i]`: KL(full || policy) of the next-token distributions after the same prefix (nats);
- `same[i]`: the answer is still identical to the full cache's answer up to and including position i.
The full cache's distributions after a policy's prefix come from one plain forward over that text.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from analysis.kv.params import KvParams, main_policies, make_policy, validate_params
from analysis.kv.policies import FullCache
from analysis.kv.records import token_pieces
from analysis.kv.runner import Trace, evictable_layers, run_policy
from analysis.model_access.models import ModelHandle
from analysis.framework.progress import Progress
from analysis.framework.results import Result
from analysis.tasks import tasks_for
from analysis.tasks.long_response import Item, LongTask, answer_items, custom_prompt, recalled


@dataclass
class LongRun(Result):
    policy: str
    label: str
    budget: int
    generated: list[int]  # token ids, end-of-text excluded
    text: str
    top1: list[float]  # per generated position (see the module docstring)
    kl: list[float]
    same: list[float]
    items: list[Item] = field(default_factory=list)
    recalled: list[bool] = field(default_factory=list)  # per reference item, in order
    cache_len: list[float] = field(default_factory=list)  # per decode step: entries per KV head, mean over layers
    cache_bytes: list[int] = field(default_factory=list)  # per decode step, measured
    claimed: float = 0.0  # entries per KV head the policy should hold at the last step (Policy.held)

    @property
    def recall(self) -> float | None:
        return sum(self.recalled) / len(self.recalled) if self.recalled else None

    @property
    def precision(self) -> float | None:
        return sum(i.correct for i in self.items) / len(self.items) if self.items else None

    @property
    def agreement(self) -> float:
        return sum(self.top1) / max(1, len(self.top1))


@dataclass
class LongResult(Result):
    params: KvParams
    model: str
    task: LongTask
    prompt_text: list[str]  # the prompt's tokens, as text
    layers: list[int]
    kv_heads: int
    runs: list[LongRun]  # the full cache first
    kept: list[list[list[list[int]]]]  # chosen policy: [layer][kv head][decode step] -> positions kept
    answer_text: list[str] = field(default_factory=list)  # the chosen policy's generated tokens, as text

    def run(self, policy: str) -> LongRun:
        return next(r for r in self.runs if r.policy == policy)


def long_task(handle: ModelHandle, params: KvParams, seed: int | None = None) -> LongTask:
    if params.prompt.strip():
        return custom_prompt(handle.tokenizer, params.prompt, params.response)
    return tasks_for(handle).long_response_task(handle, seed=params.seed if seed is None else seed,
                                                max_new=params.response)


def _eos(handle: ModelHandle) -> int | None:
    return handle.tokenizer.eos_token_id


def generate(handle: ModelHandle, task: LongTask, policy, record_attention: bool = False) -> Trace:
    return run_policy(handle, task.tokens, len(task.tokens), policy, generate=task.max_new, stop_at=_eos(handle),
                      record_attention=record_attention)


def full_logits(handle: ModelHandle, tokens: list[int], prompt_len: int) -> torch.Tensor:
    """The full cache's next-token logits after every prefix tokens[:P] ... tokens[:N-1], in one forward."""
    with handle.session(), torch.inference_mode():
        out = handle.language_model(input_ids=torch.tensor([tokens], device=handle.device),
                                    logits_to_keep=len(tokens) - prompt_len + 1)
    return out.logits[0, :-1].float().cpu()


def score(handle: ModelHandle, task: LongTask, trace: Trace, policy, reference: list[int] | None,
          layers: list[int]) -> LongRun:
    """One policy's answer against the full cache (same prefix) and against the task's ground truth."""
    p = len(task.tokens)
    tokens = trace.tokens
    gen = _answer(handle, tokens[p:])
    n = len(gen)
    own = trace.logits[:n].log_softmax(-1)
    full = own if reference is None else full_logits(handle, tokens[: p + n], p)[:n].log_softmax(-1)
    kl = (full.exp() * (full - own)).sum(-1).clamp_min(0.0)
    top1 = (full.argmax(-1) == own.argmax(-1)).float()
    ref = gen if reference is None else reference
    same, ok = [], True
    for i in range(n):
        ok = ok and i < len(ref) and ref[i] == gen[i]
        same.append(float(ok))
    items = answer_items(task, handle.tokenizer, gen) if task.kind != "custom" else []
    steps = trace.cache_len
    claimed = policy.held(len(layers), p, p + len(steps))
    return LongRun(
        policy=policy.name, label=policy.label, budget=policy.budget, generated=gen,
        text=handle.tokenizer.decode(gen, skip_special_tokens=True), top1=top1.tolist(), kl=kl.tolist(), same=same,
        items=items, recalled=recalled(task, items) if task.reference else [],
        cache_len=[sum(lens[layer] for layer in layers) / len(layers) for lens in steps],
        cache_bytes=list(trace.cache_bytes), claimed=sum(claimed[i] for i, _ in enumerate(layers)) / len(layers),
    )


def _answer(handle: ModelHandle, generated: list[int]) -> list[int]:
    eos = _eos(handle)
    return generated[: generated.index(eos)] if eos is not None and eos in generated else list(generated)


def long_response(handle: ModelHandle, params: KvParams, progress: Progress | None = None,
                  names: list[str] | None = None) -> LongResult:
    """Every main policy (and the chosen one) writes its own answer at budget C; compared with the full cache's."""
    policies = validate_params(params)  # every policy, built once
    layers = evictable_layers(handle)
    task = long_task(handle, params)
    names = names or [n for n in main_policies() if n != "full"]
    if params.policy not in names and params.policy != "full":
        names = [*names, params.policy]
    full_cache = FullCache()  # its row keeps the full cache's own budget field, as stored results have it
    full_trace = generate(handle, task, full_cache)
    reference = _answer(handle, full_trace.tokens[len(task.tokens):])
    runs = [score(handle, task, full_trace, full_cache, None, layers)]
    chosen = full_trace
    for i, name in enumerate(names):
        pol = policies[name]
        if progress:
            progress(i / (len(names) + 1), f"{pol.label} writes its answer ...")
        trace = generate(handle, task, pol)
        runs.append(score(handle, task, trace, pol, reference, layers))
        if name == params.policy:
            chosen = trace
    if progress:
        progress(1.0, "done")
    chosen_run = next(r for r in runs if r.policy == params.policy)
    kept = [[[step[layer][h].tolist() for step in chosen.kept] for h in range(handle.info.kv_heads)]
            for layer in layers]
    tok = handle.tokenizer
    return LongResult(params=params, model=handle.spec.label, task=task,
                      prompt_text=token_pieces(tok, task.tokens), layers=layers,
                      kv_heads=handle.info.kv_heads, runs=runs, kept=kept,
                      answer_text=token_pieces(tok, chosen.tokens[len(task.tokens):])
                      if chosen_run else [])


# ---------------------------------------------------------------------------------------------
# Averaged over prompts and budgets (benchmarks/kv_longresp.py)

BIN = 16  # generated positions per bin of the by-position averages


@dataclass
class LongPoint(Result):
    policy: str
    budget: int
    examples: int
    recall: float | None  # items of the reference found, mean over prompts
    precision: float | None
    agreement: float  # top-1 agreement after the same prefix, mean over every generated token
    kl: float
    identical: float  # tokens before the answer first differs from the full cache's, mean over prompts
    by_item: list[float] = field(default_factory=list)  # recall of the k-th reference item
    by_position: list[float] = field(default_factory=list)  # top-1 agreement in bins of BIN generated tokens
    cache: float = 0.0  # entries per KV head at the last step (mean over layers and prompts)
    claimed: float = 0.0
    kib: float = 0.0  # measured cache KiB at the last step (mean over prompts)


def long_sweep(handle: ModelHandle, params: KvParams, budgets: list[int], examples: int,
               names: list[str] | None = None, progress: Progress | None = None) -> dict:
    """Every named policy at every budget on `examples` prompts (seeds params.seed, +1, ...): one LongPoint
    per (policy, budget), and the full cache's own item recall."""
    layers = evictable_layers(handle)
    names = names or [n for n in main_policies() if n != "full"]
    policies = {(name, budget): make_policy(params, name, budget) for budget in budgets for name in names}
    full_cache = FullCache()
    runs: dict[tuple[str, int], list[LongRun]] = {}
    full_runs = []
    total, done = examples * len(budgets) * len(names), 0
    for ex in range(examples):
        task = long_task(handle, params, seed=params.seed + ex)
        full_trace = generate(handle, task, full_cache)
        reference = _answer(handle, full_trace.tokens[len(task.tokens):])
        full_runs.append(score(handle, task, full_trace, full_cache, None, layers))
        for budget in budgets:
            for name in names:
                pol = policies[name, budget]
                if progress:
                    progress(done / total, f"{pol.label} at {budget}, prompt {ex + 1}")
                trace = generate(handle, task, pol)
                runs.setdefault((name, budget), []).append(score(handle, task, trace, pol, reference, layers))
                done += 1
    points = [_point(name, budget, rs) for (name, budget), rs in runs.items()]
    return {"points": points, "full": _point("full", 0, full_runs)}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _point(name: str, budget: int, rs: list[LongRun]) -> LongPoint:
    items = max((len(r.recalled) for r in rs), default=0)
    width = max((len(r.top1) for r in rs), default=0)
    bins = []
    for b in range(0, width, BIN):
        chunk = [x for r in rs for x in r.top1[b:b + BIN]]
        bins.append(sum(chunk) / len(chunk))
    return LongPoint(
        policy=name, budget=budget, examples=len(rs),
        recall=_mean([r.recall for r in rs if r.recall is not None]),
        precision=_mean([r.precision for r in rs if r.precision is not None]),
        agreement=sum(x for r in rs for x in r.top1) / max(1, sum(len(r.top1) for r in rs)),
        kl=sum(x for r in rs for x in r.kl) / max(1, sum(len(r.kl) for r in rs)),
        identical=sum(sum(r.same) for r in rs) / len(rs),
        by_item=[_mean([float(r.recalled[k]) for r in rs if k < len(r.recalled)]) or 0.0 for k in range(items)],
        by_position=bins,
        cache=sum(r.cache_len[-1] for r in rs if r.cache_len) / len(rs),
        claimed=sum(r.claimed for r in rs) / len(rs),
        kib=sum(r.cache_bytes[-1] for r in rs if r.cache_bytes) / len(rs) / 1024,
    )

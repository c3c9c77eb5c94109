"""What the page, the CLI and the benchmark call: every policy at one budget (`analyze`), and a budget
sweep (`budget_sweep`).

Each analysis builds its parts once and hands them down: every policy (validated as it is built, by
`validate_params`), the task, the evicted layers and the head groups (`Setup`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from analysis.model_access.anatomy import head_layout
from analysis.kv.compare import compare
from analysis.kv.metrics import Metric, metric, sweep_metrics
from analysis.kv.params import KvEvictionError, KvParams, main_policies, validate_params
from analysis.kv.policies import POLICIES, Policy
from analysis.kv.records import GeneratedText, KvResult, PolicyRun, SweepPoint, SweepResult, token_pieces
from analysis.kv.runner import Trace, evictable_layers, run_policy
from analysis.kv.task import build_task, text_start
from analysis.model_access.models import ModelHandle
from analysis.framework.progress import Progress
from analysis.tasks import KvTask


@dataclass
class Setup:
    """What one analysis of one model builds once: each policy by name (validated), the layers it evicts
    and the query heads per KV head (anatomy's head layout)."""

    policies: dict[str, Policy]
    layers: list[int]
    groups: int

    @classmethod
    def build(cls, handle: ModelHandle, params: KvParams, *, check_budget: bool = True) -> "Setup":
        policies = validate_params(params, check_budget=check_budget)
        return cls(policies, evictable_layers(handle), head_layout(handle).groups)

    def compare(self, full: Trace, run: Trace, task: KvTask, policy: Policy) -> PolicyRun:
        return compare(full, run, task, policy, self.layers, self.groups)


def check_params(params: KvParams, task: KvTask) -> None:
    """A budget that evicts nothing from this task's context is refused (the policies' own settings are
    checked as they are built)."""
    context = task.context_len
    if params.policy != "full" and params.budget >= context:
        raise KvEvictionError(
            f"The budget ({params.budget} entries) is not smaller than the context ({context} tokens), so "
            f"nothing would be evicted. Choose a budget below {context}.")


def _policy_runs(handle, setup: Setup, task, params, full, progress, share=(0.0, 1.0),
                 keep: str | None = None, texts: tuple[str, ...] = ()) -> tuple[list[PolicyRun], Trace | None, dict]:
    """Each policy of the setup run and compared with the full cache; also the trace of policy `keep`, and
    for the policies in `texts` their generated continuation (forked from the same run: see run_policy)."""
    start, generate = text_start(task), params.generated
    runs, kept, forked = [], None, {}
    for i, (name, pol) in enumerate(setup.policies.items()):
        if progress:
            progress(share[0] + (share[1] - share[0]) * i / len(setup.policies), f"{pol.label} ...")
        trace = full if name == "full" else run_policy(
            handle, task.tokens, task.prefill_len, pol, fork_at=start if name in texts else None,
            fork_generate=generate)
        runs.append(setup.compare(full, trace, task, pol))
        if name == keep:
            kept = trace
        if name in texts and trace.forked is not None:
            forked[name] = trace.forked
    return runs, kept, forked


def analyze(handle: ModelHandle, params: KvParams, progress: Progress | None = None) -> KvResult:
    """Every policy at the chosen budget on identical tokens, with the chosen policy's kept sets."""
    setup = Setup.build(handle, params)  # every registered policy, the full cache first
    task = build_task(handle, params)
    check_params(params, task)
    text_names = [n for n in setup.policies if n in main_policies() or n == params.policy]  # variants: when chosen
    # Each policy that shows generated text continues from its own run once the prompt is read (a fork:
    # the same forwards as a separate run over the prompt, without reading it twice); the full cache's
    # run is this one, which _policy_runs reuses for "full".
    full = run_policy(handle, task.tokens, task.prefill_len, setup.policies["full"], record_attention=True,
                      fork_at=text_start(task), fork_generate=params.generated)
    # the chosen policy's kept sets come from its own run among them, not from a second run
    runs, chosen, forked = _policy_runs(handle, setup, task, params, full, progress, (0.0, 0.9),
                                        keep=params.policy, texts=tuple(text_names))
    kept = [[[step[layer][h].tolist() for step in chosen.kept] for h in range(handle.info.kv_heads)]
            for layer in setup.layers]
    texts = generate_texts(handle, params, task, [setup.policies[n] for n in text_names], progress, forked=forked)
    if progress:
        progress(1.0, "done")
    return KvResult(
        params=params, model=handle.spec.label, task=task,
        token_text=token_pieces(handle.tokenizer, task.tokens),
        layers=setup.layers, kv_heads=handle.info.kv_heads, runs=runs, kept=kept,
        full_accuracy=runs[0].accuracy, texts=texts, model_layers=handle.info.layers,
    )


def generate_texts(handle, params, task, policies: list[Policy], progress=None,
                   forked: dict | None = None) -> list[GeneratedText]:
    """Greedy continuation under each policy, after the context and the first question. `forked`: the
    continuations already generated by the policies' own runs (run_policy's fork), by policy name."""
    start = text_start(task)
    forked = forked or {}
    out, reference = [], None
    for i, pol in enumerate(policies):
        if pol.name in forked:
            tokens = forked[pol.name]
        else:
            if progress:
                progress(0.9 + 0.1 * i / len(policies), f"generating ({pol.name}) ...")
            tokens = run_policy(handle, task.tokens[:start], task.prefill_len, pol,
                                generate=params.generated).tokens
        new = tokens[start:]
        eos = handle.tokenizer.eos_token_id
        if eos is not None and eos in new:  # show the answer, not the padding of end-of-text tokens after it
            new = new[:new.index(eos)]
        reference = new if reference is None else reference
        out.append(GeneratedText(
            policy=pol.name, label=pol.label, text=handle.tokenizer.decode(new),
            tokens=token_pieces(handle.tokenizer, new),
            matches_full=[a == b for a, b in zip(new, reference)]))
    return out


def budget_sweep(handle: ModelHandle, params: KvParams, progress: Progress | None = None,
                 names: list[str] | None = None) -> SweepResult:
    """Each sweep metric (metrics.py) of every policy (or of `names`) at budgets given as shares of the
    context, averaged over `params.examples` prompts (a per-answer metric over all their answers)."""
    setup = Setup.build(handle, params, check_budget=False)  # each policy's settings; budgets set per share
    names = [n for n in (names or POLICIES) if n != "full"]
    full_cache = setup.policies["full"]
    at_budget: dict[tuple[str, int], Policy] = {}  # each (policy, budget) built once for every prompt
    n_ex = 1 if params.prompt.strip() else max(1, params.examples)
    points: dict[tuple[str, float], _Mean] = {}
    full_accuracy = _Mean([metric("accuracy")])
    context, total, done = 0, n_ex * len(names) * len(params.sweep), 0
    for ex in range(n_ex):
        task = build_task(handle, params, seed=params.seed + ex)
        context = task.context_len
        full = run_policy(handle, task.tokens, task.prefill_len, full_cache, record_attention=True)
        full_accuracy.add(setup.compare(full, full, task, full_cache), task, n_ex)
        for share in params.sweep:
            for name in names:
                budget = _sweep_budget(setup.policies[name], share, task.context_len)
                pol = at_budget.get((name, budget))
                if pol is None:
                    pol = at_budget[name, budget] = dataclasses.replace(setup.policies[name], budget=budget)
                if progress:
                    progress(done / total, f"{pol.label} at {share:.0%} ...")
                run = setup.compare(full, run_policy(handle, task.tokens, task.prefill_len, pol), task, pol)
                points.setdefault((name, share), _Mean(sweep_metrics(), pol.budget)).add(run, task, n_ex)
                done += 1
    return SweepResult(model=handle.spec.label, context=context,
                       points=[SweepPoint(policy=name, share=share, budget=mean.budget, values=mean.values())
                               for (name, share), mean in points.items()],
                       full_accuracy=full_accuracy.values()["accuracy"])


@dataclass
class _Mean:
    """The running means of one sweep point: a per-answer metric over every answer of every prompt, any
    other over the prompts (a run without a value counts 0)."""

    metrics: list[Metric]
    budget: int = 0
    sums: dict[str, float] = dataclasses.field(default_factory=dict)
    answers: int = 0

    def add(self, run: PolicyRun, task: KvTask, n_ex: int) -> None:
        n_ans = len(task.answer_positions)
        self.answers += n_ans
        for m in self.metrics:
            value = m.read(run) or 0.0
            self.sums[m.name] = self.sums.get(m.name, 0.0) + (value * n_ans if m.per_answer else value / n_ex)

    def values(self) -> dict[str, float | None]:
        return {m.name: (self.sums[m.name] / self.answers if self.answers else None) if m.per_answer
                else self.sums[m.name] for m in self.metrics}


def _sweep_budget(policy: Policy, share: float, context: int) -> int:
    """The budget at `share` of the context, no lower than the policy's settings allow."""
    return max(policy.min_budget(), min(context - 1, round(share * context)))

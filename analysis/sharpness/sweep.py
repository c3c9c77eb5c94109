"""The size sweep: softmax, adaptive θ and each fixed θ at every n, on the model's retrieval prompts."""
from __future__ import annotations

from typing import Callable

from analysis.model_access.models import ModelHandle, require_kind
from analysis.framework.progress import Progress
from analysis.sharpness.attention import Recorder
from analysis.sharpness.errors import SharpnessError
from analysis.sharpness.heads import head_stats, mean_stats
from analysis.sharpness.params import SweepParams, validate_params
from analysis.sharpness.records import RunStats, SizePoint, SweepResult
from analysis.sharpness.rules import Temperature
from analysis.sharpness.scoring import score_chunk
from analysis.tasks.records import TaskError
from analysis.tasks.retrieval import RetrievalPrompt


def prompt_builder(tokenizer) -> Callable[[int, int], RetrievalPrompt]:
    """`build(n, seed)` for this tokenizer, from the task provider: Shapes World's training format for a
    tokenizer that speaks it, key-value recall for one that spells English, else numbers or its words."""
    from analysis.tasks import tasks_for

    return tasks_for(tokenizer).retrieval_builder(tokenizer)


def build_prompt(tokenizer, n: int, seed: int = 0) -> RetrievalPrompt:
    """A retrieval prompt with n items."""
    return prompt_builder(tokenizer)(n, seed)


def chunks(prompts: list[RetrievalPrompt], batch: int) -> list[list[RetrievalPrompt]]:
    """Prompts grouped by length (no padding), at most `batch` per forward."""
    by_len: dict[int, list[RetrievalPrompt]] = {}
    for pr in prompts:
        by_len.setdefault(len(pr.input_ids), []).append(pr)
    return [group[i:i + batch] for group in by_len.values() for i in range(0, len(group), batch)]


def evaluate(handle: ModelHandle, prompts: list[RetrievalPrompt], rule: Temperature, batch: int) -> RunStats:
    """Run `rule` on the prompts and average the statistics and outcomes."""
    sink, no_sink, outcomes = [], [], []
    for chunk in chunks(prompts, batch):
        rec = Recorder()
        outcomes += score_chunk(handle, chunk, rule, rec)
        targets = [p.target for p in chunk]
        sink.append(head_stats(rec, targets, False))
        no_sink.append(head_stats(rec, targets, True))
    count = len(prompts)
    return RunStats(rule=rule, accuracy=sum(o.correct for o in outcomes) / count,
                    answer_prob=sum(o.prob for o in outcomes) / count,
                    runner_up=sum(o.near for o in outcomes) / count,
                    with_sink=mean_stats(sink), without_sink=mean_stats(no_sink))


def prompts_for(build: Callable, n: int, params: SweepParams, limit: int) -> list[RetrievalPrompt] | None:
    """The n-item prompts of the sweep, or None when the task cannot write n items or they exceed `limit` tokens."""
    try:
        prompts = [build(n, params.seed + k) for k in range(params.samples)]
    except TaskError:
        return None
    return prompts if max(len(p.input_ids) + _tree_size(p) for p in prompts) <= limit else None


def _tree_size(prompt: RetrievalPrompt) -> int:
    return max((len(c) - 1 for c in prompt.candidates), default=0)


def size_sweep(handle: ModelHandle, params: SweepParams | None = None,
               progress: Progress | None = None) -> SweepResult:
    """Softmax, adaptive θ and each fixed θ at every n: head statistics, accuracy, answer probability."""
    params = params or SweepParams()
    require_kind(handle, "causal_lm", "vlm", panel="attention sharpness")
    validate_params(params, handle.info.layers)
    limit = handle.info.max_positions or 4096
    rules = params.temperatures()
    points, skipped, example = [], [], None
    ns = sorted(set(params.ns))
    build = prompt_builder(handle.tokenizer)
    for i, n in enumerate(ns):
        prompts = prompts_for(build, n, params, limit)
        if prompts is None:
            skipped.append(n)
            continue
        example = example or prompts[0]
        runs = []
        for j, rule in enumerate(rules):
            if progress:
                progress((i * len(rules) + j) / (len(ns) * len(rules)), f"n = {n}, {rule.label}")
            runs.append(evaluate(handle, prompts, rule, params.batch))
        tokens = round(sum(len(p.input_ids) for p in prompts) / len(prompts))
        chance = [p.chance for p in prompts]
        points.append(SizePoint(n=n, tokens=tokens, runs=runs,
                                chance=None if None in chance else sum(chance) / len(chance)))
    if not points:
        raise SharpnessError(f"No chosen n can be run: the prompts would be longer than the model's {limit} "
                             "positions (or hold more items than the task can write).")
    if progress:
        progress(1.0, "done")
    return SweepResult(model=handle.spec.label, params=params, format=example.format, example=example,
                       points=points, skipped=skipped, layers=handle.info.layers, heads=handle.info.heads,
                       task=example.task)

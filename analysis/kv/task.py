"""The prompt of one analysis: the user's own, continued by the full cache, or the model's recall task
(asked of the task provider: analysis/tasks/)."""
from __future__ import annotations

from analysis.kv.params import KvEvictionError, KvParams
from analysis.kv.policies import FullCache
from analysis.kv.runner import run_policy
from analysis.model_access.models import ModelHandle
from analysis.tasks import KvTask, tasks_for, with_questions


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
        task = with_questions(ids, [], params.prefill, "custom prompt")
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


def text_start(task: KvTask) -> int:
    """Where the generated-text comparison starts: the first answer, or the end of a custom prompt."""
    return task.answer_positions[0] if task.answer_positions else task.context_len

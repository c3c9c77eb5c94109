"""How much work a KV-cache analysis is, counted from its settings (analysis/framework/cost.py prices it)."""
from __future__ import annotations

from analysis.framework.cost import Work, continuation, sequence
from analysis.kv.params import KvParams, main_policies, validate_params
from analysis.kv.policies import POLICIES
from analysis.kv.task import build_task, text_start
from analysis.model_access.models import ModelHandle

HOOK_OVERHEAD = 1.6  # decode steps with eviction hooks (select + gather per layer) vs a plain call


def task_shape(handle: ModelHandle, params: KvParams) -> tuple[int, int, int]:
    """(task length, prefill length, start of the generated-text comparison) without running the model."""
    if params.prompt.strip():
        n = len(handle.tokenizer(params.prompt, add_special_tokens=True)["input_ids"])
        total = n + params.generated
        return total, max(1, round(params.prefill * n)), n
    task = build_task(handle, params)
    return len(task.tokens), task.prefill_len, text_start(task)


def analyze_work(handle: ModelHandle, params: KvParams, kwargs: dict) -> Work:
    """`analyze`: every policy's run (the full cache's included), then each shown text continued from its run.
    Settings the analysis would refuse are refused here, before any estimate is shown."""
    validate_params(params)
    total, prefill, start = task_shape(handle, params)
    runs = len(POLICIES)  # full and every other policy (the chosen one's kept sets come from its run among them)
    main = main_policies()
    texts = len(main) + (0 if params.policy in main else 1)  # generated text: main policies (+ a chosen variant)
    work = Work()
    if params.prompt.strip():  # the reference continuation is generated first
        work.add(**vars(sequence(start, start, generate=params.generated)))
    work.add(**vars(sequence(prefill, total, overhead=HOOK_OVERHEAD)), times=runs)
    # each text continues its policy's own run from `start` (a fork): only the generated tokens are new
    work.add(**vars(continuation(start, params.generated, overhead=HOOK_OVERHEAD)), times=texts)
    return work


def sweep_work(handle: ModelHandle, params: KvParams, kwargs: dict) -> Work:
    """`budget_sweep`: per prompt, the full cache and every named policy at every budget share."""
    total, prefill, _ = task_shape(handle, params)
    examples = 1 if params.prompt.strip() else max(1, params.examples)
    names = [n for n in (kwargs.get("names") or POLICIES) if n != "full"]
    runs = examples * (1 + len(params.sweep) * len(names))
    return Work().add(**vars(sequence(prefill, total, overhead=HOOK_OVERHEAD)), times=runs)


def long_work(handle: ModelHandle, params: KvParams, kwargs: dict) -> Work:
    """`long_response`: the full cache's answer, then each policy's (prompt read once, up to `response` tokens
    each; answers that end earlier cost less), and one plain forward over each policy's prompt and answer."""
    from analysis.kv.longresp import long_task

    validate_params(params)
    prompt = len(long_task(handle, params).tokens)
    names = kwargs.get("names") or [n for n in main_policies() if n != "full"]
    runs = len(names) + (0 if params.policy in names or params.policy == "full" else 1)
    total = prompt + params.response
    work = Work().add(**vars(sequence(prompt, prompt, generate=params.response, overhead=HOOK_OVERHEAD)),
                      times=1 + runs)
    work.add(calls=1, tokens=total, attended=total * (total + 1) / 2, times=runs)
    return work

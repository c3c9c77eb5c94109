"""How much work a sharpness analysis is, counted from its settings (analysis/framework/cost.py prices it)."""
from __future__ import annotations

from analysis.framework.cost import Work
from analysis.model_access.models import ModelHandle
from analysis.sharpness.params import SweepParams, validate_params
from analysis.sharpness.prompt import PromptParams, prompt_ids
from analysis.sharpness.scoring import tree_nodes
from analysis.sharpness.sweep import chunks, prompt_builder, prompts_for

# The temperature attention function with its recorder, against a plain eager call: the extra per-call
# Python work and the second softmax pass of the adaptive rule.
TEMPERATURE_OVERHEAD = 1.5


def sweep_work(handle: ModelHandle, params: SweepParams, kwargs: dict) -> Work:
    """`size_sweep`: per n, every rule over the prompts, one forward per chunk of equal-length prompts,
    each row the prompt plus its chunk's candidate tree. Settings the sweep refuses are refused here."""
    validate_params(params, handle.info.layers)
    build = prompt_builder(handle.tokenizer)
    limit = handle.info.max_positions or 4096
    rules = len(params.temperatures())
    work = Work()
    for n in sorted(set(params.ns)):
        prompts = prompts_for(build, n, params, limit)
        if prompts is None:
            continue
        for chunk in chunks(prompts, params.batch):
            rows, extra = len(chunk), len(tree_nodes(chunk))
            length = len(chunk[0].input_ids) + extra
            work.add(calls=1, tokens=rows * length, logits=rows * extra, overhead=TEMPERATURE_OVERHEAD - 1,
                     attended=rows * length * (length + 1) / 2 * TEMPERATURE_OVERHEAD, times=rules)
    return work


def prompt_work(handle: ModelHandle, params: PromptParams, kwargs: dict) -> Work:
    """`analyse_prompt`: the prompt under softmax and under the chosen rule."""
    n = len(prompt_ids(handle.tokenizer, params.text))
    return Work().add(calls=1, tokens=n, attended=n * (n + 1) / 2 * TEMPERATURE_OVERHEAD,
                      overhead=TEMPERATURE_OVERHEAD - 1, times=2)

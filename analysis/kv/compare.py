"""Each policy against the full cache on identical tokens: KL, top-1 agreement, attention recall, needle
survival and answer accuracy."""
from __future__ import annotations

import torch

from analysis.kv.policies import Policy
from analysis.kv.records import PolicyRun
from analysis.kv.runner import Trace
from analysis.tasks.records import KvTask


def present_positions(trace: Trace, step: int, layer: int) -> torch.Tensor:
    """(H_kv, K) original positions cached when the query of decode step `step` attended in `layer`: the
    previous step's kept entries and its own ("after" policies), or the step's own selection ("before":
    MorphKV selects first; its query heads may each see a subset of that, see runner.py)."""
    if trace.timing == "before" and trace.kept[step][layer] is not None:
        return trace.kept[step][layer]
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
    survival = needle_survival(run, task, layers)
    preds = [int(lp[a - task.prefill_len].argmax()) for a in task.answer_positions]
    accuracy = (sum(int(p == task.tokens[a]) for p, a in zip(preds, task.answer_positions)) / len(preds)
                if preds else None)
    steps = len(run.cache_len)
    held = policy.held(len(run.cache_len[0]), run.prompt_len, run.prompt_len + steps) if steps else []
    return PolicyRun(
        policy=policy.name, label=policy.label, budget=policy.budget, kl=kl.tolist(), top1=top1.tolist(),
        dnll=dnll.tolist(), recall=recall, needle_survival=survival, accuracy=accuracy, answers=preds,
        cache_len=[sum(lens[l] for l in layers) / len(layers) for lens in run.cache_len], cache_bytes=run.cache_bytes,
        analytic_bytes=run.analytic_bytes, step_ms=[1000 * t for t in run.step_time],
        claimed=sum(held[l] for l in layers) / len(layers) if held else 0.0,
        evicted_bytes=[sum(b[l] for l in layers) for b in run.layer_bytes or []],
        # the analytic size is per_entry * sum of lengths: the evictable layers' share of it, exactly
        evicted_analytic=[a * sum(lens[l] for l in layers) // max(1, sum(lens))
                          for a, lens in zip(run.analytic_bytes, run.cache_len)],
    )


def needle_survival(run: Trace, task: KvTask, layers: list[int]) -> list[list[float]]:
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

"""KV-cache eviction: which cached tokens each policy keeps, step by step, and what it costs.

Read in this order:
- `base.py`: the `Policy` base (timing: "after" or "before" the current query attends), helpers, `POLICIES`;
- `policies.py`: one small class per policy (StreamingLLM, H2O, TOVA; SnapKV and PyramidKV in `snapkv.py`,
  MorphKV and its 8903d2a variant in `morphkv.py`), each owning and validating its settings, registered
  in `POLICIES`;
- `params.py`: `KvParams` (the task's settings and `{policy name: its settings}`), `validate_params`;
  `KvState`, the page's own controls (layer, head, metric); `presets.py`: the panel's presets;
- `runner.py`: `run_policy`, the one decode loop that hooks the model and evicts;
- `task.py`: the prompt (the user's own, or the model's recall task from analysis/tasks/);
- `compare.py`: each policy against the full cache on identical tokens (a `PolicyRun`);
- `metrics.py`: `METRICS`, what the page's table, the CLI's table and the budget sweep read off a run;
- `analysis.py`: `analyze` (every policy at one budget) and `budget_sweep` (the retrieval task);
- `longresp.py`: `long_response` (every policy writes its own long answer at budget C);
- `records.py`: the typed results; `cost.py`: their work counts; `cli.py`: `python -m analysis kv`.
"""
from __future__ import annotations

from analysis.kv.analysis import analyze, budget_sweep, check_params, generate_texts
from analysis.kv.cli import cli
from analysis.kv.cost import analyze_work, long_work, sweep_work
from analysis.kv.longresp import LongResult, LongRun, long_response
from analysis.kv.metrics import METRICS, Metric
from analysis.kv.compare import compare, needle_survival, present_positions
from analysis.kv.params import (KvEvictionError, KvParams, KvState, main_policies, make_policy, policy_settings,
                                validate_params)
from analysis.kv.policies import (
    H2O, POLICIES, TOVA, FullCache, LayerState, MorphKV, MorphKV8903, Policy, PyramidKV, PyramidKVPrefill,
    Selection, SnapKV, SnapKVPrefill, StreamingLLM, gather_kv, gather_q, group_reduce, top_plus_recent,
)
from analysis.kv.presets import PRESETS
from analysis.kv.records import GeneratedText, KvResult, PolicyRun, SweepPoint, SweepResult
from analysis.kv.runner import Trace, evictable_layers, run_policy
from analysis.kv.task import build_task, text_start
from analysis.framework.panels import Analysis, Run
from analysis.tasks import KvTask

ANALYSIS = Analysis(
    name="kv", title="KV-cache eviction", icon=":material/memory:", page="kv_cache.py",
    summary="Which cached tokens StreamingLLM, H2O, TOVA, SnapKV and MorphKV keep, step by step, and what it "
            "costs in quality and memory.",
    paper="MorphKV (ICML 2025)", kinds=("causal_lm", "vlm"),
    runs=(Run(analyze, analyze_work), Run(budget_sweep, sweep_work), Run(long_response, long_work)),
    cli=cli, params=KvParams, view_state=KvState, presets=PRESETS,
)

__all__ = [
    "ANALYSIS", "METRICS", "Metric", "analyze", "budget_sweep", "check_params", "generate_texts", "cli", "compare", "needle_survival",
    "present_positions", "KvEvictionError", "KvParams", "main_policies", "make_policy", "policy_settings",
    "validate_params", "KvState", "H2O", "POLICIES", "TOVA", "FullCache", "LayerState", "MorphKV", "MorphKV8903", "Policy", "Selection",
    "PyramidKV", "PyramidKVPrefill", "SnapKV", "SnapKVPrefill", "StreamingLLM", "gather_kv", "gather_q",
    "group_reduce", "top_plus_recent", "GeneratedText", "KvResult", "PolicyRun", "SweepPoint", "SweepResult", "Trace",
    "evictable_layers", "run_policy", "build_task", "text_start", "KvTask", "LongResult", "LongRun", "long_response",
]

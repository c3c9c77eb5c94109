"""The settings of one KV-cache analysis: the task's own, and each policy's, by policy name.

A policy owns its settings (its dataclass fields in `policies.py`); `KvParams.policies` holds them as
`{policy name: {setting: value}}`, never a flat copy. A link and the command line carry each setting once
by its field name (`?snap_window=8`, `--snap-window 8`): `policy_settings` gives it to every policy that
declares it (SnapKV's and PyramidKV's window are one control).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from analysis.framework.errors import SettingsError
from analysis.kv.metrics import metric, sweep_metrics
from analysis.kv.policies import POLICIES, Policy
from analysis.framework.results import Result
from analysis.framework.settings import Flat, check_settings, setting


class KvEvictionError(SettingsError):
    """Settings this model cannot run, or a model whose cache cannot be evicted; the message is for the user."""


def policy_settings(**flat) -> dict[str, dict]:
    """{policy name: its settings} from settings named by field (`sinks=4, snap_window=8`): each goes to every
    policy that declares a field of that name; names no policy declares are refused."""
    return POLICIES.split_settings(**flat)


TASKS = {"retrieval": "Retrieval (needles)", "long-response": "Long response"}  # short: whole at 1024 px


@dataclass
class KvParams(Flat, Result):
    """Everything one analysis needs; every field is validated from its description (analysis/framework/settings.py).
    Page groups: `main` (one row), `policies` (each policy's settings), `retrieval` / `long` (the task's),
    `task` (both tasks'), `prompt`, `sweep` (drawn by the budget sweep)."""

    METHODS = (("policies", POLICIES),)  # the policies' own settings travel flat: ?snap_window=8, --snap-window 8

    task: str = setting("retrieval", label="Task", choices=list(TASKS), labels=TASKS, group="main", span=3,
                        help="Retrieval: needles hidden in a context, then asked (teacher-forced). Long response: the "
                             "prompt read in one forward, then every policy writes its own long answer.")
    policy: str = setting("morphkv", label="Policy", choices=POLICIES.names, labels=POLICIES.label, group="main",
                          span=4, help="Full cache keeps everything (the reference). Variants are labelled as such.")
    budget: int = setting(64, label="Budget C (entries per head)", low=1, high=100_000, group="main", span=2,
                          help="Cache entries kept per layer and KV head.")
    policies: dict[str, dict] = field(default_factory=dict)  # policy name -> its settings (defaults when absent)
    prompt: str = setting("", label="Your own prompt (optional)", high=20_000, group="prompt", width="stretch",
                          help="Leave empty for the key-value recall task. With a prompt, the full cache's greedy "
                               "continuation is the reference every policy is scored on.")
    new_tokens: int = setting(24, label="Generated tokens", low=0, high=4096, group="retrieval",
                              help="Tokens generated after a custom prompt (and for the text comparison).")
    response: int = setting(96, label="Response tokens (long response)", low=8, high=4096, group="long", width=230,
                            help="Long response: tokens each policy may write (its answer ends earlier at end-of-text).")
    seed: int = setting(0, label="Example seed", low=0, high=2**31 - 1, group="task")
    pairs: int = setting(2, label="Needles", low=1, high=64, group="retrieval",
                         help="Key-value pairs hidden in the context.")
    queries: int = setting(1, label="Questions", low=1, high=64, group="retrieval",
                           help="Needles asked after the context (shapes-lm was trained on one).")
    prefill: float = setting(0.5, label="Prefilled share", low=0.05, high=1.0, step=0.05, widget="slider",
                             group="retrieval", width=270,
                             help="Share of the context read in one forward pass; the rest is read token by "
                                  "token, with eviction after every token.")
    examples: int = setting(1, label="Prompts averaged", low=1, high=10_000, group="sweep",
                            help="Budget sweep: key-value prompts averaged (seeds seed, seed+1, ...).")
    context: int = setting(192, label="Context (tokens)", low=8, high=100_000, step=32, group="retrieval",
                           help="Length of the key-value context.")
    sweep: list[float] = setting(label="Sweep budget shares", low=0.01, high=0.99, item=float, min_items=1,
                                 default_factory=lambda: [0.25, 0.5, 0.75], group="sweep", width=200,
                                 help="Budgets of the sweep, as shares of the context (comma-separated).")

    @property
    def generated(self) -> int:
        """Tokens each policy generates for the text comparison (and after a custom prompt): at least two."""
        return max(2, self.new_tokens)

    @classmethod
    def from_dict(cls, data: dict) -> "KvParams":
        """Also reads saved analyses of the flat layout (`sinks`, `snap_window`, ... beside the task's settings)."""
        data = dict(data)
        flat = {f.name: data.pop(f.name) for f, _ in POLICIES.settings() if f.name in data}
        if flat:
            nested = policy_settings(**flat)
            for name, values in (data.get("policies") or {}).items():
                nested.setdefault(name, {}).update(values)
            data["policies"] = nested
        return super().from_dict(data)


def _sweep_metric_names() -> list[str]:
    return [m.name for m in sweep_metrics()]  # read when drawn: a metric added to METRICS is a choice at once


def _metric_label(name: str) -> str:
    return metric(name).label


POSITION_METRICS = {"top1": "top-1 agreement", "same": "identical so far", "kl": "KL"}


@dataclass
class KvState:
    """The KV page's own controls: which part of a result it shows (never passed to the analysis)."""

    layer: int = setting(0, label="Layer", low=0, high=10_000, widget="select",
                         help="The evictable layer the heatmap shows.")
    head: int = setting(0, label="KV head", low=0, high=10_000, widget="select")
    metric: str = setting("accuracy", label="Metric", choices=_sweep_metric_names, labels=_metric_label,
                          widget="radio", help="What the budget sweep plots (analysis/kv/metrics.py).")
    position_metric: str = setting("top1", label="By position", choices=list(POSITION_METRICS),
                                   labels=POSITION_METRICS, widget="radio",
                                   help="Long response: what the by-position chart plots.")


def make_policy(params: KvParams, name: str | None = None, budget: int | None = None) -> Policy:
    """The policy `name` (default: params.policy) with its settings in params, validated."""
    name = name or params.policy
    return POLICIES.create(name, **params.policies.get(name, {}), budget=params.budget if budget is None else budget)


def main_policies() -> list[str]:
    """The policies of the equal-entries comparison (labelled variants left out)."""
    return [name for name, cls in POLICIES.items() if not getattr(cls, "variant", False)]


def validate_params(params: KvParams, *, check_budget: bool = True) -> dict[str, Policy]:
    """One validation path for the CLI, the URL and the page: raises SettingsError with a one-line message.
    Every policy's settings are checked by its class as it is built (at the chosen budget when `check_budget`,
    else at a budget no setting refuses); the built policies are returned, by name in the registry's order,
    so an analysis builds each policy once."""
    check_settings(params)
    for name, values in params.policies.items():
        POLICIES.get(name)  # an unknown name: UnknownMethod
        unknown = set(values) - set(POLICIES.get(name).__dataclass_fields__)
        if unknown:
            raise SettingsError(f"{POLICIES.label(name)} has no setting(s) {', '.join(sorted(unknown))}.")
    return {name: make_policy(params, name, None if check_budget else 10**9) for name in POLICIES}

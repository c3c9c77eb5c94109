"""The KV panel's metrics, as data: each is a name, its labels and how it is read from one policy's run
against the full cache (a `PolicyRun`, compare.py).

The page's table of policies, the command line's table and the budget sweep (its points, its chart and the
page's choice of what the chart plots) all read `METRICS`: adding a metric is one entry below. A metric
measured in the sweep travels in saved results under its name, so a name stays stable once used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _last(values: list[float]) -> float | None:
    return values[-1] if values else None


@dataclass(frozen=True)
class Metric:
    name: str  # the sweep point's key in saved results and the page's `metric` choice: keep it stable
    label: str  # short: the chart's choice and the command line's column
    read: Callable[[Any], float | None]  # its value for one PolicyRun; None where there is none
    column: str = ""  # the page table's header (default: label)
    title: str = ""  # the sweep chart's title (default: label)
    axis: str = ""  # the sweep chart's y axis, with its unit (default: label)
    digits: int = 3
    per_answer: bool = False  # the sweep averages it over every answer of every prompt, else over prompts
    table: bool = True  # a column of the page's and the command line's table of policies
    sweep: bool = True  # measured at every point of the budget sweep (and a choice of its chart)

    def value(self, run) -> float | None:
        """Its value for `run`, rounded to `digits` (None stays None)."""
        value = self.read(run)
        return None if value is None else round(value, self.digits)

    @property
    def header(self) -> str:
        return self.column or self.label


METRICS: list[Metric] = [
    Metric("accuracy", "key-value accuracy", lambda r: r.accuracy, title="Key-value recall accuracy",
           axis="accuracy (share of answers)", per_answer=True),
    Metric("mean_kl", "mean KL", lambda r: r.mean_kl, column="mean KL (nats)", title="Mean KL(full ‖ policy)",
           axis="KL divergence (nats)", digits=4),
    Metric("agreement", "top-1 agreement", lambda r: r.agreement, title="Top-1 agreement with the full cache",
           axis="share of steps"),
    Metric("dnll", "mean ΔNLL", lambda r: _mean(r.dnll) or 0.0, column="mean ΔNLL (nats)", digits=4, sweep=False),
    Metric("recall", "attention recall", lambda r: r.mean_recall, title="Attention recall",
           axis="share of full-cache attention kept"),
    Metric("needle_survival", "needle survival", lambda r: _mean([x for row in r.needle_survival for x in row]),
           sweep=False),
    Metric("cache", "cache held", lambda r: _last(r.cache_len),
           column="cache entries per head (last step, mean over layers)",
           title="Cache actually held at the last token", axis="entries per KV head (mean over layers)", digits=1),
    # what the policy's own rule says it holds then (Policy.held): the tests hold every row to cache == claimed
    Metric("claimed", "cache its rule claims", lambda r: r.claimed,
           column="cache entries its rule claims (last step)", title="Cache the policy's rule claims at the last token",
           axis="entries per KV head (mean over layers)", digits=1),
    Metric("kib", "cache KiB", lambda r: None if not r.cache_bytes else r.cache_bytes[-1] / 1024,
           column="cache KiB (last step)", digits=1, sweep=False),
    Metric("step_ms", "ms / decode step", lambda r: _mean(r.step_ms) or 0.0, digits=2, sweep=False),
]


def table_metrics() -> list[Metric]:
    return [m for m in METRICS if m.table]


def sweep_metrics() -> list[Metric]:
    return [m for m in METRICS if m.sweep]


def metric(name: str) -> Metric:
    for m in METRICS:
        if m.name == name:
            return m
    raise KeyError(name)

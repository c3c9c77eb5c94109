"""`python -m analysis kv ...`: every policy at one budget, or a budget sweep; flags made from the settings
of the panel's Params (KvParams, as ANALYSIS declares it) and of every policy (analysis/framework/settings.py), so
ranges and help are the page's, and a setting added to the Params is a flag with no edit here."""
from __future__ import annotations

import argparse

from analysis.framework.errors import SettingsError
from analysis.kv.analysis import analyze, budget_sweep
from analysis.kv.longresp import LongResult, long_response
from analysis.kv.metrics import sweep_metrics, table_metrics
from analysis.kv.params import KvParams, validate_params
from analysis.kv.policies import POLICIES
from analysis.framework.settings import ArgumentParser, add_arguments, labelled, parse_text, read_arguments


def params_class() -> type[KvParams]:
    """The Params the panel declares (ANALYSIS.params: KvParams, or a subclass a test declares)."""
    from analysis.framework import panels

    return panels.load("kv").params


def task_fields() -> list[tuple]:
    """Every flag but --sweep (its own flag, optional value): the Params' settings and the policies'."""
    return [(f, owner) for f, owner in params_class().flat_fields() if f.name != "sweep"]


def parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m analysis kv", description="KV-cache eviction policies.")
    ap.add_argument("--model", default="zoo:shapes-lm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    add_arguments(ap, task_fields())
    ap.add_argument("--window", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sweep", nargs="?", const=",".join(map(str, KvParams().sweep)), default=None,
                    help="budget sweep instead, at these shares of the context (default 0.25,0.5,0.75)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


def params_from(args: argparse.Namespace) -> KvParams:
    if args.window is not None:
        raise SettingsError("--window is gone: each policy has its own (--snap-window for SnapKV/PyramidKV, "
                            "--morph-window for MorphKV's R; H2O splits the budget with --heavy-share).")
    cls = params_class()
    values = read_arguments(args, task_fields())
    if args.sweep is not None:
        try:
            values["sweep"] = parse_text(next(f for f in labelled(cls) if f.name == "sweep"), args.sweep, cls)
        except ValueError:
            raise SettingsError(f"--sweep takes comma-separated shares of the context, got '{args.sweep}'.") from None
    return cls.from_flat(values)


def cli(argv: list[str]) -> int:
    from analysis.model_access.models import ModelSpec, load_model

    args = parser().parse_args(argv)
    params = params_from(args)
    validate_params(params, check_budget=args.sweep is None)  # before loading the model: bad input fails fast
    if args.sweep is not None and params.task == "long-response":
        raise SettingsError("--sweep runs the retrieval task; benchmarks/kv_longresp.py sweeps budgets on long "
                            "responses (or run --task long-response once per --budget).")
    handle = load_model(ModelSpec.parse(args.model))
    if params.task == "long-response":
        result = long_response(handle, params)
    else:
        result = budget_sweep(handle, params) if args.sweep is not None else analyze(handle, params)
    if args.json:
        print(result.to_json())
    elif isinstance(result, LongResult):
        print_long(result)
    elif args.sweep is not None:
        print(f"context {result.context} tokens; full-cache accuracy {result.full_accuracy}")
        metrics = sweep_metrics()
        print(_row(["policy", "share", "budget", *(m.header for m in metrics)]))
        print(_row(["---"] * (3 + len(metrics))))
        for pt in result.points:
            print(_row([POLICIES.label(pt.policy), f"{pt.share:.0%}", pt.budget,
                        *(_cell(pt.values.get(m.name), m.digits) for m in metrics)]))
    else:
        print(f"{result.task.source}: context {result.task.context_len} tokens, budget {params.budget}")
        metrics = table_metrics()
        print(_row(["policy", *(m.header for m in metrics)]))
        print(_row(["---"] * (1 + len(metrics))))
        for r in result.runs:
            print(_row([r.label, *(_cell(m.value(r), m.digits) for m in metrics)]))
    return 0


def _row(cells: list) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def _cell(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def print_long(result: LongResult) -> None:
    task = result.task
    print(f"{task.source}: prompt {len(task.tokens)} tokens, budget {result.params.budget}, "
          f"up to {task.max_new} generated tokens")
    print("| policy | answer tokens | item recall | item precision | top-1 agreement | mean KL | identical for "
          "(tokens) | cache entries (last step) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in result.runs:
        def share(x):
            return "n/a" if x is None else f"{x:.2f}"
        print(f"| {r.label} | {len(r.generated)} | {share(r.recall)} | {share(r.precision)} | {r.agreement:.2f} | "
              f"{sum(r.kl) / max(1, len(r.kl)):.4f} | {int(sum(r.same))} | {r.cache_len[-1] if r.cache_len else 0:g} |")

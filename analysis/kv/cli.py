"""`python -m analysis kv ...`: every policy at one budget, or a budget sweep; flags made from the settings
of KvParams and of every policy (analysis/settings.py), so ranges and help are the page's."""
from __future__ import annotations

import argparse

from analysis.errors import SettingsError
from analysis.kv.analysis import analyze, budget_sweep
from analysis.kv.longresp import LongResult, long_response
from analysis.kv.params import KvParams, policy_settings, validate_params
from analysis.kv.policies import POLICIES
from analysis.settings import ArgumentParser, add_arguments, labelled, parse_text, read_arguments

TASK_FIELDS = [(f, KvParams) for f in labelled(KvParams) if f.name != "sweep"]
SWEEP_FIELD = next(f for f in labelled(KvParams) if f.name == "sweep")


def parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m analysis kv", description="KV-cache eviction policies.")
    ap.add_argument("--model", default="zoo:shapes-lm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    add_arguments(ap, TASK_FIELDS)
    add_arguments(ap, POLICIES.settings())
    ap.add_argument("--window", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sweep", nargs="?", const=",".join(map(str, KvParams().sweep)), default=None,
                    help="budget sweep instead, at these shares of the context (default 0.25,0.5,0.75)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


def params_from(args: argparse.Namespace) -> KvParams:
    if args.window is not None:
        raise SettingsError("--window is gone: each policy has its own (--snap-window for SnapKV/PyramidKV, "
                            "--morph-window for MorphKV's R; H2O splits the budget with --heavy-share).")
    values = read_arguments(args, TASK_FIELDS)
    if args.sweep is not None:
        try:
            values["sweep"] = parse_text(SWEEP_FIELD, args.sweep, KvParams)
        except ValueError:
            raise SettingsError(f"--sweep takes comma-separated shares of the context, got '{args.sweep}'.") from None
    return KvParams(**values, policies=policy_settings(**read_arguments(args, POLICIES.settings())))


def cli(argv: list[str]) -> int:
    from analysis.models import ModelSpec, load_model

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
        print("| policy | share | budget | accuracy | mean KL | top-1 agreement | recall | cache held |")
        print("|---|---|---|---|---|---|---|---|")
        for pt in result.points:
            acc = "n/a" if pt.accuracy is None else f"{pt.accuracy:.2f}"
            print(f"| {POLICIES.label(pt.policy)} | {pt.share:.0%} | {pt.budget} | {acc} | {pt.mean_kl:.4f} | "
                  f"{pt.agreement:.2f} | {pt.recall:.3f} | {pt.cache:g} |")
    else:
        print(f"{result.task.source}: context {result.task.context_len} tokens, budget {params.budget}")
        print("| policy | accuracy | mean KL | top-1 agreement | recall | cache entries (last step) |")
        print("|---|---|---|---|---|---|")
        for r in result.runs:
            acc = "n/a" if r.accuracy is None else f"{r.accuracy:.2f}"
            print(f"| {r.label} | {acc} | {r.mean_kl:.4f} | {r.agreement:.2f} | {r.mean_recall:.3f} | "
                  f"{r.cache_len[-1] if r.cache_len else 0:g} |")
    return 0


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

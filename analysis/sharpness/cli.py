"""`python -m analysis sharpness ...`: the size sweep from the shell; flags made from the settings of
SweepParams and of the temperature rules (analysis/framework/settings.py), so ranges and help are the page's."""
from __future__ import annotations

import argparse

from analysis.framework.errors import SettingsError
from analysis.framework.settings import ArgumentParser, add_arguments, labelled, read_arguments, to_text
from analysis.sharpness.params import SweepParams, validate_params
from analysis.sharpness.records import SweepResult
from analysis.sharpness.rules import RULES, rule_settings
from analysis.sharpness.sweep import size_sweep

FIELDS = [(f, SweepParams) for f in labelled(SweepParams)]


def parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m analysis sharpness",
                        description="Attention sharpness vs n, θ sweep, adaptive temperature.")
    ap.add_argument("--model", default="zoo:shapes-lm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    add_arguments(ap, FIELDS)
    add_arguments(ap, RULES.settings())
    ap.add_argument("--layers", default="", help="apply the temperatures only in these layers (default: all)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


def params_from(args: argparse.Namespace) -> SweepParams:
    values = read_arguments(args, FIELDS)
    layers = []
    for item in (x.strip() for x in args.layers.split(",")):
        if not item:
            continue
        try:
            layers.append(int(item))
        except ValueError:
            raise SettingsError(f"--layers must be comma-separated whole numbers; '{item}' is not one.") from None
    for layer in layers:
        if layer < 0:
            raise SettingsError(f"Each layer in --layers must be at least 0, got {layer}.")
    rules = rule_settings(**read_arguments(args, RULES.settings()))
    return SweepParams(**values, layers=layers or None, rules=rules)


def print_tables(result: SweepResult) -> None:
    params = result.params
    print(f"{result.model}: {result.task} ({result.format} format), {params.samples} prompts per n\n")
    _markdown(result.accuracy_table())
    print(f"\nRetrieval heads (the most softmax weight on the answer item at n = {result.points[0].n}):\n")
    _markdown(result.head_table())
    if result.skipped:
        print(f"\nskipped (more items than the task writes, or longer than the context): {result.skipped}")


def _markdown(rows: list[dict]) -> None:
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else to_text(v) for v in row.values()) + " |")


def cli(argv: list[str]) -> int:
    from analysis.model_access.models import ModelSpec, load_model

    args = parser().parse_args(argv)
    params = params_from(args)
    validate_params(params)  # before loading the model: bad input fails fast
    result = size_sweep(load_model(ModelSpec.parse(args.model)), params)
    if args.json:
        print(result.to_json())
    else:
        print_tables(result)
    return 0

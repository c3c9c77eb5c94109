"""`python -m analysis invert ...`: reconstruct a prompt from its layer-L states. Flags made from the settings
of AttackParams and of every defence and proposal order (analysis/framework/settings.py), so ranges and help are the
page's; `--defence` (repeatable), `--exhaustive` and `--json` are the command's own."""
from __future__ import annotations

import argparse

from analysis.inversion.attack import reconstruct
from analysis.inversion.defences import DEFENCES, NO_DEFENCE
from analysis.inversion.params import AttackParams, method_fields, method_settings, validate_params
from analysis.framework.settings import ArgumentParser, add_arguments, labelled, read_arguments

ATTACK_FIELDS = [(f, AttackParams) for f in labelled(AttackParams) if f.metadata.get("cli", f.name)]


def parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m analysis invert",
                        description="Reconstruct a prompt from its layer-L hidden states.")
    ap.add_argument("--model", default="zoo:shapes-lm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    ap.add_argument("--prompt", required=True)
    add_arguments(ap, ATTACK_FIELDS)
    add_arguments(ap, method_fields())
    ap.add_argument("--defence", action="append", default=[], choices=[NO_DEFENCE, *DEFENCES],
                    help="repeat to combine, e.g. --defence shuffle_both --defence gaussian_noise")
    ap.add_argument("--exhaustive", action="store_true", help="score the whole vocabulary (baseline)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


def params_from(args: argparse.Namespace) -> AttackParams:
    return AttackParams(prompt=args.prompt, defences=args.defence, exhaustive=args.exhaustive,
                        **read_arguments(args, ATTACK_FIELDS),
                        methods=method_settings(**read_arguments(args, method_fields())))


def cli(argv: list[str]) -> int:
    from analysis.model_access.models import ModelSpec, load_model

    args = parser().parse_args(argv)
    params = params_from(args)
    validate_params(params)  # before loading the model: a bad setting fails at once (one `error:` line)
    handle = load_model(ModelSpec.parse(args.model))
    result = reconstruct(handle, params)
    if args.json:
        print(result.to_json())
        return 0
    print(f"{result.model}, layer {params.layer}, defences: {', '.join(params.defences) or 'none'}")
    print(f"accuracy {result.accuracy:.0%}, {result.evaluations:,} candidate evaluations, {result.seconds:.2f} s")
    for t in result.tokens:
        mark = "ok " if t.correct else "BAD"
        print(f"{t.position:4d} {mark} {t.true_token!s:>14} -> {t.recovered_token!s:<14} "
              f"dist {t.distance:.3g} rank {t.rank} evals {t.evaluations}")
    return 0

"""Command line: `python -m analysis <command> ... [--json]`.

The panels' commands come from the panel table (analysis/framework/panels.py): each panel's `ANALYSIS.cli(argv)`.
A package is imported only when its command runs, so one slow import (sae-lens) never slows the others.
Every user-facing error (analysis/framework/errors.py) is printed as one `error: ...` line with exit status 1.
"""
from __future__ import annotations

import importlib
import sys

from analysis.framework import panels
from analysis.model_access import threads
from analysis.framework.errors import UserError

# Commands that are not panels: (module with `cli(argv)`, help).
TOOLS = {
    "info": ("analysis.model_access.models", "describe a model"),
}


def commands() -> dict[str, str]:
    """Every command with its one-line help, panels first (in the table's order)."""
    out = {e.name: e.help for e in panels.TABLE}
    out.update({name: help_text for name, (_, help_text) in TOOLS.items()})
    return out


def _command(name: str):
    if name in TOOLS:
        return importlib.import_module(TOOLS[name][0]).cli
    analysis = panels.load(name)
    if analysis.cli is None:
        raise UserError(f"the {name} panel has no command line.")
    return analysis.cli


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    known = commands()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in known:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"unknown command '{argv[0]}'", file=sys.stderr)
        print("usage: python -m analysis <command> [options]\n\ncommands:")
        for name, help_text in known.items():
            print(f"  {name:10s} {help_text}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    try:
        threads.configure()  # before torch loads: two analyses in two processes must not starve each other
        return int(_command(argv[0])(argv[1:]) or 0)
    except UserError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except Exception as exc:
        from analysis.model_access.anatomy import raised_by_model

        if not raised_by_model(exc):  # our own bug: keep the traceback
            raise
        print(f"error: {_model_arg(argv)} failed while running '{argv[0]}': {' '.join(str(exc).split())}",
              file=sys.stderr)
        return 1


def _model_arg(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg == "--model" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return "the model"


if __name__ == "__main__":
    sys.exit(main())

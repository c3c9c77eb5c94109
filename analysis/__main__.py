"""Command line: `python -m analysis <command> ... [--json]`.

Each command lives in its analysis module as `cli(argv) -> int`; modules are imported only
when their command runs, so one slow import (sae-lens) never slows the others.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "info": ("analysis.models", "describe a model"),
    "sharpness": ("analysis.sharpness", "attention sharpness and temperature"),
    "kv": ("analysis.kv_eviction", "KV-cache eviction policies"),
    "invert": ("analysis.inversion", "prompt reconstruction from hidden states"),
    "sae": ("analysis.sae_v", "SAE-V features"),
    "captions": ("analysis.captions", "caption hallucination correction"),
    # It opens the app's pages (Streamlit), so it lives beside them; analysis/ never imports Streamlit.
    "warm": ("components.warm", "precompute every panel's default view and presets"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"unknown command '{argv[0]}'", file=sys.stderr)
        print("usage: python -m analysis <command> [options]\n\ncommands:")
        for name, (module, help_text) in COMMANDS.items():
            print(f"  {name:10s} {help_text}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    module_name, _ = COMMANDS[argv[0]]
    from analysis import threads

    try:  # before torch is imported: two analyses in two processes must not starve each other
        threads.configure()
    except threads.ThreadsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            print(f"command '{argv[0]}' is not available yet", file=sys.stderr)
            return 2
        raise
    from analysis.models import ModelLoadError
    from analysis.registry import SettingsError

    try:
        return int(module.cli(argv[1:]) or 0)
    except (ModelLoadError, SettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        from analysis.anatomy import raised_by_model

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

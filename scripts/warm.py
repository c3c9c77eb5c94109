"""Compute every panel's default view (and presets) ahead, store it on disk: `python scripts/warm.py`.

The pages themselves decide what they compute, so the surest way to precompute exactly what a new
user's first view asks for is to open that view: each panel's default view (and each preset's permalink, from analysis/framework/presets.py)
runs once in Streamlit's AppTest with the precomputed store switched off and the cost gate open
(on-demand sections such as sweeps too, with --extras); every analysis it computes is written to `analysis/precomputed/` with the
model's weight fingerprint (`analysis/framework/precompute.py`). It is a script, above the pages it drives,
because it needs Streamlit; `analysis/` stays free of it.

    python scripts/warm.py [--panels kv-cache,...] [--no-presets] [--prune] [--extras] [--list]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import ROOT  # noqa: E402


def targets(panels: list[str] | None = None, presets: bool = True) -> list[tuple[str, str, str, dict]]:
    """(name, page file, model label, query) for every default view and preset link."""
    from analysis.model_access.models import DEMO_MODELS
    from components.registry import panel_pages

    demo = {kind: f"zoo:{name}" for kind, name in DEMO_MODELS.items()}

    out = []
    for panel in panel_pages():
        if not panel.available or panel.page == "saved_analyses.py":
            continue
        if panels and panel.url_path not in panels:
            continue
        model = demo[panel.kinds[0]]  # the panel's first kind is the one its default view is made for
        out.append((f"{panel.url_path} (default)", panel.script, model, {}))
        for kind in panel.kinds[1:]:  # the default view on the other demo model too: a session keeps its
            other = demo[kind]  # model across pages (SAE-V's link opens the VLM, then KV-cache is on it)
            if other != model:
                out.append((f"{panel.url_path} (default on {other})", panel.script, other, {}))
        if presets:
            for name, query in _presets(panel):
                query = dict(query)
                out.append((f"{panel.url_path} ({name})", panel.script, query.pop("model", model), query))
    return out


def _presets(panel) -> list[tuple[str, dict]]:
    """Each preset of a panel (analysis/framework/presets.py) as its permalink's query: `?preset=name&model=...`."""
    try:
        from analysis.framework import presets as P
    except ImportError:
        return []
    return [(p.name, {"preset": p.name, "model": p.model}) for p in P.for_panel(panel.url_path)]


def warm(panels: list[str] | None = None, presets: bool = True, prune: bool = False, extras: bool = False,
         timeout: float = 3600, log=print) -> list[Path]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["MODEL_INSPECTOR_PRECOMPUTED"] = "0"  # compute afresh, so every result is recorded
    from streamlit.testing.v1 import AppTest

    from analysis.framework import precompute
    from analysis.model_access.models import ModelSpec
    from components import runs

    saved: list[Path] = []

    def record(key, handle, params, fn, kwargs, result, seconds, models) -> None:
        try:
            path = precompute.save(key.kind, key.model, params, key.extra, handle.path, fn, kwargs, result, seconds,
                                   helpers=runs.helpers(models))
        except (TypeError, ValueError) as exc:  # a result that does not travel as JSON: skip it
            log(f"  not stored ({key.kind}): {exc}")
            return
        if path is not None:
            saved.append(path)
            log(f"  stored {path.relative_to(ROOT)} ({seconds:.1f} s)")

    runs.add_sink(record)
    runs.ASK_ABOVE_S = math.inf
    runs.RUN_ON_DEMAND = extras
    failures = []
    for name, page, model, query in targets(panels, presets):
        log(f"{name}: {model} {query or ''}")
        t0 = time.perf_counter()
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
        at.session_state["model_spec"] = ModelSpec.parse(model)
        for k, v in {"model": model, **query}.items():
            at.query_params[k] = v
        at.run()
        at.switch_page(page)
        at.run()
        problems = [str(e.value) for e in at.exception] + [str(e.value) for e in at.error]
        if problems:
            failures.append((name, problems))
            log(f"  PROBLEM: {problems[:2]}")
        log(f"  done in {time.perf_counter() - t0:.1f} s")
    if prune and not panels:
        keep = {p.resolve() for p in saved}
        for path in precompute.prune({p for p, _ in precompute.entries() if p.resolve() in keep}):
            log(f"removed stale {path.relative_to(ROOT)}")
    log(f"{len(set(saved))} results stored, {precompute.total_bytes() / 1024:.0f} KiB in all")
    if failures:
        raise SystemExit(f"{len(failures)} view(s) showed an error: {[n for n, _ in failures]}")
    return saved


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/warm.py", description=__doc__.splitlines()[0])
    parser.add_argument("--panels", default="", help="comma-separated url paths (default: every panel)")
    parser.add_argument("--no-presets", action="store_true", help="default views only")
    parser.add_argument("--prune", action="store_true", help="delete stored results no view asked for")
    parser.add_argument("--extras", action="store_true",
                        help="also run on-demand sections (sweeps) with their default settings")
    parser.add_argument("--list", action="store_true", help="print the views that would be opened")
    args = parser.parse_args(argv)
    panels = [p for p in args.panels.split(",") if p] or None
    if args.list:
        for name, page, model, query in targets(panels, not args.no_presets):
            print(f"{name:45s} {model:16s} {query}")
        return 0
    warm(panels, presets=not args.no_presets, prune=args.prune, extras=args.extras)
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))

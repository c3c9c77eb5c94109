"""The panels: one line each in `TABLE`; everything else a panel declares in its own package.

A panel is a package under `analysis/` that publishes `ANALYSIS = Analysis(...)`: its name (the CLI
command, stable), title and page, the model kinds it works on, its run functions each with its work
estimate, its command line, its settings (`params`: the Params class whose labelled fields are the
page's controls, the link's values and the CLI's flags; `view_state`: the page's own controls such as
layer and head, settings fields too) and its presets (values of those two classes). The runner and the cost gate (`components/runs.py`,
`analysis/framework/cost.py`), the warm command, `python -m analysis`, the navigation (`components/registry.py`)
and the preload list read this table instead of knowing each panel. Adding a panel is one package, one
line below and one page in `views/`.

A line names the package by string: `python -m analysis kv` imports only the KV package, so one slow
import (sae-lens) never slows another command.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from analysis.framework.errors import MissingEstimator


@dataclass(frozen=True)
class Run:
    """One analysis function the runner may call, `fn(handle, params, progress=..., **kwargs)`, with its
    work count `estimate(handle, params, kwargs) -> cost.Work` (read before the run starts)."""

    fn: Callable[..., Any]
    estimate: Callable[..., Any]
    # It trains a model and writes it where every visitor then sees it (an SAE): a deployment may keep it
    # from anonymous visitors, and a read-only instance from everyone (components/limits.py).
    trains: bool = False

    @property
    def qualname(self) -> str:
        return qualname(self.fn)


@dataclass(frozen=True)
class Analysis:
    name: str  # the command (`python -m analysis NAME`) and the panel's stable key
    title: str
    summary: str  # one or two sentences: what the panel shows
    paper: str  # what it reproduces ("" for none)
    kinds: tuple[str, ...]  # model kinds it works on ("causal_lm", "vlm")
    page: str | None = None  # its page under views/ (None: command line only)
    icon: str = ":material/analytics:"
    runs: tuple[Run, ...] = ()
    cli: Callable[[list[str]], int] | None = None
    presets: tuple = ()  # analysis.framework.presets.Preset values of this panel
    cli_help: str = ""
    params: type | None = None  # its settings: a dataclass of settings fields (analysis/framework/settings.py), `Flat`
    view_state: type | None = None  # its page's own controls (layer, head, metric): a dataclass of settings fields

    @property
    def url_path(self) -> str:
        """The page's address (`kv-cache`): its file name with dashes. Stable: links and presets use it."""
        stem = (self.page or self.name).rsplit("/", 1)[-1]
        return stem.removesuffix(".py").replace("_", "-")


@dataclass(frozen=True)
class Entry:
    name: str  # the command
    module: str  # the package that publishes ANALYSIS
    help: str  # one line for `python -m analysis --help`


TABLE: list[Entry] = [
    Entry("sae", "analysis.sae_v", "SAE-V features"),
    Entry("sharpness", "analysis.sharpness", "attention sharpness and temperature"),
    Entry("kv", "analysis.kv", "KV-cache eviction policies"),
    Entry("captions", "analysis.captions", "caption hallucination correction"),
    Entry("invert", "analysis.inversion", "prompt reconstruction from hidden states"),
    Entry("residual", "analysis.residual", "residual stream: lenses, patching, logit attribution"),
]


def entry(name: str) -> Entry:
    for e in TABLE:
        if e.name == name:
            return e
    raise KeyError(name)


def load(name: str) -> Analysis:
    """The ANALYSIS of the panel `name` (imports its package)."""
    module = importlib.import_module(entry(name).module)
    analysis = getattr(module, "ANALYSIS", None)
    if not isinstance(analysis, Analysis) or analysis.name != name:
        raise TypeError(f"{entry(name).module} must publish ANALYSIS = Analysis(name={name!r}, ...).")
    return analysis


def analyses() -> list[Analysis]:
    """Every panel, in the table's order (imports every package)."""
    return [load(e.name) for e in TABLE]


def qualname(fn: Callable) -> str:
    """`module:qualname` of a function, looking through wrappers (functools.wraps keeps both)."""
    return f"{fn.__module__}:{fn.__qualname__}"


def run_for(fn: Callable) -> Run:
    """The declared Run of an analysis function; MissingEstimator when no panel declares it.

    Only the packages whose name prefixes the function's module are imported; a function defined
    elsewhere is looked up in every panel."""
    name = qualname(fn)
    module = fn.__module__
    candidates = [e for e in TABLE if module == e.module or module.startswith(e.module + ".")]
    for e in candidates or TABLE:
        for run in load(e.name).runs:
            if run.qualname == name:
                return run
    raise MissingEstimator(f"{name} is not declared in any panel's ANALYSIS.runs (analysis/framework/panels.py).")


def all_runs() -> list[Run]:
    return [run for a in analyses() for run in a.runs]

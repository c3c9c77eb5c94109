"""The panel table (analysis/framework/panels.py): every panel declares itself once, and the runner, the cost gate,
the command line and the navigation read that declaration.

- Every function a page hands to the runner (`cached_run`, `confirm`) is declared with a work estimate:
  the gate fails closed, so an undeclared one would wait for a click instead of starting unasked.
- A toy panel (one package, one table line, one view) appears in the navigation, the CLI and the gate.
"""
from __future__ import annotations

import ast
import importlib
import sys
import textwrap

import pytest

from analysis.framework import cost, panels
from analysis.framework.errors import MissingEstimator
from analysis.model_access.models import ModelSpec

from analysis.framework.paths import ROOT
RUNNER_CALLS = {"cached_run", "confirm"}
PAGE_CALLS = {"run", "confirm"}


def _aliases(tree: ast.Module) -> dict[str, str]:
    """name -> module for `from analysis import kv` / `import analysis.kv as kv` in a page."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    return out


def _hands_to_runner(node: ast.AST) -> bool:
    """`cached_run(kind, fn, ...)` / `confirm(...)`, or a view's `page.run(kind, fn, ...)` (components/view.py)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in RUNNER_CALLS
    if isinstance(func, ast.Attribute) and func.attr in PAGE_CALLS:
        owner = func.value
        return (isinstance(owner, ast.Name) and owner.id == "page") or \
            (isinstance(owner, ast.Attribute) and owner.attr == "page")
    return False


def runner_functions() -> list[tuple[str, str]]:
    """(page, dotted function) for every function passed to the runner by a page: views/ and the view
    declarations they call (components/views/)."""
    found = []
    for page in sorted((ROOT / "views").glob("*.py")) + sorted((ROOT / "components" / "views").glob("*.py")):
        tree = ast.parse(page.read_text())
        aliases = _aliases(tree)
        for node in ast.walk(tree):
            if not _hands_to_runner(node):
                continue
            fn = node.args[1]
            assert isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name), \
                f"{page.name}:{node.lineno}: pass the analysis function as module.function"
            found.append((page.name, f"{aliases.get(fn.value.id, fn.value.id)}.{fn.attr}"))
    return found


def _resolve(dotted: str):
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def test_the_walk_finds_the_pages_runs():
    found = {fn for _, fn in runner_functions()}
    assert {"analysis.kv.analyze", "analysis.kv.budget_sweep"} <= found
    assert len(found) >= 10


@pytest.mark.parametrize("page,dotted", runner_functions())
def test_every_function_handed_to_the_runner_has_an_estimate(page, dotted):
    run = panels.run_for(_resolve(dotted))
    assert callable(run.estimate)


def test_an_undeclared_function_fails_closed():
    def not_declared(handle, params, progress=None):
        return None

    with pytest.raises(MissingEstimator):
        panels.run_for(not_declared)


def test_every_panel_declares_itself_consistently():
    names = [e.name for e in panels.TABLE]
    assert len(set(names)) == len(names)
    for a in panels.analyses():
        assert a.kinds and set(a.kinds) <= {"causal_lm", "vlm"}, a.name
        assert a.page is None or (ROOT / "views" / a.page).is_file(), a.name
        assert a.cli is not None, a.name
        assert len({r.qualname for r in a.runs}) == len(a.runs), a.name


# ---------------------------------------------------------------------------------------------
# A toy panel: one package, one table line, one view

TOY_PACKAGE = '''
"""A toy panel: counts the tokens of a prompt."""
from dataclasses import dataclass

from analysis.framework.cost import Work
from analysis.framework.panels import Analysis, Run
from analysis.framework.results import Result
from analysis.framework.settings import ArgumentParser, setting


@dataclass
class ToyParams(Result):
    text: str = setting("a b c", label="Text", high=200)


@dataclass
class ToyResult(Result):
    tokens: int


def count(handle, params, progress=None):
    return ToyResult(tokens=len(handle.tokenizer(params.text)["input_ids"]))


def count_work(handle, params, kwargs):
    return Work(calls=1, tokens=len(params.text.split()))


def cli(argv):
    args = ArgumentParser(prog="python -m analysis toy").parse_args(argv)
    print("toy panel says hello")
    return 0


ANALYSIS = Analysis(name="toy", title="Toy panel", summary="Counts tokens.", paper="", kinds=("causal_lm",),
                    page=PAGE, runs=(Run(count, count_work),), cli=cli)
'''

TOY_VIEW = '''
import streamlit as st

import toy_panel
from components.common import require_model
from components.runs import cached_run

st.title("Toy panel")
handle = require_model(*toy_panel.ANALYSIS.kinds, panel="Toy panel")
result = cached_run("count", toy_panel.count, handle, toy_panel.ToyParams(), label="Counting")
st.write(f"toy tokens: {result.tokens}")
'''


@pytest.fixture
def toy_panel(tmp_path, monkeypatch):
    view = tmp_path / "toy_view.py"
    view.write_text(textwrap.dedent(TOY_VIEW))
    package = tmp_path / "toy_panel"
    package.mkdir()
    (package / "__init__.py").write_text(f"PAGE = {str(view)!r}\n" + textwrap.dedent(TOY_PACKAGE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(panels, "TABLE", panels.TABLE + [panels.Entry("toy", "toy_panel", "a toy panel")])
    yield view
    sys.modules.pop("toy_panel", None)


def test_a_toy_panel_is_on_the_command_line(toy_panel, capsys):
    from analysis.__main__ import main

    assert main(["--help"]) == 0
    assert "a toy panel" in capsys.readouterr().out
    assert main(["toy"]) == 0
    assert "toy panel says hello" in capsys.readouterr().out
    assert main(["toy", "--nope"]) == 1
    assert capsys.readouterr().err.startswith("error: unrecognized arguments: --nope")


def test_a_toy_panel_is_priced_by_the_cost_gate(toy_panel, tiny_llama):
    import toy_panel as toy

    estimate = cost.estimate(toy.count, tiny_llama, toy.ToyParams(text="one two three four"))
    assert estimate.work.calls == 1 and estimate.work.tokens == 4
    assert estimate.seconds > 0


def test_a_toy_panel_is_in_the_navigation_and_runs(toy_panel, tiny_llama_dir):
    from components.registry import panel_pages
    from conftest import app_with_model

    page = next(p for p in panel_pages() if p.title == "Toy panel")
    assert page.url_path == "toy-view" and page.available
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), page.script)
    assert not at.exception, at.exception
    assert at.title[0].value == "Toy panel"
    assert any("toy tokens:" in m.value for m in at.markdown)

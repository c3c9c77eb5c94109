"""Readable top to bottom: no file in analysis/, components/ or views/ over 600 lines, no function over 80,
and no import circles among them (tests/unit/test_import_graph.py).

TRANSITIONAL lists what still exceeds the limits while the panels move into packages (issue 30); an entry
must go as soon as its file is split, and the list must end empty."""
from __future__ import annotations

import ast
import re

import pytest

from analysis.framework.paths import ROOT

TOPS = ("analysis", "components", "views")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
TRANSITIONAL: set[str] = set()


def offenders() -> set[str]:
    found = set()
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            text = path.read_text()
            if text.count("\n") > MAX_FILE_LINES:
                found.add(rel)
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                        found.add(f"{rel}:{node.name}")
    return found


def test_files_and_functions_fit_on_a_screen_or_a_few():
    new = offenders() - TRANSITIONAL
    assert not new, f"over {MAX_FILE_LINES} lines per file or {MAX_FUNCTION_LINES} per function: {sorted(new)}"


def test_the_transitional_list_holds_only_real_offenders():
    gone = TRANSITIONAL - offenders()
    assert not gone, f"fixed, so remove from TRANSITIONAL: {sorted(gone)}"


# One rule, one copy: a rule that several modules need is written in one place and imported.
ONE_COPY = {
    # what a progress callback is: analysis/framework/progress.py
    "Progress": (re.compile(r"^\w+\s*=\s*Callable\[\[float,\s*str\],\s*None\]", re.M), {"analysis/framework/progress.py"}),
    # query heads per key-value head (GQA): anatomy's HeadLayout.groups
    "head groups": (re.compile(r"heads\s*//\s*[\w.]*kv_heads|//\s*self\.n_kv\b"), {"analysis/model_access/anatomy.py"}),
}


def copies(pattern: re.Pattern) -> set[str]:
    return {str(path.relative_to(ROOT)) for top in TOPS for path in (ROOT / top).rglob("*.py")
            if pattern.search(path.read_text())}


@pytest.mark.parametrize("rule", sorted(ONE_COPY))
def test_a_shared_rule_is_written_once(rule):
    pattern, home = ONE_COPY[rule]
    assert copies(pattern) == home, f"{rule}: import it from {sorted(home)} instead of writing it again"


def test_the_one_copy_check_finds_a_copy(tmp_path):
    pattern = ONE_COPY["Progress"][0]
    assert pattern.search("Progress = Callable[[float, str], None]\n")
    assert pattern.search("ProgressFn = Callable[[float, str], None] | None\n")
    assert ONE_COPY["head groups"][0].search("groups = handle.info.heads // handle.info.kv_heads")

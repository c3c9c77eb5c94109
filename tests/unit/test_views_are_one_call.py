"""Every file under views/ is a declaration's one call (#43): a docstring, imports and a single call;
the page itself lives in components/views/ (functions and classes, readable and testable)."""
from __future__ import annotations

import ast

from analysis.framework.paths import VIEWS


def test_every_view_file_is_a_docstring_imports_and_one_call():
    pages = sorted(VIEWS.glob("*.py"))
    assert len(pages) >= 8
    for page in pages:
        body = ast.parse(page.read_text()).body
        assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), f"{page.name}: no docstring"
        rest = [node for node in body[1:] if not isinstance(node, (ast.Import, ast.ImportFrom))]
        assert len(rest) == 1 and isinstance(rest[0], ast.Expr) and isinstance(rest[0].value, ast.Call), \
            f"{page.name}: top-level code beyond one call"

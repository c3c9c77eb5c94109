"""The support matrix in docs/models.md is what the tests measure: every panel on every tiny family."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from analysis.framework.paths import ROOT
spec = importlib.util.spec_from_file_location("support_matrix", ROOT / "scripts" / "support_matrix.py")
support_matrix = importlib.util.module_from_spec(spec)
sys.modules["support_matrix"] = support_matrix  # dataclasses look their module up there
spec.loader.exec_module(support_matrix)


@pytest.fixture(scope="module")
def matrix():
    return support_matrix.measure()


def test_no_cell_crashes(matrix):
    crashes = {(f, p): c.note for f, cells in matrix.items() for p, c in cells.items() if c.status == "crash"}
    assert not crashes, crashes


def test_families_and_panels_covered(matrix):
    from analysis.model_access.tiny_models import FAMILIES

    works = {f for f, cells in matrix.items() if any(c.status == "works" for c in cells.values())}
    vlms = {f for f in works if FAMILIES[f][0] == "vlm" and matrix[f]["captions"].status == "works"}
    assert len(works) >= 15 and len(vlms) >= 5, (works, vlms)
    assert all(set(cells) == set(support_matrix.PANELS) for cells in matrix.values())


def test_refusals_say_why(matrix):
    # the one expected refusal of eviction: every layer of this Mistral is sliding-window
    assert "sliding-window" in matrix["mistral-sliding"]["kv"].note
    assert matrix["mistral"]["kv"].status == "works"
    for cells in matrix.values():
        for cell in cells.values():
            assert cell.status == "works" or len(cell.note) > 20


def test_readme_table_matches_the_measured_matrix(matrix):
    measured = support_matrix.render(matrix)
    assert support_matrix.readme_table() == measured, (
        "docs/models.md's support matrix differs from the measured one; run `python scripts/support_matrix.py`.")

"""A refused view counts too (#50): a view refused for its size (above `limits.max_run_seconds`) counts
against the visitor's views per minute like one that ran. Before, 6 of 6 views ran right after refusals."""
from __future__ import annotations

import pytest

from analysis.model_access.models import zoo_models
from test_public_pages import PUBLIC, app, use_instance

pytestmark = pytest.mark.skipif("shapes-lm" not in zoo_models(), reason="needs the demo zoo")


@pytest.fixture()
def tight(monkeypatch, tmp_path):
    from components import limits

    use_instance(monkeypatch, tmp_path, PUBLIC.read_text().replace("max_run_seconds = 120", "max_run_seconds = 1"))
    yield
    limits.clear()


def _warnings(at) -> str:
    return " | ".join(w.value for w in at.warning).replace("\\", "")


def test_views_refused_for_their_size_count_against_the_visitors_minute(tight):
    views = [app("views/kv_cache.py", {"context": "192", "budget": "16", "examples": "8", "seed": str(1000 + i)})
             for i in range(7)]
    shown = [_warnings(at) for at in views]
    assert all(not at.exception for at in views)
    assert all("1 s" in s or "largest" in s or "longer" in s for s in shown[:6]), shown[:6]  # refused for size
    assert "views with new analyses in the last minute" in shown[6], shown[6]

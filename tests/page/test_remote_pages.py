"""Pages with a model that runs on NDIF: the sidebar says where it runs, the KV-cache page says that it
stays local (one line, no traceback). The Hub is not touched: the remote model's config and tokenizer
come from the demo zoo's folder."""
from __future__ import annotations

import pytest

from analysis.backends import ndif
from analysis.models import ZOO_DIR, ModelSpec
from tests.conftest import app_with_model


@pytest.fixture
def remote_config(tmp_path, monkeypatch):
    cfg = tmp_path / "mi.toml"
    cfg.write_text('[backend]\nkind = "ndif"\nremote_models = ["acme/shapes-lm"]\n')
    monkeypatch.setenv("MODEL_INSPECTOR_CONFIG", str(cfg))
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    monkeypatch.setattr(ndif, "_config_files", lambda repo, revision: ZOO_DIR / "shapes-lm")


def test_kv_page_says_eviction_stays_local_for_a_remote_model(remote_config):
    at = app_with_model(ModelSpec("ndif", "acme/shapes-lm"), page="views/kv_cache.py")
    assert not at.exception
    assert any("stays local" in i.value and "runs on NDIF" in i.value for i in at.info)
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert "runs on NDIF" in captions
    assert any("no NDIF API key" in w.value for w in at.sidebar.warning)  # said, never shown

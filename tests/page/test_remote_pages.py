"""Pages with a model that runs on NDIF: the sidebar says where it runs, the KV-cache page says that it
stays local, the residual page patches it there and says why its lens needs a local model (one line each,
no traceback). The Hub is not touched: the remote model's config and tokenizer
come from the demo zoo's folder."""
from __future__ import annotations

import pytest

from analysis.backends import ndif
from analysis.model_access.models import ZOO_DIR, ModelSpec
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


def test_residual_page_patches_a_remote_model_and_says_why_its_lens_needs_a_local_one(remote_config):
    page = "views/residual_stream.py"
    at = app_with_model(ModelSpec("ndif", "acme/shapes-lm"), page=page)  # the lens view, the default
    assert not at.exception and not at.error
    assert [i.value for i in at.info if "weights stay on NDIF" in i.value and "patching run on NDIF" in i.value]
    at = app_with_model(ModelSpec("ndif", "acme/shapes-lm"), page=page, query={"view": "patching"})
    assert not at.exception
    assert not [i.value for i in at.info if "weights stay on NDIF" in i.value]
    assert len(at.error) == 1 and "No NDIF API key on this server" in at.error[0].value  # it went to NDIF

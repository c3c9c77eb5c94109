"""Permalinks: every panel reproduces its view from the URL it writes (round trip through query params)."""
from __future__ import annotations

import pytest

from analysis.model_access.models import ModelSpec, zoo_models
from conftest import app_with_model

TIME_WORDS = ("ms", "time", "second", "(s)")


def _params(at) -> dict[str, str]:
    out = {}
    for key in at.query_params:
        value = at.query_params[key]
        out[key] = value[0] if isinstance(value, list) and len(value) == 1 else value
    return out


def _snapshot(at) -> dict:
    """What the view shows, minus wall-clock timings: metric cards and table contents."""
    metrics = {m.label: m.value for m in at.metric if not any(w in m.label.lower() for w in TIME_WORDS)}
    tables = []
    for df in at.dataframe:
        frame = df.value
        keep = [c for c in frame.columns if not any(w in str(c).lower() for w in TIME_WORDS)]
        tables.append(frame[keep].astype(str).to_dict("list"))
    return {"metrics": metrics, "tables": tables}


def _round_trip(spec: ModelSpec, page: str, query: dict[str, str], timeout: float = 180) -> None:
    first = app_with_model(spec, page, query=query, timeout=timeout)
    assert not first.exception, first.exception
    assert not first.error, [e.value for e in first.error]
    written = _params(first)
    for key, value in query.items():
        assert written.get(key) == value, f"{key}: asked {value!r}, the page wrote {written.get(key)!r}"
    # a local folder is named by its path under its allowed root, never by the server's path (issue 47)
    assert written["model"] == (f"local:{spec.name.rsplit('/', 1)[-1]}" if spec.source == "local" else spec.label)
    second = app_with_model(None, page, query=written, timeout=timeout)  # a new session, URL only
    assert not second.exception, second.exception
    assert _params(second) == written
    assert _snapshot(second) == _snapshot(first)


def test_sharpness_view_round_trips_through_its_url(tiny_llama_dir):
    _round_trip(ModelSpec("local", str(tiny_llama_dir)), "views/attention_sharpness.py",
                {"theta": "0.5", "layer": "1", "head": "2", "sink": "0", "samples": "4"})


def test_kv_view_round_trips_through_its_url(tiny_llama_dir):
    _round_trip(ModelSpec("local", str(tiny_llama_dir)), "views/kv_cache.py",
                {"context": "64", "budget": "32", "snap_window": "4", "morph_window": "4", "examples": "1", "policy": "h2o",
                 "seed": "3"})


def test_inversion_view_round_trips_through_its_url(tiny_llama_dir):
    _round_trip(ModelSpec("local", str(tiny_llama_dir)), "views/prompt_reconstruction.py",
                {"prompt": "w5 w17 w3 w42 w8", "layer": "1", "perm": "shuffle_dims", "sweeps": "0",
                 "exhaustive": "0"})


@pytest.mark.skipif("shapes-vlm" not in zoo_models(), reason="needs the demo VLM")
def test_caption_view_round_trips_through_its_url():
    _round_trip(ModelSpec("zoo", "shapes-vlm"), "views/caption_correction.py",
                {"src": "scene", "seed": "20000005", "cap": "paste", "dec": "grammar", "rew": "grammar",
                 "text": "there is a large red circle at the top left .", "pi": "2.0", "ground": "0"})


@pytest.mark.skipif("shapes-vlm" not in zoo_models(), reason="needs the demo VLM and its SAE")
def test_sae_feature_page_round_trips_through_its_url():
    _round_trip(ModelSpec("zoo", "shapes-vlm"), "views/sae_features.py", {"view": "feature", "feature": "7"})

"""Precomputed results: shown only for the same weights and settings, and equal to a fresh computation."""
from __future__ import annotations

import math
import shutil

import pytest
import torch
from conftest import app_with_model, zoo_model_ready

from analysis import kv
from analysis.framework import precompute
from analysis.model_access.models import ModelSpec, load_model, zoo_models


def assert_close(a, b, path="result"):
    """Same structure and values; floats to 1e-4 relative (two processes may sum in another order)
    or 5e-4 absolute: values near a numerical noise floor (the L1 distance of an exactly recovered
    token is ~1e-4) differ between machines by a unit of the 4th decimal they are stored to."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys differ"
        for k in a:
            assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(float(a), float(b), rel_tol=1e-4, abs_tol=5e-4), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


SMALL = kv.KvParams(context=32, budget=12, new_tokens=4, policies=kv.policy_settings(snap_window=4, morph_window=4))


@pytest.fixture()
def copied_llama(tiny_llama_dir, model_root, tmp_path):
    """A private copy of the tiny model (its weights get changed), under an allowed root."""
    folder = model_root / f"copy-{tmp_path.name}"
    shutil.copytree(tiny_llama_dir, folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_stored_result_comes_back_only_for_the_same_weights_and_settings(copied_llama, tmp_path):
    handle = load_model(ModelSpec("local", str(copied_llama)))
    label, params, extra = handle.spec.label, SMALL.to_json(), "[]"
    result = kv.analyze(handle, SMALL)
    path = precompute.save("analyze", label, SMALL, extra, handle.path, kv.analyze, {}, result, 1.0, root=tmp_path)
    assert path is not None and path.stat().st_size < 200_000

    again = precompute.lookup("analyze", label, params, extra, handle.path, root=tmp_path)
    assert isinstance(again, kv.KvResult)
    assert_close(again.to_dict(), result.to_dict())

    other = kv.KvParams.from_dict({**SMALL.to_dict(), "budget": 13}).to_json()
    assert precompute.lookup("analyze", label, other, extra, handle.path, root=tmp_path) is None
    assert precompute.lookup("sweep", label, params, extra, handle.path, root=tmp_path) is None
    assert precompute.lookup("analyze", "local:/elsewhere", params, extra, handle.path, root=tmp_path) is None
    assert precompute.lookup("analyze", label, params, "[('x', 1)]", handle.path, root=tmp_path) is None

    # Same label, same settings, other weights: never shown.
    from safetensors.torch import load_file, save_file

    weights = next(copied_llama.glob("*.safetensors"))
    tensors = load_file(weights)
    name = next(k for k in tensors if k.endswith("q_proj.weight"))
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, weights, metadata={"format": "pt"})
    assert precompute.lookup("analyze", label, params, extra, handle.path, root=tmp_path) is None


def test_a_result_that_also_uses_a_helper_model_is_keyed_by_the_helper_s_weights_too(
        copied_llama, tiny_llama_dir, tmp_path):
    """Caption correction also runs a decomposer/rewriter LM: its label and weights count like the VLM's."""
    from safetensors.torch import load_file, save_file

    params, extra = SMALL.to_json(), "[] with [('lm', 'local:helper')]"
    helper = {"lm": ("local:helper", str(copied_llama))}
    assert precompute.save("analyze", "local:main", SMALL, extra, tiny_llama_dir, kv.analyze, {}, SMALL,
                           root=tmp_path, helpers=helper) is not None
    assert precompute.lookup("analyze", "local:main", params, extra, tiny_llama_dir, root=tmp_path,
                             helpers=helper) == SMALL
    assert precompute.lookup("analyze", "local:main", params, extra, tiny_llama_dir, root=tmp_path) is None
    other = {"lm": ("local:other", str(copied_llama))}
    assert precompute.lookup("analyze", "local:main", params, extra, tiny_llama_dir, root=tmp_path,
                             helpers=other) is None
    weights = next(copied_llama.glob("*.safetensors"))
    tensors = load_file(weights)
    name = next(k for k in tensors if k.endswith("q_proj.weight"))
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, weights, metadata={"format": "pt"})
    assert precompute.lookup("analyze", "local:main", params, extra, tiny_llama_dir, root=tmp_path,
                             helpers=helper) is None


def test_storing_the_same_result_again_keeps_the_file_when_only_timings_differ(tiny_llama_dir, tmp_path):
    """`python scripts/warm.py` re-stores every result; a rerun must not rewrite committed files
    whose only change is a wall-clock field, but must rewrite real changes."""
    import dataclasses

    result = kv.KvParams(context=40)  # any Result; `seconds`-like fields are what timings are
    path = precompute.save("analyze", "local:m", SMALL, "[]", tiny_llama_dir, kv.analyze, {}, result, 1.0,
                           root=tmp_path)
    before = path.read_bytes()
    again = precompute.save("analyze", "local:m", SMALL, "[]", tiny_llama_dir, kv.analyze, {}, result, 2.5,
                            root=tmp_path)
    assert again == path and path.read_bytes() == before
    changed = dataclasses.replace(result, context=41)
    precompute.save("analyze", "local:m", SMALL, "[]", tiny_llama_dir, kv.analyze, {}, changed, 2.5, root=tmp_path)
    assert path.read_bytes() != before
    assert precompute.read_entry(path).result["context"] == 41


def test_an_entry_cannot_name_code_outside_the_package(tmp_path, tiny_llama_dir):
    with pytest.raises(ValueError):
        precompute._resolve("os:system")


def _converted(model: str) -> bool:
    """A demo model, or a real zoo model that is converted here (the suite never converts one)."""
    from analysis.model_access import real_models

    name = model.split(":", 1)[-1]
    return name not in real_models.REAL_MODELS or real_models.is_built(name)


def _committed() -> list[tuple]:
    return [(p, e) for p, e in precompute.entries() if _converted(e.model)] if zoo_models() else []


def _one_per_analysis() -> list[tuple]:
    """The quickest stored entry of each analysis function (all of them would take minutes), on models
    that are here (a real zoo model's entries count only where it is converted: a test never converts)."""
    best: dict[str, tuple] = {}
    for path, entry in _committed():
        if not zoo_model_ready(entry.model):
            continue
        if entry.function not in best or entry.seconds < best[entry.function][1].seconds:
            best[entry.function] = (path, entry)
    return list(best.values())


@pytest.mark.parametrize("path,entry", _one_per_analysis(), ids=lambda x: getattr(x, "function", ""))
def test_stored_result_equals_a_fresh_computation(path, entry):
    torch.manual_seed(0)
    handle = load_model(ModelSpec.parse(entry.model))
    assert entry.fingerprint == precompute.weights_fingerprint(handle.path), (
        f"{path.name} was computed on other weights: run `python scripts/warm.py --prune`")
    fresh = precompute.recompute(entry, handle)
    assert_close(precompute.without_timings(fresh.to_dict()), precompute.without_timings(entry.result))


def test_the_committed_store_is_small():
    assert precompute.total_bytes() < 3_000_000


# panel -> (page, the demo models its default view is stored for: the first is the panel's default; a
# session keeps its model across pages, so after SAE-V (the VLM) the other panels open on the VLM too).
# SAE-V reads its feature store from the zoo instead.
STORED_PAGES = {"kv-cache": ("views/kv_cache.py", ["zoo:shapes-lm", "zoo:shapes-vlm"]),
                "prompt-reconstruction": ("views/prompt_reconstruction.py", ["zoo:shapes-lm", "zoo:shapes-vlm"]),
                "attention-sharpness": ("views/attention_sharpness.py", ["zoo:shapes-lm", "zoo:shapes-vlm"]),
                "caption-correction": ("views/caption_correction.py", ["zoo:shapes-vlm"]),
                "residual-stream": ("views/residual_stream.py", ["zoo:shapes-lm", "zoo:shapes-vlm"])}


def _lm_views() -> list[tuple[str, str, dict]]:
    """Each panel's default view (on each demo model) and every preset's permalink (`?preset=name&model=...`)."""
    from analysis.framework import presets as P

    views = []
    for panel, (page, models) in STORED_PAGES.items():
        views.append((f"{panel}-default", page, {"model": models[0]}))
        views += [(f"{panel}-default-on-{m.split(':')[1]}", page, {"model": m}) for m in models[1:]]
        views += [(f"{panel}-{p.name}", page, {"model": p.model, "preset": p.name}) for p in P.for_panel(panel)
                  if _converted(p.model)]
    return views


@pytest.mark.skipif(not zoo_models(), reason="needs the demo zoo")
@pytest.mark.parametrize("name,page,query", _lm_views(), ids=[v[0] for v in _lm_views()])
def test_default_view_and_presets_are_served_from_the_store(name, page, query):
    """What a new user's first view (or a preset's first click) computes was precomputed, on-demand
    sections included: no "Run it" gate, no Run button, nothing computed (else: run
    `python scripts/warm.py --panels ... --extras`)."""
    from components import runs

    if not zoo_model_ready(query["model"]):
        pytest.skip(f"{query['model']} is not converted here (python -m analysis.zoo build --only ...)")
    runs.run_store().clear()
    computed = []
    runs.add_sink(lambda key, *rest: computed.append(key.kind))
    before = precompute.stats["hits"]
    model = ModelSpec.parse(query["model"])
    try:
        at = app_with_model(model, page, query=query, timeout=120)
    finally:
        runs._SINKS.pop()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert precompute.stats["hits"] > before
    assert not computed, f"{name} computed {computed} on page load; run `python scripts/warm.py`"
    gates = [b.label for b in at.button if b.label.startswith("Run")]
    assert not gates, f"{name} asks before showing its result: {gates}"
    assert not [i.value for i in at.info if "not started on its own" in i.value]

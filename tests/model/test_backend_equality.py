"""Every capture-based panel gives the same result through nnsight's local execution as through plain
hooks, on the demo LM, the demo VLM (the residual panel: its language model) and the zoo's real model
(tolerance 1e-5; measured: exactly equal).

The panel code is called as the page calls it; only the configured backend changes (`backends.using`),
and a spy checks that the nnsight trace really ran."""
from __future__ import annotations

import pytest

from analysis import backends, residual, sae_v
from analysis import captions as C
from analysis import sharpness as S
from analysis.backends import traced
from analysis.inversion import AttackParams, observed_states, reconstruct
from analysis.model_access.models import ModelSpec, load_model
from analysis.framework.results import to_jsonable
from analysis.world import shapes_world as W
from tests.conftest import zoo_model_ready

TOL = 1e-5
MODELS = ["zoo:shapes-lm", "zoo:shapes-vlm", "zoo:smollm2-135m-instruct"]
_HANDLES: dict = {}


def handle_of(spec: str):
    if not zoo_model_ready(spec):
        pytest.skip(f"{spec} is not converted here (python -m analysis.zoo real)")
    if spec not in _HANDLES:
        _HANDLES[spec] = load_model(ModelSpec.parse(spec))
    return _HANDLES[spec]


def max_difference(a, b) -> float:
    """Largest |a - b| over two results' JSON forms; anything not a number must be equal."""
    a, b = to_jsonable(a), to_jsonable(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        return max([max_difference(a[k], b[k]) for k in a], default=0.0)
    if isinstance(a, list):
        assert len(a) == len(b)
        return max([max_difference(x, y) for x, y in zip(a, b)], default=0.0)
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b)
    assert a == b
    return 0.0


def both(monkeypatch, fn):
    """fn() run with the local backend, then with nnsight-local (whose trace must run): |difference|."""
    calls = []
    real = traced.trace
    monkeypatch.setattr(traced, "trace", lambda *a, **k: calls.append(1) or real(*a, **k))
    with backends.using("local"):
        native = fn()
    assert calls == []
    with backends.using("nnsight-local"):
        nnsight = fn()
    assert calls, "the nnsight backend did not run"
    return max_difference(native, nnsight)


@pytest.mark.parametrize("spec", MODELS)
def test_sharpness_statistics_are_the_same_through_nnsight(spec, monkeypatch):
    handle = handle_of(spec)
    params = S.PromptParams(text="There is a red circle and a blue square. Where is the red circle",
                            target="red circle", rule=S.Temperature.adaptive())
    if spec.endswith("shapes-lm") or spec.endswith("shapes-vlm"):
        params.text, params.target = "there is a red circle and a blue square . where is the red circle", "red circle"
    assert both(monkeypatch, lambda: S.analyse_prompt(handle, params)) <= TOL


def test_sharpness_size_sweep_is_the_same_through_nnsight(monkeypatch):
    handle = handle_of("zoo:shapes-lm")
    params = S.default_params(handle)
    params.ns, params.samples = [4, 8], 4
    assert both(monkeypatch, lambda: S.size_sweep(handle, params)) <= TOL


@pytest.mark.parametrize("spec", MODELS)
def test_prompt_reconstruction_targets_are_the_same_through_nnsight(spec, monkeypatch):
    handle = handle_of(spec)
    ids = handle.tokenizer("there is a red circle and a blue square")["input_ids"]
    n = handle.info.layers
    for layer in (0, 1, n // 2, n):
        assert both(monkeypatch, lambda: observed_states(handle, ids, layer)) <= TOL


def test_prompt_reconstruction_attack_is_the_same_through_nnsight(monkeypatch):
    handle = handle_of("zoo:shapes-lm")
    params = AttackParams(prompt="there is a red circle", layer=2, positions=3)

    def attack():
        return [{k: v for k, v in t.to_dict().items() if k != "seconds"} for t in reconstruct(handle, params).tokens]

    assert both(monkeypatch, attack) <= TOL


@pytest.mark.parametrize("spec", MODELS)
def test_sae_v_activations_are_the_same_through_nnsight(spec, monkeypatch):
    handle = handle_of(spec)
    pairs = sae_v.make_pairs(handle, "noise", 5, seed=3)
    layer = handle.info.layers // 2

    def collect():
        acts = sae_v.collect_activations(handle, pairs, layer=layer, batch_size=3)
        return [acts.acts, acts.modality, acts.pair, acts.index, acts.tokens]

    assert both(monkeypatch, collect) <= TOL


def test_caption_verification_is_the_same_through_nnsight(monkeypatch):
    handle = handle_of("zoo:shapes-vlm")
    scene = W.generate_scene(1)
    verifier = C.make_verifier("shapes-vlm", handle)
    claims = W.decompose(W.caption(scene)) + ["there is a green triangle", "the red circle is small"]
    assert both(monkeypatch, lambda: verifier.verify(W.render(scene), claims)) <= TOL


def _without_seconds(result) -> dict:
    """A residual result's JSON form without its measured durations (they differ run by run)."""
    data = to_jsonable(result)
    data.pop("seconds", None)
    return data


@pytest.mark.parametrize("spec", MODELS)
def test_residual_lens_and_logit_attribution_are_the_same_through_nnsight(spec, monkeypatch):
    handle = handle_of(spec)
    params = residual.ResidualParams(top_k=5)
    assert both(monkeypatch, lambda: residual.inspect(handle, params)) <= TOL


@pytest.mark.parametrize("spec", MODELS)
def test_residual_exact_and_attribution_patching_are_the_same_through_nnsight(spec, monkeypatch):
    """Every component on the zoo models; the residual stream and the heads on SmolLM2 (30 layers)."""
    handle = handle_of(spec)
    real = spec.endswith("smollm2-135m-instruct")
    params = residual.ResidualParams(components=["residual", "heads"] if real else list(residual.COMPONENTS.names()),
                                     methods=["exact", "attribution"])
    assert both(monkeypatch, lambda: _without_seconds(residual.patch(handle, params))) <= TOL

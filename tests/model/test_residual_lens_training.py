"""The tuned-lens trainer (analysis/residual/lens_training.py) against the recipe, and its store.

The reference is the recipe written out in float64 plain code: the readout of a tiny Llama (RMSNorm, then the
unembedding) by hand, the KL gradient by autograd, then the global-norm clipping at 1.0, torch-style coupled weight
decay 1e-3 and Nesterov momentum 0.9 (buf = 0.9 buf + g; step g + 0.9 buf) at lr 0.1 decaying linearly to zero."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from analysis.residual import lens_training as LT
from analysis.residual import translators
from analysis.residual.errors import ResidualError


def reference_readout(lm, h: torch.Tensor) -> torch.Tensor:
    """Llama's final RMSNorm and unembedding in float64, from the formulas (not the model's modules)."""
    norm = lm.model.norm
    w, eps = norm.weight.detach().double(), norm.variance_epsilon
    x = h / torch.sqrt((h * h).mean(-1, keepdim=True) + eps) * w
    return x @ lm.lm_head.weight.detach().double().T


def reference_train(lm, states: torch.Tensor, steps: int, lr: float) -> tuple[list, list, int]:
    """The recipe on every token at every step, float64, plain code; (W per state, b per state, how many steps
    the clipping shrank)."""
    s = states.double()
    n_layers, d = s.shape[0] - 1, s.shape[-1]
    ws = [torch.zeros(d, d, dtype=torch.float64) for _ in range(n_layers)]
    bs = [torch.zeros(d, dtype=torch.float64) for _ in range(n_layers)]
    bufs = [None] * (2 * n_layers)
    clipped = 0
    final = torch.log_softmax(reference_readout(lm, s[-1]), -1)
    for step in range(steps):
        params = [p.clone().requires_grad_(True) for p in ws + bs]
        loss = 0.0
        for i in range(n_layers):
            w, b = params[i], params[n_layers + i]
            logp = torch.log_softmax(reference_readout(lm, s[i] + s[i] @ w.T + b), -1)
            loss = loss + (final.exp() * (final - logp)).sum(-1).mean()
        grads = torch.autograd.grad(loss, params)
        norm = torch.sqrt(sum((g * g).sum() for g in grads))
        scale = min(1.0, 1.0 / (float(norm) + 1e-6))
        clipped += scale < 1.0
        rate = lr * (1 - step / steps)
        new = []
        for k, (p, g) in enumerate(zip(ws + bs, grads)):
            g = g * scale + 1e-3 * p
            bufs[k] = g.clone() if bufs[k] is None else 0.9 * bufs[k] + g
            new.append(p - rate * (g + 0.9 * bufs[k]))
        ws, bs = new[:n_layers], new[n_layers:]
    return ws, bs, clipped


@pytest.fixture(scope="module")
def tiny_states(tiny_llama):
    seqs = LT.samples(tiny_llama, LT.TRAIN_OPENERS[:2], 6, seed=0)
    return LT.states_of(tiny_llama, seqs) * 0.2  # after RMSNorm, smaller states mean larger bias gradients: the clipping binds


def test_trainer_steps_are_the_recipe_in_float64(tiny_llama, tiny_states):
    lm = tiny_llama.language_model
    trans, losses = LT.train_translators(lm, tiny_states, steps=4, batch=10_000, lr=0.1)
    ws, bs, clipped = reference_train(lm, tiny_states, 4, 0.1)
    assert 0 < clipped  # so a trainer without the clipping does not match
    for i in range(trans.layers):
        assert float(trans.weights[i][0].abs().max()) > 1e-4  # it moved
        torch.testing.assert_close(trans.weights[i][0].double(), ws[i], rtol=2e-4, atol=2e-6)
        torch.testing.assert_close(trans.biases[i].double(), bs[i], rtol=2e-4, atol=2e-6)
    assert losses[-1] < losses[0]


def test_per_model_step_picks_the_rate_that_ends_lowest(tiny_llama, tiny_states):
    lm = tiny_llama.language_model
    recipe = LT.LensRecipe(steps=3, batch=16, rates=(0.1, 0.001), check_steps=3)
    fitted = LT.fit(lm, tiny_states, tiny_states, tiny_states, recipe)
    assert set(fitted.check) == {0.1, 0.001}
    assert fitted.lr == min(fitted.check, key=fitted.check.get)
    assert fitted.check[0.1] < fitted.check[0.001]  # a 100x smaller step barely moves in 3 steps
    assert fitted.held.tuned[-1] == pytest.approx(0.0, abs=1e-6)
    assert all(0.0 <= c <= 1.0 for c in fitted.held.closer)


def test_trained_lens_is_stored_under_the_weights_hash(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setattr(translators, "USER_LENS_ROOT", tmp_path / "lenses")
    handle = tiny_llama
    with pytest.raises(ResidualError, match="train-lens"):
        translators.for_model(handle)
    recipe = LT.LensRecipe(steps=4, batch=16, rates=(0.1, 0.03), check_steps=2, openers=3, check_openers=1,
                           held_openers=2, new_tokens=6)
    seen = []
    record = LT.train_lens(handle, progress=lambda f, m="": seen.append(f), recipe=recipe)
    assert seen[-1] == 1.0 and seen == sorted(seen)
    digest = translators.weights_hash(handle.language_model)
    assert record.weights_sha256 == digest and record.folder.endswith(digest[:16])
    assert record.lr in (0.1, 0.03) and len(record.logit_kl) == len(record.tuned_kl) == handle.info.layers + 1
    folder = translators.find(handle)
    assert folder is not None and folder.name.endswith(digest[:16])
    meta = json.loads((folder / translators.META).read_text())
    assert meta["recipe"]["weight_decay"] == 1e-3 and meta["recipe"]["grad_clip_norm"] == 1.0
    assert translators.for_model(handle).layers == handle.info.layers
    # the same name, other weights: the stored lens is not this model's
    other = dataclasses.replace(handle, language_model=_perturbed_copy(handle.language_model))
    assert translators.weights_hash(other.language_model) != digest
    assert translators.find(other) is None
    with pytest.raises(ResidualError, match="No tuned lens"):
        translators.for_model(other)


def _perturbed_copy(lm):
    import copy

    twin = copy.deepcopy(lm)
    with torch.no_grad():
        next(p for n, p in twin.named_parameters() if "layers.0" in n).add_(1e-3)  # the probe's weights unchanged
    return twin


def test_train_lens_command_trains_any_local_model(tiny_gpt2_dir, tmp_path, monkeypatch, capsys):
    from analysis.residual.cli import cli

    monkeypatch.setattr(translators, "USER_LENS_ROOT", tmp_path / "lenses")
    assert cli(["train-lens", "--model", f"local:{tiny_gpt2_dir}", "--lens-steps", "4", "--lens-batch", "8",
                "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 4 and out["batch"] == 8 and out["lr"] in (0.1, 0.03, 0.01)
    assert len(out["tuned_kl"]) == 3 and out["tuned_kl"][-1] == pytest.approx(0.0, abs=1e-6)
    assert len(list((tmp_path / "lenses").iterdir())) == 1

"""Every SAE sae-lens saves, run by SAE-V exactly as sae-lens runs it (issue 40, item 1).

Each SAE here is made by sae-lens's own classes with random weights and saved by sae-lens (`save_model`,
`save_inference_model`, and for a training checkpoint its `ActivationScaler.save`); never trained by this
project. The references are sae-lens's own `encode` and `decode` on a freshly loaded copy (for a
checkpoint's scale or whitening, sae-lens's `ActivationScaler.scale` / `unscale` around them, as its trainer
applies them), called in sae-lens's order (encode, then decode of those rows), never our code. What SAE-V
does not run is refused when loaded, in one line.
"""
from __future__ import annotations

import pytest
import torch

from analysis import sae_v
from analysis.sae_v.codec import as_codec
from analysis.sae_v.steering import _Steer
from sae_lens_factory import (  # tests/sae_lens_factory.py (tests/ is on the path: conftest)
    ARCHITECTURES, CASES, D_IN, D_SAE, FOLDED, N, TOL, Reference, randomise, save_sae_lens,
)


def _inputs(seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(N, D_IN, generator=gen) * 2.0 + torch.randn(D_IN, generator=gen)


@pytest.mark.parametrize("case,norm", CASES)
def test_codes_and_reconstructions_equal_sae_lens(case, norm, tmp_path):
    folder = save_sae_lens(tmp_path / "sae", case, norm)
    ref = Reference(folder, norm)
    codec = sae_v.load_outside(str(folder))
    x = _inputs()
    expected = ref.encode(x)
    assert (expected > 0).any(), "the reference SAE must have active features for the test to mean anything"
    codes = codec.encode(x)
    assert torch.allclose(codes, expected, atol=TOL, rtol=0), (codes - expected).abs().max()
    assert torch.allclose(sae_v.encode(codec, x), expected, atol=TOL, rtol=0)
    got_codes, recon = codec.reconstruct(x)
    assert torch.allclose(got_codes, expected, atol=TOL, rtol=0)
    assert torch.allclose(recon, ref.reconstruct(x), atol=TOL, rtol=0), (recon - ref.reconstruct(x)).abs().max()
    # in batches of another size than the last encode's (sae-lens's own per-call state would not survive this)
    halves = torch.cat([codec.reconstruct(x[:7])[1], codec.reconstruct(x[7:])[1]])
    assert torch.allclose(halves, recon, atol=TOL, rtol=0)
    if norm in FOLDED:  # the training-time route (scale, encode, decode, unscale) reconstructs the same
        assert torch.allclose(recon, Reference(folder, norm, unfolded=True).reconstruct(x), atol=TOL, rtol=0)


@pytest.mark.parametrize("case,norm", CASES)
@pytest.mark.parametrize("mode", ["add", "clamp"])
def test_steering_equals_sae_lens_decoding_the_edited_codes(case, norm, mode, tmp_path):
    """Steering adds what sae-lens's own reconstruction of each position changes by when the feature's code
    changes (add: + S; clamp: set to S), divided by the position's modality scale."""
    folder = save_sae_lens(tmp_path / "sae", case, norm)
    ref = Reference(folder, norm)
    codec = sae_v.load_outside(str(folder))
    scales = [0.5, 2.0]
    meta = sae_v.SaeMeta(model="m", layer=1, d_in=D_IN, train=None, dataset="", n_pairs=0, n_tokens=0, fve=0,
                         l0=0, dead=0, scales=scales)
    features = {3: 2.5, 17: -1.25}
    mask = torch.zeros(N, dtype=torch.bool)
    mask[5:20] = True  # image positions
    hidden = _inputs(2)[None]
    out = _Steer(codec, meta, features, mode, mask)(None, None, (hidden, "cache"))
    assert out[1] == "cache"
    scale = torch.where(mask, scales[1], scales[0])[:, None]
    x = hidden[0] * scale  # what the SAE reads

    def edit(codes):
        codes = codes.clone()
        for k, s in features.items():
            codes[:, k] = codes[:, k] + s if mode == "add" else s
        return codes

    expected = hidden[0] + (ref.edited(x, edit) - ref.reconstruct(x)) / scale
    assert torch.allclose(out[0][0], expected, atol=TOL, rtol=0), (out[0][0] - expected).abs().max()


def test_strength_zero_adds_nothing(tmp_path):
    codec = sae_v.load_outside(str(save_sae_lens(tmp_path / "sae", "jumprelu", "layer_norm")))
    meta = sae_v.SaeMeta(model="m", layer=1, d_in=D_IN, train=None, dataset="", n_pairs=0, n_tokens=0, fve=0,
                         l0=0, dead=0)
    hidden = _inputs(3)[None]
    assert torch.equal(_Steer(codec, meta, {4: 0.0}, "add", None)(None, None, hidden), hidden)


@pytest.mark.parametrize("norm", FOLDED)
def test_an_unfolded_scale_without_its_scaler_is_refused_in_one_line(norm, tmp_path):
    folder = save_sae_lens(tmp_path / "sae", "standard", norm, scaler=False)
    with pytest.raises(sae_v.SaeFitError) as err:
        sae_v.load_outside(str(folder))
    assert "\n" not in str(err.value) and norm in str(err.value) and "activation_scaler.json" in str(err.value)


def test_matching_pursuit_cannot_fold_a_whitening_is_one_line(tmp_path):
    folder = save_sae_lens(tmp_path / "sae", "matching_pursuit", "covariance_whitening")
    with pytest.raises(sae_v.SaeFitError, match="cannot fold") as err:
        sae_v.load_outside(str(folder))
    assert "\n" not in str(err.value)


def _refused_sae(name: str):
    from sae_lens.registry import SAE_CLASS_REGISTRY

    cls, cfg_cls = SAE_CLASS_REGISTRY[name]
    if name == "temporal":
        return cls(cfg_cls(d_in=64, d_sae=D_SAE, n_heads=2, bottleneck_factor=4))
    if "transcoder" in name:
        return cls(cfg_cls(d_in=D_IN, d_sae=D_SAE, d_out=D_IN, apply_b_dec_to_input=False))
    return cls(cfg_cls(d_in=D_IN, d_sae=D_SAE, k=4))


@pytest.mark.parametrize("name", ["abstopk", "temporal", "transcoder", "skip_transcoder", "jumprelu_transcoder",
                                  "jumprelu_skip_transcoder"])
def test_architectures_sae_v_cannot_read_are_refused_in_one_line(name, tmp_path):
    _refused_sae(name).save_model(tmp_path / "sae")
    with pytest.raises(sae_v.SaeFitError, match=f"architecture '{name}' is not supported") as err:
        sae_v.load_outside(str(tmp_path / "sae"))
    assert "\n" not in str(err.value)


def test_every_registered_architecture_is_run_or_refused():
    """A new sae-lens architecture is noticed here: it must be added to SUPPORTED (and these tests) or REFUSED."""
    from sae_lens.registry import SAE_CLASS_REGISTRY

    from analysis.sae_v import codec

    assert set(SAE_CLASS_REGISTRY) == set(codec.SUPPORTED) | set(codec.REFUSED)
    assert {ARCHITECTURES[c][0] for c in ARCHITECTURES} >= set(codec.SUPPORTED)


def test_an_sae_sae_lens_cannot_load_is_one_line(tmp_path):
    from sae_lens.registry import SAE_TRAINING_CLASS_REGISTRY

    cls, cfg_cls = SAE_TRAINING_CLASS_REGISTRY["batchtopk"]
    cls(cfg_cls(d_in=D_IN, d_sae=D_SAE, k=4)).save_model(tmp_path / "ckpt")  # a batchtopk training checkpoint
    with pytest.raises(sae_v.SaeFitError, match="sae-lens could not load this SAE") as err:
        sae_v.load_outside(str(tmp_path / "ckpt"))
    assert "\n" not in str(err.value) and str(tmp_path) not in str(err.value)


def test_the_callers_sae_is_not_changed_by_making_a_codec():
    from sae_lens import StandardSAE, StandardSAEConfig

    sae = StandardSAE(StandardSAEConfig(d_in=D_IN, d_sae=D_SAE, normalize_activations="layer_norm"))
    randomise(sae, 4)
    x = _inputs(4)
    before = sae.encode(x)
    codec = as_codec(sae)
    assert torch.equal(sae.encode(x), before) and torch.allclose(codec.encode(x), before, atol=TOL)

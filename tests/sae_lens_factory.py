"""SAEs made and saved by sae-lens's own classes (never trained by this project), for the SAE-V tests: every
architecture and input normalisation sae-lens saves, and sae-lens's own forward on them as a reference; and
a folder of image-caption pairs with a few bad rows."""
from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

D_IN, D_SAE, N = 16, 48, 40
TOL = 1e-4

# architecture case -> (registry name, training class?, extra config)
ARCHITECTURES = {
    "standard": ("standard", False, {}),
    "gated": ("gated", False, {}),
    "jumprelu": ("jumprelu", False, {}),
    "topk": ("topk", False, {"k": 6}),
    "topk-rescaled": ("topk", False, {"k": 6, "rescale_acts_by_decoder_norm": True}),
    "matching_pursuit": ("matching_pursuit", False, {"residual_threshold": 0.05, "max_iterations": 8}),
    "batchtopk": ("batchtopk", True, {"k": 6}),  # saved for inference as jumprelu
    "matryoshka_batchtopk": ("matryoshka_batchtopk", True, {"k": 6, "matryoshka_widths": [16, D_SAE]}),
}
PER_TOKEN = ["none", "layer_norm", "constant_norm_rescale"]
FOLDED = ["expected_average_only_in", "covariance_whitening"]
CASES = [(a, n) for a in ARCHITECTURES for n in PER_TOKEN + FOLDED
         # sae-lens writes a training checkpoint (the folded normalisations) only for registered inference
         # classes: batchtopk / matryoshka checkpoints say architecture 'batchtopk', which SAE.load_from_disk
         # cannot read (refused in one line: test_an_sae_sae_lens_cannot_load_is_one_line); matching pursuit
         # cannot fold a whitening (sae-lens raises NotImplementedError: refused, tested below)
         if not (ARCHITECTURES[a][1] and n in FOLDED) and not (a == "matching_pursuit" and n == "covariance_whitening")]


def randomise(sae, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(sae.named_parameters()) + list(sae.named_buffers()):
            p.copy_(torch.randn(p.shape, generator=gen) * (0.4 if p.dim() > 1 else 0.2))
            if "threshold" in name:
                p.abs_().add_(0.05)
        if sae.cfg.architecture() == "matching_pursuit":
            sae.W_dec.copy_(torch.nn.functional.normalize(sae.W_dec, dim=1))


def _scaler(norm: str, seed: int, d_in: int = D_IN):
    from sae_lens.training.activation_scaler import ActivationScaler, ActivationWhitening

    gen = torch.Generator().manual_seed(seed + 100)
    if norm == "expected_average_only_in":
        return ActivationScaler(scaling_factor=0.37)
    a = torch.randn(d_in, d_in, generator=gen) * 0.2 + torch.eye(d_in)
    return ActivationScaler(whitening=ActivationWhitening(mean=torch.randn(d_in, generator=gen), matrix=a,
                                                          inverse_matrix=torch.linalg.inv(a)))


def save_sae_lens(folder, case: str, norm: str, seed: int = 0, scaler: bool = True, d_in: int | None = None,
                  hook: str = "blocks.1.hook_resid_post"):
    """An SAE of this architecture and normalisation, saved by sae-lens; a folded normalisation is saved as a
    training checkpoint is (save_model + activation_scaler.json), unless `scaler` is False."""
    from sae_lens.registry import SAE_CLASS_REGISTRY, SAE_TRAINING_CLASS_REGISTRY
    from sae_lens.saes.sae import SAEMetadata

    name, training, extra = ARCHITECTURES[case]
    registry = SAE_TRAINING_CLASS_REGISTRY if training else SAE_CLASS_REGISTRY
    cls, cfg_cls = registry[name]
    torch.manual_seed(seed)
    cfg = cfg_cls(d_in=d_in or D_IN, d_sae=D_SAE, normalize_activations=norm, metadata=SAEMetadata(hook_name=hook),
                  **extra)
    sae = cls(cfg)
    randomise(sae, seed)
    if training:
        sae.save_inference_model(folder)
    else:
        sae.save_model(folder)
    if norm in FOLDED and scaler:
        _scaler(norm, seed, d_in or D_IN).save(str(folder / "activation_scaler.json"))
    return folder


class Reference:
    """sae-lens's own forward on a fresh copy of the saved SAE: encode, then decode of the same rows. A
    checkpoint's scale or whitening is folded into the copy by sae-lens's own fold methods, as its trainer
    does when training ends (`unfolded` keeps sae-lens's training-time route instead: ActivationScaler.scale,
    encode, decode, unscale; the same reconstruction, and the same codes except for a TopK SAE with
    rescale_acts_by_decoder_norm, whose codes sae-lens's scale fold divides by the factor)."""

    def __init__(self, folder, norm: str, seed: int = 0, unfolded: bool = False) -> None:
        from sae_lens import SAE

        self.sae = SAE.load_from_disk(folder).eval()
        self.scaler = _scaler(norm, seed, int(self.sae.cfg.d_in)) if norm in FOLDED else None
        if self.scaler is not None and not unfolded:
            w = self.scaler.whitening
            if w is None:
                self.sae.fold_activation_norm_scaling_factor(self.scaler.scaling_factor)
            else:
                self.sae.fold_activation_whitening(mean=w.mean, whitening_matrix=w.matrix,
                                                   unwhitening_matrix=w.inverse_matrix)
            self.scaler = None

    def _in(self, x):
        return self.scaler.scale(x) if self.scaler is not None else x

    def _out(self, y):
        return self.scaler.unscale(y) if self.scaler is not None else y

    def encode(self, x):
        with torch.no_grad():
            return self.sae.encode(self._in(x))

    def reconstruct(self, x):
        with torch.no_grad():
            return self._out(self.sae.decode(self.sae.encode(self._in(x))))

    def edited(self, x, edit):
        """The reconstruction after `edit(codes)` (sae-lens's encode / decode order kept)."""
        with torch.no_grad():
            return self._out(self.sae.decode(edit(self.sae.encode(self._in(x)))))


def save_outside_sae(folder, d_in: int, hook: str | None, seed: int = 0, d_sae: int = 24):
    """A random-weight SAE made and saved by sae-lens's own classes (never trained by this project)."""
    from sae_lens import StandardSAE, StandardSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    torch.manual_seed(seed)
    meta = SAEMetadata(hook_name=hook, model_name="someone-else") if hook else SAEMetadata(model_name="x")
    sae = StandardSAE(StandardSAEConfig(d_in=d_in, d_sae=d_sae, metadata=meta))
    with torch.no_grad():
        sae.b_enc.fill_(0.05)
    sae.save_model(folder)
    return folder


def write_pair_folder(folder, n: int = 10, bad: bool = True):
    """PNG images + captions.jsonl with a label column; with `bad`: a missing image, an empty caption and a
    file that is not an image (rows 3, 5 and 7)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        name = f"img{i}.png"
        Image.new("RGB", (32, 32), (20 * i, 255 - 20 * i, 90)).save(folder / name)
        lines.append({"image": name, "caption": " ".join(f"w{(i * 7 + j) % 100}" for j in range(5)),
                      "corrupted": i % 3 == 1})
    if bad:
        lines[3]["image"] = "gone.png"
        lines[5]["caption"] = "  "
        (folder / "img7.png").write_bytes(b"not a png at all")
    (folder / "captions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """SAE-V's cache (trained SAEs, feature stores, rankings, uploads) in a private folder for one test
    module; a test module uses it by importing this fixture."""
    from analysis import sae_v

    old = sae_v.types.CACHE_ROOT
    sae_v.types.CACHE_ROOT = tmp_path_factory.mktemp("sae-cache")
    yield sae_v.types.CACHE_ROOT
    sae_v.types.CACHE_ROOT = old

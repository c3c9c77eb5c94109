"""One way to run an SAE: encode, reconstruct and steer, with its input normalisation applied as sae-lens
applies it, checked once when the SAE is loaded.

sae-lens keeps a per-call state for two of its normalisations (`layer_norm` stores each token's mean and
spread on the SAE in `encode` and deletes them in `decode`; `constant_norm_rescale` stores a per-token
factor): decoding other rows than the last encoded batch then fails or uses the wrong state, and two
sessions sharing one SAE would overwrite each other's. `Codec` applies the same formulas without state:
each call normalises its own rows and undoes it on the same rows. Every other part of SAE-V encodes
through a Codec (`as_codec`), never through `sae.encode` directly.

What is supported, decided here at load time (one line for anything else):
- architectures: standard, gated, jumprelu (also what batchtopk and matryoshka training save), topk,
  matching_pursuit; refused: abstopk (signed codes: SAE-V's labels, ω and s_i read activations >= 0),
  temporal (reads each token with the ones before it), the transcoders (they reconstruct another hook);
- normalisations: none, layer_norm, constant_norm_rescale; expected_average_only_in and
  covariance_whitening when the folder holds sae-lens's `activation_scaler.json` (a training checkpoint:
  the scale or whitening is folded into the weights with sae-lens's own fold, as its trainer does at the
  end of training); without it the scale is unknown and the SAE is refused;
- input reshaping (`hook_z`): refused (SAE-V reads residual vectors).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from analysis.framework.errors import SettingsError

SUPPORTED = ("standard", "gated", "jumprelu", "topk", "matching_pursuit")
REFUSED = {
    "abstopk": "its codes are signed (AbsTopK), while SAE-V's modality labels, ω and s_i read activations >= 0",
    "temporal": "a temporal SAE reads each token together with the tokens before it; SAE-V encodes tokens one "
                "by one",
    "transcoder": "a transcoder reconstructs another hook than the one it reads; SAE-V needs an SAE",
    "skip_transcoder": "a transcoder reconstructs another hook than the one it reads; SAE-V needs an SAE",
    "jumprelu_transcoder": "a transcoder reconstructs another hook than the one it reads; SAE-V needs an SAE",
    "jumprelu_skip_transcoder": "a transcoder reconstructs another hook than the one it reads; SAE-V needs an SAE",
}
PER_TOKEN = ("none", "layer_norm", "constant_norm_rescale")  # applied at every call
FOLDED = ("expected_average_only_in", "covariance_whitening")  # folded into the weights at load
SCALER_FILE = "activation_scaler.json"  # sae-lens's ACTIVATION_SCALER_CFG_FILENAME
LN_EPS = 1e-5  # sae-lens's run_time_activation_ln_in default
BATCH = 4096


class SaeFitError(SettingsError):
    """An SAE that cannot be loaded, is not supported, or does not fit the loaded model; the message says
    why in one line."""


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class Codec:
    """A sae-lens SAE behind a stateless encode / reconstruct / steer. Build it with `as_codec`."""

    def __init__(self, sae, normalisation: str) -> None:
        self._sae = sae  # its own runtime normalisation is switched off: this class applies it
        self.normalisation = normalisation
        self.cfg = sae.cfg
        self.d_sae = int(sae.cfg.d_sae)
        self.d_in = int(sae.cfg.d_in)
        self.code_scale = 1.0  # codes over the checkpoint's training-time codes (fold_saved_scaler measures it)

    @property
    def W_dec(self) -> torch.Tensor:  # noqa: N802  (sae-lens's name)
        return self._sae.W_dec

    @property
    def architecture(self) -> str:
        return self.cfg.architecture()

    # -- the normalisation, per token ---------------------------------------------------------------

    def _normalise(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input as the SAE sees it, gain, offset): the SAE's output y maps back as y * gain + offset."""
        ones = torch.ones(x.shape[0], 1, dtype=x.dtype)
        if self.normalisation == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            centred = x - mu
            std = centred.std(dim=-1, keepdim=True)
            return centred / (std + LN_EPS), std, mu
        if self.normalisation == "constant_norm_rescale":
            coeff = (self.d_in ** 0.5) / x.norm(dim=-1, keepdim=True)
            return x * coeff, 1.0 / coeff, torch.zeros_like(ones)
        return x, ones, torch.zeros_like(ones)

    # -- encode, reconstruct, steer -------------------------------------------------------------------

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Codes (N, d_sae), float32, of residual vectors (N, d_in)."""
        with torch.no_grad():
            return torch.cat([self._encode(x[i:i + BATCH]) for i in range(0, x.shape[0], BATCH)]) \
                if x.shape[0] else torch.zeros(0, self.d_sae)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        inside, _, _ = self._normalise(x.float())
        return self._sae.encode(inside).float()

    def reconstruct(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes, reconstruction in the input's own space) of residual vectors (N, d_in)."""
        codes, recon = [], []
        with torch.no_grad():
            for i in range(0, x.shape[0], BATCH):
                inside, gain, offset = self._normalise(x[i:i + BATCH].float())
                c = self._sae.encode(inside)
                codes.append(c.float())
                recon.append(self._sae.decode(c).float() * gain + offset)
        if not codes:
            return torch.zeros(0, self.d_sae), torch.zeros(0, self.d_in)
        return torch.cat(codes), torch.cat(recon)

    def directions(self, keys: list[int]) -> torch.Tensor:
        """What one unit of each feature adds to the SAE's output before the normalisation is undone:
        decode(e_k) - decode(0). Not W_dec[k] itself: a TopK SAE with `rescale_acts_by_decoder_norm`
        divides by the row's norm."""
        with torch.no_grad():
            eye = torch.zeros(len(keys), self.d_sae, dtype=self._sae.W_dec.dtype)
            eye[torch.arange(len(keys)), torch.tensor(keys, dtype=torch.long)] = 1.0
            zero = torch.zeros(1, self.d_sae, dtype=self._sae.W_dec.dtype)
            return (self._sae.decode(eye) - self._sae.decode(zero)).float()

    def steer_delta(self, x: torch.Tensor, keys: list[int], amount: torch.Tensor) -> torch.Tensor:
        """The change of the SAE's reconstruction of each row of `x` when feature keys[j] changes by
        amount[:, j] (T, K): the decoder's change scaled back by each row's own normalisation gain."""
        _, gain, _ = self._normalise(x.float())
        return (amount.float() @ self.directions(keys)) * gain


def as_codec(sae) -> Codec:
    """A Codec for a sae-lens SAE (a Codec is returned as it is). The SAE is copied when its runtime
    normalisation has to be switched off, so the caller's object is never changed."""
    if isinstance(sae, Codec):
        return sae
    check_supported(sae.cfg)
    norm = sae.cfg.normalize_activations
    if norm in FOLDED:
        raise SaeFitError(_unfolded(norm))
    if norm != "none":
        sae = copy.deepcopy(sae)
        sae.run_time_activation_norm_fn_in = _identity
        sae.run_time_activation_norm_fn_out = _identity
    return Codec(sae, norm)


def check_supported(cfg) -> None:
    """SaeFitError (one line) for an architecture, normalisation or reshaping SAE-V does not run."""
    arch = cfg.architecture()
    if arch in REFUSED:
        raise SaeFitError(f"This SAE's architecture '{arch}' is not supported: {REFUSED[arch]}.")
    if arch not in SUPPORTED:
        raise SaeFitError(f"This SAE's architecture '{arch}' is not supported (supported: {', '.join(SUPPORTED)}).")
    norm = cfg.normalize_activations
    if norm not in PER_TOKEN + FOLDED:
        raise SaeFitError(f"This SAE's input normalisation '{norm}' is not supported (supported: "
                          f"{', '.join(PER_TOKEN + FOLDED)}).")
    if getattr(cfg, "reshape_activations", "none") not in ("none", None):
        raise SaeFitError(f"This SAE reshapes its input ({cfg.reshape_activations}); the SAE-V panel reads plain "
                          "residual vectors.")


def _unfolded(norm: str) -> str:
    return (f"This SAE was saved with normalize_activations='{norm}' not folded into its weights and without "
            f"sae-lens's {SCALER_FILE} beside it, so the scale its inputs need is unknown (sae-lens folds it when "
            "training ends: save the SAE with save_inference_model, or keep the checkpoint's "
            f"{SCALER_FILE}).")


def fold_saved_scaler(sae, folder: Path) -> float:
    """A checkpoint saved while training (`normalize_activations` expected_average_only_in or
    covariance_whitening, with activation_scaler.json beside it): fold the scale or the whitening into the
    weights with sae-lens's own methods, as its trainer does when training ends. Nothing for other SAEs.

    Returns the folded SAE's codes over the checkpoint's training-time codes (scale the input, then encode),
    measured on a probe batch: 1.0 for most architectures, 1/s for a scale s folded into a TopK SAE with
    `rescale_acts_by_decoder_norm` or a matching-pursuit SAE (sae-lens's fold divides their decoder rows by
    s, and their codes carry the rows' norm); reconstructions are the same either way."""
    check_supported(sae.cfg)  # an architecture SAE-V refuses is refused as such, before sae-lens tries a fold
    norm = sae.cfg.normalize_activations
    if norm not in FOLDED or not (folder / SCALER_FILE).is_file():
        return 1.0
    from sae_lens.training.activation_scaler import ActivationScaler

    scaler = ActivationScaler()
    try:
        scaler.load(folder / SCALER_FILE)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise SaeFitError(f"sae-lens's {SCALER_FILE} of this SAE cannot be read ({type(exc).__name__}).") from None
    try:
        if norm == "expected_average_only_in" and scaler.scaling_factor is not None:
            s = float(scaler.scaling_factor)
            probe = torch.randn(256, int(sae.cfg.d_in), generator=torch.Generator().manual_seed(0)) / s
            with torch.no_grad():
                before = sae.encode(probe * s).float()  # the trainer's route: scale, then encode
            sae.fold_activation_norm_scaling_factor(s)
            with torch.no_grad():
                after = sae.encode(probe).float()
            return code_ratio(before, after)
        elif norm == "covariance_whitening" and scaler.whitening is not None:
            w = scaler.whitening
            sae.fold_activation_whitening(mean=w.mean, whitening_matrix=w.matrix, unwhitening_matrix=w.inverse_matrix)
    except NotImplementedError as exc:  # e.g. matching pursuit cannot fold a whitening
        raise SaeFitError(f"sae-lens cannot fold this SAE's {norm}: {str(exc).splitlines()[0][:200]}") from None
    return 1.0


def code_ratio(before: torch.Tensor, after: torch.Tensor) -> float:
    """c with after = c * before (least squares), 1.0 when they are equal to 1e-4; NaN when no constant
    factor maps one onto the other."""
    scale = float((after * before).sum() / (before * before).sum().clamp_min(1e-30))
    if not torch.allclose(after, scale * before, rtol=1e-3, atol=1e-5 * float(before.abs().max().clamp_min(1.0))):
        return float("nan")
    return 1.0 if abs(scale - 1.0) < 1e-4 else scale

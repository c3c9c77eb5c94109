"""Lenses: read a residual-stream state as a next-token distribution.

- the logit lens (nostalgebraist 2020): the model's own final norm and unembedding applied to state l,
  exactly as the model applies them after its last layer (Gemma's (1 + w) RMSNorm, Llama's RMSNorm,
  GPT-2's LayerNorm, OPT's projection, Gemma 2's logit soft-cap); at the last state it is the model's
  own logits;
- the tuned lens (Belrose et al. 2023, "Eliciting Latent Predictions from Transformers with the Tuned
  Lens"): one affine translator per layer, h -> h + W h + b, trained to match the final distribution
  (analysis/zoo/train/tuned_lens.py), then the same readout. The last state needs none.

Each lens is a small class registered in `LENSES`; `readout` is the shared final step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from analysis.model_access import anatomy
from analysis.model_access.models import ModelHandle
from analysis.framework.registry import Method, Registry
from analysis.residual import translators
from analysis.residual.sites import project_out


def readout(lm: torch.nn.Module, states: torch.Tensor, *, softcap: bool = True) -> torch.Tensor:
    """Next-token logits of residual states (..., D): the model's final norm, OPT's projection if any, its
    unembedding and (with `softcap`) Gemma 2's soft-cap, in the model's own modules and order."""
    logits = anatomy.unembedding(lm)(unembedding_input(lm, states))
    return capped(lm, logits) if softcap else logits


def unembedding_input(lm: torch.nn.Module, states: torch.Tensor) -> torch.Tensor:
    """What the unembedding reads from residual states: the final norm's output (and OPT's projection's)."""
    norm = anatomy.final_norm(lm)
    x = norm(states) if norm is not None else states
    proj = project_out(lm)
    return proj(x) if proj is not None else x


def capped(lm: torch.nn.Module, logits: torch.Tensor) -> torch.Tensor:
    """Gemma 2's logit soft-cap applied to `logits` (unchanged for every other model)."""
    cap = anatomy.logit_softcap(lm)
    return torch.tanh(logits / cap) * cap if cap else logits


class Lens(Method):
    """A map from the states of every layer (L + 1, T, D) to logits (L + 1, T, V)."""

    def prepare(self, handle: ModelHandle) -> None:
        """Load what the lens needs for this model; a ResidualError saying why when it cannot."""

    def translate(self, handle: ModelHandle, layer: int, states: torch.Tensor) -> torch.Tensor:
        """The state the readout reads for `layer` (the logit lens: the state itself)."""
        return states

    def layer_logits(self, handle: ModelHandle, layer: int, states: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return readout(handle.language_model, self.translate(handle, layer, states))


LENSES: Registry[Lens] = Registry("lens")


@LENSES.register
@dataclass
class LogitLens(Lens):
    name: ClassVar[str] = "logit"
    label: ClassVar[str] = "Logit lens"
    summary: ClassVar[str] = "The model's final norm and unembedding applied to every layer's residual stream."


@LENSES.register
@dataclass
class TunedLens(Lens):
    name: ClassVar[str] = "tuned"
    label: ClassVar[str] = "Tuned lens"
    summary: ClassVar[str] = ("An affine translator per layer, trained to match the final distribution "
                              "(Belrose et al. 2023), then the final norm and unembedding.")

    def prepare(self, handle: ModelHandle) -> None:
        self._translators = translators.for_model(handle)

    def translate(self, handle: ModelHandle, layer: int, states: torch.Tensor) -> torch.Tensor:
        return self._translators.apply(layer, states)

"""Defences: what the attacker sees instead of the plain hidden states.

Each defence is a small class registered in `DEFENCES` that owns its settings (dataclass fields described
by `setting(...)`, validated when the class is built). Its `kind` places it on the page: a "permutation"
hides where values are, a "perturbation" changes them. Adding a defence is one decorated class: the page,
a shared link and the command line pick up its settings from its fields.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from analysis.framework.registry import Method, Registry
from analysis.framework.settings import setting

DEFENCES: Registry["Defence"] = Registry("defence")
NO_DEFENCE = "none"  # the selectboxes' "no defence" choice (not a class: it changes nothing)
NO_DEFENCE_LABEL = "no defence"


@dataclass
class Defence(Method):
    """What the attacker sees instead of the plain states (rows: positions, columns: hidden dimensions)."""

    kind: ClassVar[str] = "perturbation"
    moves_rows: ClassVar[bool] = False  # rows are permuted: match against all unmatched rows
    moves_dims: ClassVar[bool] = False  # hidden dimensions are permuted: compare sorted vectors

    def apply(self, states: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return states

    def tolerance(self, states: torch.Tensor) -> float:
        """Largest L1 change (w.h.p.) the defence adds to a true match (reported, not used to stop early)."""
        return 0.0

    @property
    def perturbs(self) -> bool:
        """Whether it changes values (then no candidate matches exactly and the whole vocabulary is scored)."""
        return False


@DEFENCES.register
@dataclass
class ShufflePositions(Defence):
    name: ClassVar[str] = "shuffle_positions"
    label: ClassVar[str] = "shuffled positions"
    kind: ClassVar[str] = "permutation"
    moves_rows: ClassVar[bool] = True

    def apply(self, states, gen):
        return states[torch.randperm(len(states), generator=gen)]


@DEFENCES.register
@dataclass
class ShuffleDims(Defence):
    name: ClassVar[str] = "shuffle_dims"
    label: ClassVar[str] = "shuffled hidden dimensions"
    kind: ClassVar[str] = "permutation"
    moves_dims: ClassVar[bool] = True

    def apply(self, states, gen):
        return states[:, torch.randperm(states.shape[1], generator=gen)]


@DEFENCES.register
@dataclass
class ShuffleBoth(Defence):
    name: ClassVar[str] = "shuffle_both"
    label: ClassVar[str] = "shuffled positions and dimensions"
    kind: ClassVar[str] = "permutation"
    moves_rows: ClassVar[bool] = True
    moves_dims: ClassVar[bool] = True

    def apply(self, states, gen):
        return ShuffleDims().apply(ShufflePositions().apply(states, gen), gen)


@DEFENCES.register
@dataclass
class GaussianNoise(Defence):
    name: ClassVar[str] = "gaussian_noise"
    label: ClassVar[str] = "Gaussian noise"
    sigma: float = setting(0.5, label="Noise σ (× state std)", low=0.0, high=100.0, step=0.1, url="noise",
                           cli="noise", help="Standard deviation of the added noise, as a multiple of the "
                                             "standard deviation of the clean states.")

    @property
    def perturbs(self) -> bool:
        return self.sigma > 0

    def apply(self, states, gen):
        noise = torch.randn(states.shape, generator=gen) * (self.sigma * float(states.std()))
        return states + noise.to(states)

    def tolerance(self, states):
        # L1 norm of d iid N(0, s^2) values: mean d*s*sqrt(2/pi), std s*sqrt(d*(1-2/pi)); allow 4 std.
        d, s = states.shape[1], self.sigma * float(states.std())
        return d * s * math.sqrt(2 / math.pi) + 4 * s * math.sqrt(d * (1 - 2 / math.pi))


@DEFENCES.register
@dataclass
class Quantise(Defence):
    name: ClassVar[str] = "quantise"
    label: ClassVar[str] = "quantisation"
    bits: int = setting(4, label="Quantisation bits", low=1, high=32, url="bits", cli="bits",
                        help="Bits per value of uniform quantisation between the states' minimum and maximum.")

    @property
    def perturbs(self) -> bool:
        return True

    def _step(self, states) -> tuple[float, float]:
        lo, hi = float(states.min()), float(states.max())
        return lo, max(hi - lo, 1e-12) / (2 ** self.bits - 1)

    def apply(self, states, gen):
        lo, step = self._step(states)
        return torch.round((states - lo) / step) * step + lo

    def tolerance(self, states):
        return states.shape[1] * self._step(states)[1] / 2  # rounding moves each value by <= step/2


def defence_names(kind: str) -> list[str]:
    """"none" and the registered defences of one kind ("permutation" or "perturbation")."""
    return [NO_DEFENCE] + [name for name, cls in DEFENCES.items() if cls.kind == kind]


def defence_label(name: str) -> str:
    return NO_DEFENCE_LABEL if name in ("", NO_DEFENCE) else DEFENCES.label(name)

"""The hallucination score and the flag (CapMAS): H(u) = -log max(p_T - p_F, eps), flagged when H(u) > pi.

How H reads the verifier's (p_T, p_F) is a small method, a probability form, registered by its stable
name in `PROBABILITY_FORMS` (it appears in URLs and saved analyses) and owning its settings (none yet):
raw next-token probabilities by default, as the paper writes H, or renormalised over yes and no.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from analysis.framework.registry import Method, Registry

DEFAULT_PI = 1.0
DEFAULT_EPS = 1e-4
DEFAULT_PROBABILITIES = "raw"  # the paper's H reads the raw p(T|x,Q(u)), p(F|x,Q(u))
LOW_MASS = 0.5  # below this yes+no mass the verifier is mostly answering something else

PROBABILITY_FORMS: Registry["ProbabilityForm"] = Registry("p_True/p_False form")


@dataclass
class ProbabilityForm(Method):
    """How the hallucination score reads the verifier's (p_T, p_F)."""

    def read(self, p_true: float, p_false: float) -> tuple[float, float]:
        raise NotImplementedError


@PROBABILITY_FORMS.register
@dataclass
class RawProbabilities(ProbabilityForm):
    """The paper's form: the raw next-token probabilities of yes and no. Mass that leaks to other
    tokens lowers both, so p_T - p_F shrinks and H rises."""

    name: ClassVar[str] = "raw"
    label: ClassVar[str] = "raw p_T, p_F (CapMAS, as in the paper)"

    def read(self, p_true, p_false):
        return p_true, p_false


@PROBABILITY_FORMS.register
@dataclass
class RenormalisedProbabilities(ProbabilityForm):
    """p_T / (p_T + p_F) and p_F / (p_T + p_F): the answer among yes and no only, whatever mass
    went elsewhere (0, 0 when no mass is on either: nothing to read)."""

    name: ClassVar[str] = "renormalised"
    label: ClassVar[str] = "renormalised p_T/(p_T+p_F) (variant)"

    def read(self, p_true, p_false):
        mass = p_true + p_false
        return (p_true / mass, p_false / mass) if mass > 0 else (0.0, 0.0)


def probability_form(name: str, **settings) -> ProbabilityForm:
    """The form `name` with its settings, validated (UnknownMethod, a SettingsError, for an unknown name)."""
    return PROBABILITY_FORMS.create(name, **settings)


def hallucination_score(p_true: float, p_false: float, eps: float = DEFAULT_EPS,
                        probabilities: str | ProbabilityForm = DEFAULT_PROBABILITIES) -> float:
    """H(u) = -log max(p_T - p_F, eps) (CapMAS): 0 for a certain 'true', -log eps for 'false'.
    `probabilities` (a form or its name) says how p_T and p_F are read first (raw by default, as in the paper)."""
    form = probability_form(probabilities) if isinstance(probabilities, str) else probabilities
    p_true, p_false = form.read(p_true, p_false)
    return -math.log(max(p_true - p_false, eps))

"""The temperature rules: which inverse temperature β each attention row gets (pure tensor maths).

A rule is a small method class that owns its settings (`RULES`: softmax, a fixed θ, the paper's
adaptive θ). `Temperature` is the choice that travels in params and results: a rule's name, its
settings, and the layers it applies in (the others keep plain softmax).

With logits s of spread δ every softmax weight lies in [e^(-δ/θ)/n, e^(δ/θ)/n], so a fixed head
disperses as the number of items n grows ("Softmax is not enough", Veličković et al., ICML 2025).
The paper's inference-time fix picks β per row from the entropy H of softmax(s): β = max(poly(H), 1)
for H > 0.5, else 1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from analysis.framework.errors import SettingsError
from analysis.framework.registry import Method, Registry
from analysis.framework.results import Result
from analysis.framework.settings import setting
from analysis.sharpness.errors import SharpnessError

# "Softmax is not enough", adaptive temperature: poly(H) coefficients, highest degree first.
ADAPTIVE_POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)
ADAPTIVE_MIN_ENTROPY = 0.5

RULES: Registry = Registry("temperature rule")


def entropy_nats(p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """-Σ p ln p along `dim`, with 0 ln 0 = 0 (masked keys carry exactly zero weight)."""
    return -torch.special.xlogy(p, p).sum(dim)


def row_entropy(scores: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(scores) along the last axis, without forming p ln p with p = 0."""
    log_p = torch.log_softmax(scores, dim=-1)
    return -(log_p.exp().mul_(log_p)).sum(-1)


def softmax_entropy(s: torch.Tensor, p: torch.Tensor, top: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """Entropy of p = softmax(s) as logsumexp(s) - Σ p s, with logsumexp(s) = max s - ln max p.

    Reductions only, no second exp pass (exp of very negative masked logits is slow on CPU).
    `top` = max s per row; rows not `live` (fully masked) are uniform: H = ln(keys).
    """
    h = top - p.amax(-1).log() - torch.linalg.vecdot(p, s)
    if torch.isnan(h).any():  # a -inf logit gives 0 * -inf; redo with finite logits
        h = top - p.amax(-1).log() - torch.linalg.vecdot(p, s.clamp_min(torch.finfo(s.dtype).min))
    return torch.where(live, h, math.log(s.shape[-1])).clamp_min(0.0)


def adaptive_beta(entropy: torch.Tensor, min_entropy: float = ADAPTIVE_MIN_ENTROPY) -> torch.Tensor:
    """Inverse temperature of the adaptive rule for rows with the given entropy (nats)."""
    poly = torch.zeros_like(entropy)
    for c in ADAPTIVE_POLY:  # Horner
        poly = poly * entropy + c
    return torch.where(entropy > min_entropy, poly.clamp(min=1.0), torch.ones_like(entropy))


def beta_curve(h_max: float = 8.0, points: int = 321,
               min_entropy: float = ADAPTIVE_MIN_ENTROPY) -> tuple[list[float], list[float]]:
    """(H, β(H)) samples of the adaptive rule, for the β(H) view."""
    h = torch.linspace(0.0, h_max, points, dtype=torch.float64)
    return h.tolist(), adaptive_beta(h, min_entropy).tolist()


def sharpening_interval() -> tuple[float, float]:
    """Entropies (nats) between which the adaptive rule actually sharpens (poly(H) > 1)."""
    h, beta = beta_curve(10.0, 100_001)
    inside = [x for x, b in zip(h, beta) if b > 1.0]
    return (inside[0], inside[-1]) if inside else (float("nan"), float("nan"))


# ---------------------------------------------------------------------------------------------
# The rules


class Rule(Method):
    """β for attention rows: `beta(entropy)`; `needs_entropy` when β depends on the row."""

    needs_entropy: ClassVar[bool] = False

    def beta(self, entropy: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def describe(self) -> str:
        """The rule as the figures and tables name it ("softmax", "θ = 0.5", "adaptive θ")."""
        return self.label


@RULES.register
@dataclass(frozen=True)
class Softmax(Rule):
    name: ClassVar[str] = "softmax"
    label: ClassVar[str] = "softmax"
    colour: ClassVar[str] = "#636efa"

    def beta(self, entropy: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(entropy)


@RULES.register
@dataclass(frozen=True)
class FixedTheta(Rule):
    """softmax(s / θ) in every row."""

    name: ClassVar[str] = "fixed"
    label: ClassVar[str] = "fixed θ"
    theta: float = setting(1.0, label="Temperature θ", low=1e-6, high=1e6, url=None, cli=None,
                           help="softmax(s / θ): θ < 1 sharpens, θ > 1 flattens.")

    def beta(self, entropy: torch.Tensor) -> torch.Tensor:
        return torch.full_like(entropy, 1.0 / self.theta)

    def describe(self) -> str:
        return f"θ = {self.theta:g}"


@RULES.register
@dataclass(frozen=True)
class AdaptiveTheta(Rule):
    """The paper's rule: β = max(poly(H), 1) for rows whose softmax entropy H exceeds `min_entropy`."""

    name: ClassVar[str] = "adaptive"
    label: ClassVar[str] = "adaptive θ"
    colour: ClassVar[str] = "#ef553b"
    needs_entropy: ClassVar[bool] = True
    min_entropy: float = setting(ADAPTIVE_MIN_ENTROPY, label="Adaptive θ: rows left alone up to H (nats)",
                                 low=0.0, high=10.0, step=0.1, width=220,
                                 help="Rows whose softmax entropy is at most this keep β = 1 (the paper: 0.5).")

    def beta(self, entropy: torch.Tensor) -> torch.Tensor:
        return adaptive_beta(entropy, self.min_entropy)


def rule_settings(**flat) -> dict[str, dict]:
    """{rule name: its settings} from settings named by field (`min_entropy=0.3`); unknown names refused."""
    try:
        return RULES.split_settings(**flat)
    except SettingsError as exc:
        raise SharpnessError(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# The choice that travels: a rule, its settings, its layers


@dataclass(frozen=True)
class Temperature(Result):
    """Which rule the attention applies (`mode`, a name in RULES), with its settings, in which layers."""

    mode: str = "softmax"
    settings: dict[str, float] = field(default_factory=dict)  # the rule's own settings ({"theta": 0.5})
    layers: tuple[int, ...] | None = None  # layers the rule applies in (None: all); others use softmax

    def __post_init__(self) -> None:
        if self.mode not in RULES:
            raise SharpnessError(f"Unknown temperature rule '{self.mode}' (use {', '.join(RULES)}).")
        fields = RULES.get(self.mode).__dataclass_fields__
        unknown = set(self.settings) - set(fields)
        if unknown:
            raise SharpnessError(f"{RULES.label(self.mode)} has no setting(s) {', '.join(sorted(unknown))}.")
        try:
            rule = RULES.create(self.mode, **self.settings)
        except SettingsError as exc:  # a setting out of its range: the panel's own error
            raise SharpnessError(str(exc)) from None
        object.__setattr__(self, "_rule", rule)
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(sorted(set(int(x) for x in self.layers))))

    @classmethod
    def fixed(cls, theta: float, layers=None) -> "Temperature":
        return cls("fixed", {"theta": theta}, layers)

    @classmethod
    def adaptive(cls, layers=None, **settings) -> "Temperature":
        return cls("adaptive", settings, layers)

    @classmethod
    def from_dict(cls, data: dict) -> "Temperature":
        """Also reads the layout before rules owned their settings: {"mode", "theta", "layers"}."""
        data = dict(data)
        theta = data.pop("theta", None)
        if "settings" not in data:
            data["settings"] = {"theta": theta} if data.get("mode") == "fixed" and theta is not None else {}
        layers = data.get("layers")
        return cls(mode=data.get("mode", "softmax"), settings=dict(data["settings"] or {}),
                   layers=tuple(layers) if layers is not None else None)

    @property
    def rule(self) -> Rule:
        return self._rule  # type: ignore[attr-defined]

    @property
    def theta(self) -> float | None:
        return self.settings.get("theta") if self.mode == "fixed" else None

    def in_layer(self, layer: int | None) -> "Temperature":
        """The rule for one layer: itself, or plain softmax where it is not applied."""
        return self if self.layers is None or layer in self.layers else SOFTMAX

    @property
    def label(self) -> str:
        return self.rule.describe()

    def __hash__(self) -> int:
        return hash((self.mode, tuple(sorted(self.settings.items())), self.layers))


SOFTMAX = Temperature()


def tempered_softmax(scores: torch.Tensor, rule: Temperature, inplace: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Apply `rule` to attention logits `s` (already scaled and masked) along the last axis.

    Returns (probabilities used, entropy of plain softmax(s), β per row); the last two are None unless
    the rule needed them (`row_entropy` gives them when wanted). `inplace` lets it overwrite float32
    `scores` (saves one allocation per attention call).
    """
    return method_softmax(scores, rule.rule, inplace)


def method_softmax(scores: torch.Tensor, method: Rule | None, inplace: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """`tempered_softmax` with the rule's method itself (None: plain softmax). What travels with a remote
    request is the method, not its `Temperature` (a result class, whose loading code stays here)."""
    s = scores.to(torch.promote_types(scores.dtype, torch.float32))  # never softmax in half precision
    if method is None or isinstance(method, Softmax):
        return torch.softmax(s, dim=-1), None, None
    # β·s of a masked key overflows to -inf, which softmax handles (and fast); a fully masked row
    # (a padding query) would become all -inf, so it keeps β = 1 and stays uniform as in eager.
    top = s.amax(-1)
    live = top > torch.finfo(s.dtype).min / 2
    h = None
    if method.needs_entropy:
        h = softmax_entropy(s, torch.softmax(s, dim=-1), top, live)
        beta = torch.where(live, method.beta(h), 1.0)
    else:
        beta = torch.where(live, method.beta(top), 1.0)
    scale = beta.unsqueeze(-1)
    p = torch.softmax(s.mul_(scale) if inplace else s * scale, dim=-1)
    return p, h, (beta if method.needs_entropy else None)


def rule_beta(rule: Temperature, entropy: torch.Tensor) -> torch.Tensor:
    """β the rule applies to rows with the given softmax entropy."""
    return rule.rule.beta(entropy)

"""The lemma without a model: n logits, one of them δ above the rest, under each temperature rule."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from analysis.framework.results import Result
from analysis.framework.settings import check_settings, setting
from analysis.sharpness.rules import Temperature, entropy_nats, tempered_softmax


@dataclass
class LemmaParams(Result):
    ns: list[int] = setting(label="Item counts n (lemma)", item=int, low=2, high=1 << 20, min_items=1, url=None,
                            cli=None, default_factory=lambda: [2 ** k for k in range(1, 15)])
    thetas: list[float] = setting(label="Fixed temperatures θ (lemma)", item=float, low=1e-6, high=1e6, url=None,
                                  cli=None, default_factory=lambda: [0.25, 0.5, 1.0, 2.0])
    spread: float = setting(4.0, label="Logit spread δ", low=0.5, high=12.0, step=0.5, widget="slider", cli=None,
                            help="The maximum's logit minus every other logit.")
    rules: dict[str, dict] = field(default_factory=dict)  # rule name -> its settings (the adaptive rule's)


@dataclass
class LemmaCurve(Result):
    label: str
    p_max: list[float]
    entropy: list[float]


@dataclass
class LemmaResult(Result):
    params: LemmaParams
    curves: list[LemmaCurve]
    uniform: list[float]  # 1/n
    log_n: list[float]  # ln n, the entropy of the uniform distribution
    upper_bound: dict[float, list[float]]  # θ -> e^(δ/θ)/n, the lemma's ceiling on any weight


def lemma_demo(params: LemmaParams | None = None) -> LemmaResult:
    """n logits with one maximum δ above the rest: p_max and entropy vs n, per θ and adaptive."""
    params = params or LemmaParams()
    check_settings(params)
    rules = [Temperature.fixed(t) for t in params.thetas] + [Temperature.adaptive(**params.rules.get("adaptive", {}))]
    curves = []
    for rule in rules:
        p_max, ent = [], []
        for n in params.ns:
            s = torch.zeros(1, n, dtype=torch.float64)
            s[0, 0] = params.spread
            p = tempered_softmax(s, rule)[0]
            p_max.append(float(p[0, 0]))
            ent.append(float(entropy_nats(p)[0]))
        curves.append(LemmaCurve(rule.label, p_max, ent))
    return LemmaResult(
        params=params, curves=curves, uniform=[1.0 / n for n in params.ns],
        log_n=[math.log(n) for n in params.ns],
        upper_bound={t: [min(1.0, math.exp(params.spread / t) / n) for n in params.ns] for t in params.thetas},
    )

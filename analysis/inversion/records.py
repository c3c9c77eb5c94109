"""The typed results of the reconstruction panel (plain dataclasses: JSON round trip, shared and stored)."""
from __future__ import annotations

from dataclasses import dataclass

from analysis.inversion.params import AttackParams, CascadeParams
from analysis.framework.results import Result


@dataclass
class TokenRecovery(Result):
    position: int
    true_id: int
    true_token: str
    recovered_id: int
    recovered_token: str
    correct: bool
    distance: float  # L1 distance of the recovered token's state to its matched observed row
    rank: int  # 1-based rank of the true token among the candidates tried (0: not reached)
    evaluations: int  # candidates whose layer-L state was computed at this position
    gradient_steps: int  # forward+backward passes spent by gradient inversion at this position
    certified: bool  # distance within epsilon: consistent with the defence (exact match without one)
    matched_row: int  # row of the observed matrix it was matched to
    seconds: float


@dataclass
class AttackResult(Result):
    params: AttackParams
    model: str
    layers: int
    vocab_size: int
    hidden_size: int
    tokens: list[TokenRecovery]
    accuracy: float
    evaluations: int
    proposal_forwards: int  # full-model forwards (batch 1) that produced next-token distributions
    gradient_steps: int
    calibration_evaluations: int
    epsilon: float  # numerical + defence tolerance: a distance this small is consistent with the defence
    numerical_epsilon: float  # early-acceptance threshold (calibrated numerical noise)
    state_l1: float  # mean L1 norm of an observed state, to read distances against
    seconds: float

    @property
    def recovered_text(self) -> str:
        return " ".join(t.recovered_token for t in self.tokens)


@dataclass
class LayerPoint(Result):
    layer: int
    accuracy: float
    evaluations: int
    seconds: float


@dataclass
class LayerSweep(Result):
    params: AttackParams
    points: list[LayerPoint]


@dataclass
class NoisePoint(Result):
    defence: str
    noise: float
    accuracy: float
    evaluations: int


@dataclass
class NoiseSweep(Result):
    params: AttackParams
    points: list[NoisePoint]


@dataclass
class SpeedComparison(Result):
    """The proposal-ordered attack against exhaustive search on the same prompt and layer."""

    attack: AttackResult
    exhaustive: AttackResult  # run on the first `measured_positions` positions only
    measured_positions: int
    positions: int
    exhaustive_evaluations_total: int  # positions x vocabulary (exact count, not measured)
    exhaustive_seconds_total: float  # measured per position, extrapolated to every position
    identical_on_measured: bool
    evaluation_ratio: float
    time_ratio: float


@dataclass
class PartyView(Result):
    party: int
    positions: list[int]
    gaps: list[int]  # unseen tokens right before each seen position, since the party's last one
    largest_gap: int
    log10_cost: float  # log10 of sum over seen positions of V^(gap+1) candidate sequences


@dataclass
class CascadeResult(Result):
    params: CascadeParams
    model: str
    vocab_size: int
    tokens: list[str]
    token_ids: list[int]
    assignment: list[int]
    parties: list[PartyView]
    largest_gap: int
    brute_force_ran: bool
    recovered: list[int | None]  # per position: token id the attacker recovered (None: not reached)
    attacker_accuracy: float  # share of the attacker's seen positions recovered correctly
    evaluations: int
    seconds: float
    verdict: str

"""The caption panel's typed results (they travel as JSON: page, CLI, export, saved analyses, shipped results).

A metric is None where there is no ground truth: a claim the Shapes World grammar does not parse has no
truth, and a caption it does not read whole has no factuality, coverage or CHAIR (`CorrectionResult.
ground_truth` says why); never 1.0 for a caption whose claims nobody could check.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from analysis.captions.params import CorrectionParams
from analysis.captions.score import LOW_MASS
from analysis.framework.results import Result


@dataclass
class ClaimVerdict(Result):
    claim: str
    p_true: float
    p_false: float
    score: float  # H(u), from p_T and p_F as the params' probability form reads them
    flagged: bool
    truth: bool | None = None  # ground truth when the scene is known and the grammar parses the claim
    heatmap: list[list[float]] | None = None  # patch grid, signed attribution of the answer
    asked: bool = True  # False when the verifier's question format cannot express the claim

    @property
    def mass(self) -> float:
        """p_T + p_F: how much of the next-token distribution answers the yes/no question at all."""
        return self.p_true + self.p_false

    @property
    def low_mass(self) -> bool:
        return self.asked and self.mass < LOW_MASS


@dataclass
class CaptionMetrics(Result):
    claims: int
    true_claims: int
    factuality: float  # share of the caption's claims that are true
    facts: int
    facts_stated: int
    coverage: float  # share of the scene's facts the caption states
    objects_mentioned: int
    objects_hallucinated: int
    chair_i: float  # share of mentioned objects not in the scene (CHAIR_i)
    chair_s: float  # 1.0 if any mentioned object is not in the scene (CHAIR_s for one caption)


@dataclass
class PopeMetrics(Result):
    n: int
    accuracy: float
    precision: float
    recall: float
    f1: float
    yes_ratio: float


@dataclass
class SweepPoint(Result):
    pi: float
    kept: int
    factuality: float | None  # of the kept claims (None without ground truth)
    coverage: float | None


@dataclass
class DiffSpan(Result):
    op: str  # "same" | "removed" | "added"
    text: str


@dataclass
class GeneratedCaption(Result):
    text: str
    scene_seed: int | None = None


@dataclass
class Verification(Result):
    """Claims with their verifier probabilities and heatmaps: everything that does not depend on pi."""

    caption: str
    claims: list[ClaimVerdict]
    grid: int  # patches per side of the heatmaps (0 when not grounded)
    agents: dict[str, str]
    scene_seed: int | None = None
    decompose_note: str = ""  # lines of the decomposer's answer it refused ("" when none)

    def __repr__(self) -> str:
        """Short and stable: the runner keys a step given a verification by this (components/runs.py)."""
        digest = hashlib.sha256(self.to_json().encode()).hexdigest()[:32]
        return f"Verification(sha256={digest}, {len(self.claims)} claims)"


@dataclass
class CorrectionResult(Result):
    params: CorrectionParams
    caption: str
    corrected: str
    claims: list[ClaimVerdict]
    diff: list[DiffSpan]
    agents: dict[str, str]
    grid: int  # patches per side of the heatmaps (0 when not grounded)
    before: CaptionMetrics | None = None  # None: not measurable (see ground_truth)
    after: CaptionMetrics | None = None
    sweep: list[SweepPoint] = field(default_factory=list)
    rewrite_note: str = ""  # set when the rewriter's own output was rejected, or not asked for
    decompose_note: str = ""
    ground_truth: str = ""  # why factuality, coverage and CHAIR are not measured ("" when they are)

    @property
    def kept(self) -> list[str]:
        return [c.claim for c in self.claims if not c.flagged]

    @property
    def dropped(self) -> list[str]:
        return [c.claim for c in self.claims if c.flagged]

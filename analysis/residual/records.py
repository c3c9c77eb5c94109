"""The typed results of the residual-stream panel: what the page renders, the CLI prints, the store saves.

Layers are counted as residual-stream states: state 0 is the embeddings (the input of layer 0), state l
the output of layer l - 1, state L the last layer's output (what the final norm reads)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from analysis.residual.atp import FalseNegatives
from analysis.residual.pairs import Pair
from analysis.residual.params import ResidualParams
from analysis.framework.results import Result


@dataclass
class Dla(Result):
    """Direct logit attribution at one position (see dla.py): parts that add up to `total`."""

    target: int
    foil: int | None
    position: int
    embed: float
    attn: list[float]  # per layer
    mlp: list[float]
    heads: list[list[float]]  # [layer][head]; their sum is attn minus the projection's bias share
    constant: float  # final-norm and unembedding biases
    total: float  # embed + attn + mlp + constant
    model_value: float = math.nan  # the model's own logit (difference) before any soft-cap

    def layers(self) -> list[float]:
        return [a + m for a, m in zip(self.attn, self.mlp)]


@dataclass
class LensGrid(Result):
    """One lens over every (state, position)."""

    lens: str
    top_tokens: list[list[list[str]]]  # [state][position][k]
    top_probs: list[list[list[float]]]
    target_prob: list[list[float]]  # [state][position]
    target_rank: list[list[int]]  # 0: the lens's top token
    kl: list[list[float]]  # KL(final || lens) in nats
    last_gap: float  # max |lens logits - model logits| at the last state (the logit lens: 0)

    def last(self, values: list[list[float]]) -> list[float]:
        """A [state][position] table's last-position column."""
        return [row[-1] for row in values]


@dataclass
class Inspection(Result):
    model: str
    params: ResidualParams
    prompt: str
    tokens: list[str]
    target: str
    target_id: int
    foil: str | None
    foil_id: int | None
    prediction: str  # the model's top next token after the prompt
    layers: int
    heads: int
    lens: LensGrid
    dla: Dla


@dataclass
class PatchGrid(Result):
    component: str
    method: str
    rows: list[str]
    cols: list[str]
    share: list[list[float]]  # share of the clean - corrupted logit difference recovered

    def peak(self) -> tuple[int, int, float]:
        """(row, column, share) of the largest share."""
        best = max(((i, j, v) for i, row in enumerate(self.share) for j, v in enumerate(row)), key=lambda t: t[2])
        return best


@dataclass
class Patching(Result):
    model: str
    params: ResidualParams
    pair: Pair
    clean_tokens: list[str]
    corrupt_tokens: list[str]
    target_id: int
    foil_id: int
    clean_diff: float  # logit(target) - logit(foil), clean run
    corrupt_diff: float
    changed: list[int]  # positions where the two prompts differ
    grids: list[PatchGrid]
    correlation: dict[str, float] = field(default_factory=dict)  # component -> Pearson r, exact vs attribution
    seconds: dict[str, float] = field(default_factory=dict)  # method -> wall time
    false_negatives: list[FalseNegatives] = field(default_factory=list)  # per component and estimate, vs exact

    def grid(self, component: str, method: str) -> PatchGrid | None:
        return next((g for g in self.grids if g.component == component and g.method == method), None)


@dataclass
class SideBySide(Result):
    """Two inspections under the same settings (two prompts, or two models) and their differences, per state
    at the last position (the prompts may differ in length)."""

    a_label: str
    b_label: str
    a: Inspection
    b: Inspection
    target_prob_diff: list[float]  # a - b, per state
    kl_diff: list[float]
    dla_diff: list[float]  # per layer (attention + MLP)
    head_diff: list[list[float]]  # [layer][head]
    same_tokens: bool  # a and b read the same tokens (two models), so grids differ cell by cell


@dataclass
class PairRun(Result):
    name: str
    clean_diff: float
    corrupt_diff: float
    subject: int  # the last changed position
    exact: list[list[float]]  # residual share [layer][position]
    attribution: list[list[float]]
    correlation: float = math.nan  # Pearson r of exact vs attribution over this pair's cells


@dataclass
class PairSweep(Result):
    """Residual-stream patching over every offered pair, aligned at the subject's last token and the last token."""

    model: str
    layers: int
    runs: list[PairRun]
    subject: list[float]  # mean exact share per layer at the subject's last token
    last: list[float]  # at the last token
    other: list[float]  # at every other position (mean)
    subject_attribution: list[float]
    last_attribution: list[float]
    correlation: float  # Pearson r of exact vs attribution over every cell of every pair
    skipped: list[str] = field(default_factory=list)  # pairs whose prompts differ in length here
    median_correlation: float = math.nan  # the median over pairs of each pair's own r


@dataclass
class Strip(Result):
    """One lens over the generated tokens (see generation.py): at which states each is the lens's top-1.

    States as everywhere in the panel: state s is the residual stream after s layers (0: the embeddings),
    state L the last layer's output, read as the model's own output."""

    lens: str
    top1: list[list[bool]]  # [generated token][state]: the token is the lens's top-1 there
    first: list[int | None]  # the first state where it is top-1 (None: never)
    stays: list[int | None]  # the first state from which it is top-1 through state L (None: not the model's top-1)
    first_prob: list[float | None]  # the lens's P(token) at `first`
    full_rows: int  # states read over the whole vocabulary; every other one was ruled out by a candidate token
    rows: int  # states judged (generated tokens x L)

    def commitment(self, definition: str) -> list[int | None]:
        """Per generated token, its commitment state under `definition` ("first" or "stays")."""
        return self.first if definition == "first" else self.stays


@dataclass
class Branch(Result):
    """The continuation regenerated from one generated token replaced by another (see branching.py), beside
    the main continuation from the same point. Probabilities are the model's own (temperature 1)."""

    at: int  # the generated position where the branch parts from the main continuation
    token_id: int  # the token chosen there
    token: str
    main_ids: list[int]  # the main continuation from `at` on
    main_tokens: list[str]
    main_prob: list[float]  # the model's P of each, given everything before it
    main_text: str  # the main continuation from `at` on, as the tokenizer decodes it
    ids: list[int]  # the branch from `at` on: the chosen token, then what the model generated after it
    tokens: list[str]
    prob: list[float]
    text: str
    ended: bool  # the model ended the branch (its end-of-text token) before the limit
    first_difference: int | None  # the first position (counted from `at`) where the two differ; None: identical
    main_path_prob: float  # the product of `main_prob`: the probability of the main continuation from `at`
    path_prob: float  # the product of `prob`

    def over_common_length(self) -> tuple[int, float, float]:
        """(n, P(main), P(branch)) over the first n tokens of both, n the shorter's length: products of texts of
        different lengths do not compare (one that ends early has fewer factors below 1)."""
        n = min(len(self.main_prob), len(self.prob))
        return n, math.prod(self.main_prob[:n]), math.prod(self.prob[:n])


@dataclass
class Generation(Result):
    """A continuation of the clean prompt and, per generated token, where each lens commits to it."""

    model: str
    params: ResidualParams
    prompt: str
    prompt_tokens: list[str]
    text: str  # the continuation as the tokenizer decodes it
    tokens: list[str]  # the generated tokens, one by one
    token_ids: list[int]
    prob: list[float]  # the model's own P(token) at the step that produced it (temperature 1)
    top: list[str]  # the model's own top-1 at that step (differs from the token only when sampled)
    ended: bool  # the model ended the text (its end-of-text token) before the limit
    layers: int
    strips: list[Strip]
    seconds: dict[str, float] = field(default_factory=dict)  # "generate", "strip": wall time
    # per generated token, the model's top-k at its step (temperature 1): what a branch may choose there
    alternative_ids: list[list[int]] = field(default_factory=list)
    alternative_tokens: list[list[str]] = field(default_factory=list)
    alternative_probs: list[list[float]] = field(default_factory=list)
    branch: Branch | None = None  # a branch the user chose (branching.py)

    def strip(self, lens: str) -> Strip | None:
        return next((s for s in self.strips if s.lens == lens), None)


@dataclass
class AtpPair(Result):
    name: str
    clean_diff: float
    corrupt_diff: float
    false_negatives: list[FalseNegatives]  # per component and estimate (attribution, atp*)


@dataclass
class AtpSweep(Result):
    """False negatives of attribution patching and AtP* against exact patching over every offered pair."""

    model: str
    components: list[str]
    pairs: list[AtpPair]
    totals: list[FalseNegatives]  # per component and estimate, summed over pairs ("pair: cell" labels)
    skipped: list[str] = field(default_factory=list)

    def total(self, component: str, method: str) -> FalseNegatives | None:
        return next((t for t in self.totals if t.component == component and t.method == method), None)



@dataclass
class LensTraining(Result):
    """A tuned lens trained for one model by the recipe (lens_training.py), stored under its weights hash, and its
    report on held-out text: per state (0..L), the mean KL to the final distribution of the logit and of the tuned
    lens, and the share of tokens where the tuned lens is the closer one."""

    model: str
    weights_sha256: str
    lr: float  # the per-model step: of the offered rates, the one that ended lowest on the check set
    check: dict[str, float]  # rate -> summed mean KL on the check set after the check steps
    steps: int
    batch: int
    check_steps: int
    train_tokens: int
    held_tokens: int
    logit_kl: list[float]
    tuned_kl: list[float]
    closer: list[float]
    seconds: float = 0.0
    folder: str = ""

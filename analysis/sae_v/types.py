"""SAE-V records: where things live, and the results (`Result` dataclasses, JSON round-trippable)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from analysis.framework import paths
from analysis.framework.progress import Progress, silent as _noop  # noqa: F401  (the package's names for them)
from analysis.framework.results import Result
from analysis.sae_v.modality import IMAGE, LABELS, MODALITY_NAMES, TEXT  # noqa: F401  (the records' face)
from analysis.sae_v.params import StoreParams, TrainParams

SAE_ROOT = paths.SAE_STORES
CACHE_ROOT = Path(os.environ.get("MODEL_INSPECTOR_CACHE", Path.home() / ".cache" / "model-inspector")) / "sae"
STORE_FILE = "feature_store.json.gz"
META_FILE = "sae_v_meta.json"


@dataclass
class Pair(Result):
    """One image-caption pair: a generated pair's image is drawn again from `image_seed` by its dataset; a
    user's pair names its image (`image`: a path in their folder, or `row:N` of their table)."""

    text: str
    image_seed: int | None = None
    corrupted: bool = False
    kind: str = "clean"  # clean | other_scene | swapped | colour_word | unlabelled ...
    image: str = ""
    row: int = -1  # the line of the user's file it came from (0-based; a table's row; -1 for generated pairs)


@dataclass
class PairSet(Result):
    dataset: str  # registry name ("shapes", "scenes", "noise") or "user" for a user's data
    seed: int
    image_size: int | None
    pairs: list[Pair] = field(default_factory=list)
    source: str = ""  # where a user's pairs live (the data locator); "" for generated ones
    labelled: bool = True  # whether `corrupted` is known (False: no pair is known to be corrupted or clean)
    notes: list[str] = field(default_factory=list)  # about kept rows of a user's data (an image with several captions)


@dataclass
class Activations:
    """Residual vectors of every recorded position (not a Result: it is large and never exported)."""

    acts: torch.Tensor  # (N, d) float32
    modality: torch.Tensor  # (N,) TEXT / IMAGE
    pair: torch.Tensor  # (N,) index into the pair set
    index: torch.Tensor  # (N,) text-token index within the pair, or patch index for image tokens
    tokens: list[list[str]]  # per pair: its text tokens, in order
    layer: int
    grid: int  # image patches per side (0 for text-only models)

    def __len__(self) -> int:
        return int(self.acts.shape[0])


@dataclass
class SaeMeta(Result):
    model: str
    layer: int
    d_in: int
    train: TrainParams | None  # None for an SAE not trained here
    dataset: str
    n_pairs: int
    n_tokens: int
    fve: float  # fraction of variance explained on held-out tokens
    l0: float
    dead: int
    train_seconds: float = 0.0
    model_fingerprint: str = ""  # of the weights it was trained on; a mismatch means the SAE is stale
    scales: list[float] = field(default_factory=lambda: [1.0, 1.0])  # input scale for text, image tokens
    fve_text: float | None = None
    fve_image: float | None = None
    source: str = "trained here"  # or "sae-lens folder" / "sae-lens release": an SAE from elsewhere
    hook_name: str = ""  # the SAE's own hook name (an outside SAE's, read from its cfg.json)
    architecture: str = ""  # sae-lens architecture (an outside SAE's; ours: train.architecture)
    code_scale: float = 1.0  # an outside checkpoint's codes over its own training-time codes (codec.fold_saved_scaler)

    @property
    def kind(self) -> str:
        return self.architecture or (self.train.architecture if self.train is not None else "?")


@dataclass
class Example(Result):
    pair: int
    index: int  # text-token index or patch index
    modality: int
    act: float


@dataclass
class TextExample(Result):
    pair: int
    index: int
    act: float
    context: list[float]  # the feature's activation on every text token of the pair


@dataclass
class ImageExample(Result):
    pair: int
    patch: int
    act: float
    heatmap: list[float]  # the feature's activation on every patch of the image


@dataclass
class QuantileBin(Result):
    low: float
    high: float
    examples: list[Example]


@dataclass
class Scored(Result):
    key: str  # a feature index (as text) or a token string
    value: float


@dataclass
class Concept(Result):
    name: str  # e.g. "colour:red"
    precision: float
    support: int  # tokens it was measured on


@dataclass
class FeatureCard(Result):
    index: int
    label: str  # text-only | image-only | cross-modal | dead
    omega: float  # cross-modal weight; 0.0 when the store's score rule gives this feature none
    density: float
    density_text: float
    density_image: float
    max_act: float
    mean_act: float
    n_text_top: int
    n_image_top: int
    top_text: list[TextExample]
    top_images: list[ImageExample]
    quantiles: list[QuantileBin]
    hist_edges: list[float]
    hist_counts: list[int]
    neighbours: list[Scored]
    coactive: list[Scored]
    logit_tokens: list[Scored]
    concept_text: Concept | None = None
    concept_image: Concept | None = None
    concept_both: Concept | None = None  # same concept in both modalities; precision = the lower one
    has_omega: bool | None = None  # whether the score rule gives it an omega (None: a store from before rules)


@dataclass
class FeatureStore(Result):
    meta: SaeMeta
    params: StoreParams
    pairs: PairSet
    tokens: list[list[str]]
    grid: int
    features: list[FeatureCard]

    def summary(self) -> dict:
        n = len(self.features)
        labels = [f.label for f in self.features]
        both = [f for f in self.features
                if f.concept_both and f.concept_both.precision >= 0.9 and f.concept_both.support >= 5]
        return {
            "features": n,
            "cross_modal": labels.count("cross-modal"),
            "text_only": labels.count("text-only"),
            "image_only": labels.count("image-only"),
            "dead": labels.count("dead"),
            "concept_both_ge_0.9": len(both),
            "concept_both_ge_0.9_cross_modal": sum(f.label == "cross-modal" for f in both),
            "with_omega": sum(bool(f.has_omega) if f.has_omega is not None else f.omega != 0
                              for f in self.features),
            "score_rule": self.params.score_rule if self.params is not None else "official",
            "omega_mean_cross_modal": round(sum(f.omega for f in self.features if f.label == "cross-modal")
                                            / max(labels.count("cross-modal"), 1), 4),
            "fve": self.meta.fve,
            "l0": self.meta.l0,
        }


@dataclass
class PairScore(Result):
    pair: int
    text: str
    corrupted: bool
    kind: str
    score: float  # s_i: sum of omega over shared features
    weighted: float  # activation-weighted mean omega over shared features
    shared: int  # number of features active on both modalities of the pair
    rank: int = 0
    image: str = ""  # a user's pair: its image (path in their folder, or row:N)
    row: int = -1  # a user's pair: its row in their file (0-based)


@dataclass
class Skipped(Result):
    """A row of the user's data that was not used, and why (reported, never dropped silently)."""

    row: int  # 0-based line of their file (where a CSV record starts; a table's row)
    image: str
    reason: str


@dataclass
class Ranking(Result):
    model: str
    layer: int
    by: str  # "sum" | "weighted"
    threshold: float
    rows: list[PairScore]
    roc_auc: float | None  # P(score of a clean pair > score of a corrupted pair)
    roc_auc_weighted: float | None
    precision: float | None  # of "clean" among the top half
    recall: float | None  # share of clean pairs that land in the top half
    rule: str = "official"  # the score rule (rules.SCORE_RULES) behind omega and s_i
    labelled: bool = True  # False: no pair is known to be clean or corrupted, so no ROC / precision / recall
    source: str = ""  # the data locator ("" for the SAE's own evaluation pairs)
    rows_read: int = 0  # rows of the user's data read (used + skipped); 0 for generated pairs
    skipped: list[Skipped] = field(default_factory=list)
    resumed: int = 0  # pairs taken from an interrupted earlier run of the same ranking
    notes: list[str] = field(default_factory=list)  # about kept rows of the data (userdata.UserData.notes)
    with_omega: int | None = None  # features with an omega under this ranking's rule (None: not recorded)
    omega_from_store: bool = True  # the feature store's omega (rules.same_omega), or recomputed for this rule


@dataclass
class PositionFeatures(Result):
    modality: int
    index: int  # text-token index or patch index
    token: str
    features: list[Scored]  # active features at this position, strongest first


@dataclass
class InputExplanation(Result):
    model: str
    layer: int
    tokens: list[str]
    grid: int
    positions: list[PositionFeatures]
    totals: list[Scored]  # features by their largest activation anywhere in the input
    text_max: dict[int, float]
    image_max: dict[int, float]


@dataclass
class SteeredText(Result):
    text: str
    tokens: list[str]
    changed: list[bool]  # per token: not in the other output at this place (difflib alignment)


@dataclass
class SteeringResult(Result):
    model: str
    layer: int
    features: dict[int, float]  # feature -> strength
    mode: str  # add | clamp
    prompt: str
    unsteered: SteeredText
    steered: SteeredText
    positions: str = "all"  # all | image | text: where the features were added

    @property
    def changed(self) -> bool:
        return self.unsteered.text != self.steered.text


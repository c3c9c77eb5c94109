"""SAE-V records: constants, settings and results (all `Result` dataclasses, JSON round-trippable)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from analysis.registry import SettingsError, check_range
from analysis.results import Result

Progress = Callable[[float, str], None]

TEXT, IMAGE = 0, 1
MODALITY_NAMES = ("text", "image")
LABELS = ("text-only", "image-only", "cross-modal", "dead")
ARCHITECTURES = ("topk", "standard", "jumprelu")
SAE_ROOT = Path(__file__).resolve().parent.parent / "zoo" / "sae"
CACHE_ROOT = Path(os.environ.get("MODEL_INSPECTOR_CACHE", Path.home() / ".cache" / "model-inspector")) / "sae"
STORE_FILE = "feature_store.json.gz"
META_FILE = "sae_v_meta.json"


def _noop(fraction: float, message: str = "") -> None:
    return None


@dataclass
class TrainParams(Result):
    architecture: str = "topk"  # topk | standard | jumprelu
    d_sae: int = 512
    k: int = 8  # TopK: active latents per token
    l1_coefficient: float = 3.0  # Standard
    l0_coefficient: float = 0.3  # JumpReLU
    steps: int = 2000
    batch_size: int = 256
    lr: float = 2e-3
    seed: int = 0
    # Scale each modality to the same mean norm before the SAE. Image-token residuals can be tens of
    # times larger than text ones (they come from the projector); without this the reconstruction
    # loss is spent almost entirely on image tokens.
    balance_modalities: bool = True

    def validate(self) -> None:
        """Raise SettingsError (one line, for the user) when a setting is out of range."""
        if self.architecture not in ARCHITECTURES:
            raise SettingsError(f"Unknown SAE architecture '{self.architecture}' (use {', '.join(ARCHITECTURES)}).")
        check_range("SAE features (d_sae)", self.d_sae, low=1, high=1 << 20, integer=True)
        check_range("k (active features per token)", self.k, low=1, high=self.d_sae, integer=True)
        check_range("training steps", self.steps, low=1, high=10_000_000, integer=True)
        check_range("batch size", self.batch_size, low=1, integer=True)
        check_range("learning rate", self.lr, low=0.0)
        if self.lr <= 0:
            raise SettingsError(f"learning rate must be positive, got {self.lr}.")
        check_range("L1 coefficient", self.l1_coefficient, low=0.0)
        check_range("L0 coefficient", self.l0_coefficient, low=0.0)


@dataclass
class StoreParams(Result):
    top_n: int = 12  # top text tokens / top images shown per feature
    top_images: int = 6
    quantile_bins: int = 5
    per_quantile: int = 3
    hist_bins: int = 24
    neighbours: int = 8
    logit_tokens: int = 8
    modality_top: int = 30  # modality label: among the top-30 tokens ...
    modality_min: int = 5  # ... at least 5 of each modality makes a feature cross-modal
    omega_top: int = 5  # omega_k: top-5 text x top-5 image residual vectors
    score_rule: str = "official"  # which features get an omega_k and what s_i sums (scores.SCORE_RULES)
    concept_top: int = 20  # concept precision over the top-20 tokens of a modality
    threshold: float = 0.0  # "active" means activation > threshold


@dataclass
class Pair(Result):
    """One image-caption pair; the image is regenerated from `image_seed` by its dataset."""

    text: str
    image_seed: int | None = None
    corrupted: bool = False
    kind: str = "clean"  # clean | other-scene | swapped-attribute ...


@dataclass
class PairSet(Result):
    dataset: str  # registry name: "shapes" or "noise"
    seed: int
    image_size: int | None
    pairs: list[Pair] = field(default_factory=list)

    def image(self, i: int):
        from analysis.sae_v.datasets import dataset_for

        pair = self.pairs[i]
        if pair.image_seed is None or self.image_size is None:
            return None
        return dataset_for(self.dataset).render(pair.image_seed, self.image_size)


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
    train: TrainParams
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
    rule: str = "official"  # the score rule (scores.SCORE_RULES) behind omega and s_i


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
class BuildParams(Result):
    layer: int = 1
    dataset: str = ""  # "" = the model's default (Shapes World for the demo VLM)
    train_pairs: int = 600
    eval_pairs: int = 300
    corrupted: float = 0.5  # share of corrupted pairs in the evaluation set
    seed: int = 0
    train: TrainParams = field(default_factory=TrainParams)
    store: StoreParams = field(default_factory=StoreParams)

    def validate(self) -> None:
        """Raise SettingsError when a setting is out of range (the layer against the model: anatomy)."""
        check_range("layer", self.layer, low=0, integer=True)
        check_range("training pairs", self.train_pairs, low=2, high=1_000_000, integer=True)
        check_range("evaluation pairs", self.eval_pairs, low=2, high=1_000_000, integer=True)
        check_range("corrupted share", self.corrupted, low=0.0, high=1.0)
        check_range("seed", self.seed, low=0, integer=True)
        self.train.validate()


"""SAE-V settings: training, the feature store, and what each run of the panel is asked to do.

Every user-facing setting is a `setting(...)` field (analysis/framework/settings.py): its label, range and help are
written once for the page, the link and the command line. The SAE types (architectures.py) and the score
rules (rules.py) own their settings; the params here hold them as `{name: its settings}`, and read the
old flat layout (`k`, `l1_coefficient`, `omega_top` beside the others) of saved SAEs and stores.
"""
from __future__ import annotations

from dataclasses import InitVar, dataclass, field

from analysis.framework.errors import SettingsError
from analysis.framework.results import Result
from analysis.sae_v.architectures import ARCHITECTURES, SaeType, architecture_settings
from analysis.sae_v.rules import SCORE_RULES, ScoreRule, rule_settings
from analysis.sae_v.modality import LABELS
from analysis.sae_v.rules import OfficialRule
from analysis.framework.settings import check_settings, field_default, labelled, like, setting


def _without_defaults(registry, nested: dict[str, dict]) -> dict[str, dict]:
    """{method: settings} keeping only values that differ from the method's defaults (one JSON per meaning)."""
    out = {}
    for name, values in nested.items():
        defaults = {f.name: field_default(f) for f in labelled(registry.get(name))}
        kept = {k: v for k, v in values.items() if k not in defaults or defaults[k] != v}
        if kept:
            out[name] = kept
    return out


def _check_nested(registry, nested: dict[str, dict]) -> None:
    for name, values in nested.items():
        cls = registry.get(name)  # an unknown name: UnknownMethod
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise SettingsError(f"{registry.label(name)} has no setting(s) {', '.join(sorted(unknown))}.")


@dataclass
class TrainParams(Result):
    """How an SAE is trained. `TrainParams(k=4)` and saved analyses with a flat `k` still work: the old
    spelling goes to the TopK type's settings."""

    architecture: str = setting("topk", label="Architecture", choices=ARCHITECTURES.names, cli="arch",
                                help="The sae-lens SAE type (each has its own sparsity setting).")
    d_sae: int = setting(512, label="SAE features (d_sae)", low=1, high=1 << 20)
    steps: int = setting(2000, label="Training steps", low=1, high=10_000_000)
    batch_size: int = setting(256, label="Batch size", low=1, high=1 << 16)
    lr: float = setting(2e-3, label="Learning rate", low=1e-8, high=1.0)
    seed: int = 0
    # Scale each modality to the same mean norm before the SAE. Image-token residuals can be tens of
    # times larger than text ones (they come from the projector); without this the reconstruction
    # loss is spent almost entirely on image tokens.
    balance_modalities: bool = True
    architectures: dict[str, dict] = field(default_factory=dict)  # type name -> its settings
    k: InitVar[int | None] = None
    l1_coefficient: InitVar[float | None] = None
    l0_coefficient: InitVar[float | None] = None

    def __post_init__(self, k, l1_coefficient, l0_coefficient) -> None:
        flat = {n: v for n, v in (("k", k), ("l1_coefficient", l1_coefficient), ("l0_coefficient", l0_coefficient))
                if v is not None}
        nested = {name: dict(values) for name, values in (self.architectures or {}).items()}
        for name, values in architecture_settings(**flat).items():
            nested.setdefault(name, {}).update(values)
        self.architectures = _without_defaults(ARCHITECTURES, nested) if set(nested) <= set(ARCHITECTURES) else nested

    @classmethod
    def from_dict(cls, data: dict) -> "TrainParams":
        data = dict(data)
        flat = {n: data.pop(n) for n in ("k", "l1_coefficient", "l0_coefficient") if n in data}
        plain = {f: data[f] for f in ("architecture", "d_sae", "steps", "batch_size", "lr", "seed",
                                      "balance_modalities", "architectures") if f in data}
        return cls(**plain, **flat)

    def sae_type(self) -> SaeType:
        """The chosen architecture with its settings, validated."""
        return ARCHITECTURES.create(self.architecture, **self.architectures.get(self.architecture, {}))

    def setting_of(self, name: str):
        """One architecture setting of this training (e.g. 'k'), its default when not set."""
        for arch, cls in ARCHITECTURES.items():
            for f in labelled(cls):
                if f.name == name:
                    return self.architectures.get(arch, {}).get(name, field_default(f))
        raise KeyError(name)

    def validate(self) -> None:
        """Raise SettingsError (one line, for the user) when a setting is out of range."""
        check_settings(self)
        _check_nested(ARCHITECTURES, self.architectures)
        for name in self.architectures:
            ARCHITECTURES.create(name, **self.architectures[name])
        self.sae_type().check_width(self.d_sae)


# Read access by the old flat names (`params.train.k`): each reads the setting of the SAE type that owns it.
# Set after the class is made, so the constructor's keyword defaults above stay None.
for _name in ("k", "l1_coefficient", "l0_coefficient"):
    setattr(TrainParams, _name, property(lambda self, _n=_name: self.setting_of(_n)))


@dataclass
class StoreParams(Result):
    """What the feature store keeps per feature, and the score rule behind its omega."""

    top_n: int = 12  # top text tokens / top images shown per feature
    top_images: int = 6
    quantile_bins: int = 5
    per_quantile: int = 3
    hist_bins: int = 24
    neighbours: int = 8
    logit_tokens: int = 8
    modality_top: int = 30  # modality label: among the top-30 tokens ...
    modality_min: int = 5  # ... at least 5 of each modality makes a feature cross-modal
    score_rule: str = "official"  # which features get an omega_k and what s_i sums (rules.SCORE_RULES)
    rules: dict[str, dict] = field(default_factory=dict)  # rule name -> its settings (defaults when absent)
    concept_top: int = 20  # concept precision over the top-20 tokens of a modality
    threshold: float = 0.0  # "active" means activation > threshold

    @classmethod
    def from_dict(cls, data: dict) -> "StoreParams":
        """Also reads stores written before the rules owned their settings (a flat `omega_top`)."""
        data = dict(data)
        omega_top = data.pop("omega_top", None)
        known = {f: data[f] for f in cls.__dataclass_fields__ if f in data}
        params = cls(**known)
        if omega_top is not None:
            rule = params.rules.setdefault(params.score_rule, {})
            rule.setdefault("omega_top", omega_top)
            params.rules = _without_defaults(SCORE_RULES, params.rules) if params.score_rule in SCORE_RULES \
                else params.rules
        return params

    def rule(self, name: str | None = None) -> ScoreRule:
        """The score rule `name` (default: the store's own) with its settings in these params."""
        name = name or self.score_rule
        return SCORE_RULES.create(name, **self.rules.get(name, {}))


@dataclass
class BuildParams(Result):
    """Train an SAE at one layer and build its feature store."""

    layer: int = setting(1, label="Layer", low=0, high=10_000, help="Decoder layer whose output the SAE reads.")
    dataset: str = ""  # "" = the model's default (datasets.default_dataset)
    train_pairs: int = setting(600, label="Training pairs", low=2, high=1_000_000)
    eval_pairs: int = setting(300, label="Evaluation pairs", low=2, high=1_000_000)
    corrupted: float = setting(0.5, label="Corrupted share", low=0.0, high=1.0,
                               help="Share of corrupted pairs in the evaluation set.")
    seed: int = setting(0, label="Seed", low=0, high=2**31 - 1)
    train: TrainParams = field(default_factory=TrainParams)
    store: StoreParams = field(default_factory=StoreParams)

    def validate(self) -> None:
        """Raise SettingsError when a setting is out of range (the layer against the model: anatomy)."""
        check_settings(self)
        self.train.validate()


# ---------------------------------------------------------------------------------------------
# What one run of the panel is asked (the runner keys stored results on these)


@dataclass
class SaeChoice(Result):
    """Which SAE on which data (the locators of sources.py), with their fingerprints, so a stored result is
    never shown for other SAE weights or other data."""

    sae: str = ""  # a demo / cached folder name, a folder path, or sae-lens:RELEASE/ID
    sae_fingerprint: str = ""
    data: str = ""  # "" (the SAE's own pairs) | dataset:NAME | a folder | upload:SHA
    data_fingerprint: str = ""
    layer: int = -1  # an outside SAE whose hook names no layer: the layer it reads (-1: from its hook)
    store_pairs: int = setting(300, label="Pairs in the feature store", low=4, high=20_000,
                               help="The feature store (and each feature's ω) is built on the first this many "
                                    "usable pairs of the data.")
    batch_pairs: int = setting(16, label="Pairs per batch", low=1, high=512,
                              help="Pairs through the model at once while collecting activations.")


@dataclass
class RankParams(SaeChoice):
    """Rank every usable pair of the data by s_i under a score rule."""

    rule: str = setting("official", label="Score rule", choices=SCORE_RULES.names,
                        help="Official SAE-V by default; the others are labelled variants.")
    rules: dict[str, dict] = field(default_factory=dict)  # rule name -> its settings
    by: str = setting("sum", label="Score", choices=["sum", "weighted"],
                      help="sum: s_i; weighted: the activation-weighted mean ω over shared features.")

    def __post_init__(self) -> None:
        self.rules = _without_defaults(SCORE_RULES, self.rules) if set(self.rules) <= set(SCORE_RULES) \
            else self.rules

    def score_rule(self) -> ScoreRule:
        return SCORE_RULES.create(self.rule, **self.rules.get(self.rule, {}))

    def validate(self) -> None:
        check_settings(self)
        _check_nested(SCORE_RULES, self.rules)
        self.score_rule()


@dataclass
class Keep(Result):
    """The paper's filtering: keep the top share of the ranking (applied to a ranking, never re-ranks)."""

    keep: float = setting(0.5, label="Keep the top share of pairs by score", low=0.0, high=1.0, step=0.05,
                          widget="slider", help="Pairs with the highest score are kept, the rest dropped.")


@dataclass
class ExplainParams(SaeChoice):
    """The active features of one input (text, and for a VLM an image)."""

    text: str = setting("", label="Text", high=2000)
    image: str = ""  # "" | pair:I (of the data's pairs) | sha:HEX (an upload, see sources.save_upload)
    per_position: int = 16


@dataclass
class SteerParams(SaeChoice):
    """Generate with and without features added (or clamped) at the SAE's layer."""

    features: dict[int, float] = field(default_factory=dict)  # feature -> strength (SAE activation units)
    mode: str = setting("add", label="Steering", choices=["add", "clamp"],
                        help="add: strength x the feature's decoder direction at every position; clamp: set the "
                             "feature's activation to the strength at every position.")
    prompt: str = setting("", label="Prompt", high=2000, url="sprompt",
                          help="A language model continues it; a vision-language model answers it about the "
                               "image (empty: the model's captioning prompt).")
    image: str = ""  # as ExplainParams.image
    max_new_tokens: int = setting(48, label="New tokens", low=1, high=256, url="tokens")
    positions: str = setting("all", label="Steer at", choices=["all", "image", "text"], url="at",
                             help="Which positions get the feature: every one, the image tokens only, or the text "
                                  "tokens only (the prompt's and the generated ones).")

    def __post_init__(self) -> None:
        try:  # JSON keys are text: {"12": 8.0} is feature 12
            self.features = {int(k): float(v) for k, v in (self.features or {}).items()}
        except (TypeError, ValueError):
            pass  # validate() says what is wrong

    def validate(self) -> None:
        check_settings(self)
        if not self.features:
            raise SettingsError("Choose at least one feature to steer (feature=strength).")
        if not all(isinstance(k, int) and isinstance(v, float) for k, v in self.features.items()):
            raise SettingsError("Steering takes whole feature numbers and numeric strengths (feature=strength).")
        for k, s in self.features.items():
            if k < 0:
                raise SettingsError(f"Feature indices start at 0, got {k}.")
            if not -1e4 <= float(s) <= 1e4:
                raise SettingsError(f"Steering strength must be between -10000 and 10000, got {s}.")


def parse_steer(items: list[str]) -> dict[int, float]:
    """{feature: strength} from `K=STRENGTH` texts (the CLI's repeatable --steer)."""
    out: dict[int, float] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(key.strip())] = float(value)
        except ValueError:
            raise SettingsError(f"--steer takes FEATURE=STRENGTH (e.g. 12=8), got '{item}'.") from None
    return out


__all__ = ["TrainParams", "StoreParams", "BuildParams", "SaeChoice", "RankParams", "Keep", "ExplainParams",
           "SteerParams", "parse_steer", "architecture_settings", "rule_settings"]


VIEWS = {"list": "Feature list", "feature": "Feature page", "explain": "Explain an input", "ranking": "Data ranking"}
SORTS = ["omega", "density", "modality", "concept precision", "feature"]  # components/figures/sae.py's SORTS


@dataclass
class SaeState:
    """The SAE-V page's own controls: which SAE on which data, which view, and each view's controls (the
    settings of the runs they start are described once, by RankParams, Keep, SteerParams and the rules)."""

    sae: str = setting("", label="SAE", high=2000)
    slayer: int = setting(-1, label="Layer of an SAE from elsewhere", low=-1, high=10_000)
    data: str = setting("", label="Data", high=2000)
    view: str = setting("list", label="View", choices=list(VIEWS), labels=VIEWS, widget="segmented")
    sort: str = setting("omega", label="Sort by", choices=SORTS)
    labels: list[str] = setting(label="Modality", item=str, choices=list(LABELS), allow_empty=True,
                                default_factory=lambda: ["cross-modal", "text-only", "image-only"],
                                help="Show the features of these modality labels (dead: never active on these pairs).")
    feature: int = setting(0, label="Feature", low=0, high=1 << 20)
    spair: int = setting(0, label="Steer on the image of pair", low=0, high=1_000_000)
    img: int = setting(0, label="Scene (pair index)", low=0, high=1_000_000)
    steer: str = setting("", label="Features (feature=strength, comma-separated)", high=200, width=260)
    mode: str = like(SteerParams, "mode")
    at: str = like(SteerParams, "positions")
    tokens: int = like(SteerParams, "max_new_tokens")
    sprompt: str = like(SteerParams, "prompt", width="stretch")
    rule: str = like(RankParams, "rule", width="stretch")
    by: str = like(RankParams, "by", width=300)
    thr: float = like(OfficialRule, "cooccur_threshold")
    keep: float = like(Keep, "keep", width=400)

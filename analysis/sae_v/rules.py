"""SAE-V score rules: which features get a cross-modal weight omega_k, and what a pair's s_i sums.

Three rules, each a registered class (`SCORE_RULES`) owning its settings:

- `official` (default): the SAE-V scripts' definitions. A feature gets a cross-modal weight omega_k
  only when at least 5 of its 30 strongest activating tokens are text and at least 5 are image;
  omega_k is the mean cosine between the raw residuals of its 5 strongest text and 5 strongest image
  tokens (all 25 pairs). A pair's score s_i sums omega_k over the features that are active (> 1, as
  in the official co-occurrence script) on one of its text tokens and on one of its image tokens
  *and have an omega*. Sources: docs/readme_sae.md.
- `all-shared` (our earlier variant, kept to compare): omega_k for every feature that fires at
  least once in each modality (top 5 of each that fire), s_i over every shared feature (> 0).
- `normalised` (a labelled variant, not the paper's): the official omega_k, and s_i divided by the
  |omega| of every feature with an omega that is active on the pair's caption *or* its image (a
  weighted Jaccard of the two sides' feature sets). The official sum grows with how many concepts a
  pair has, so a one-object scene's true caption can score below another scene's four-object
  caption; the ratio asks what share of what either side says the other side confirms.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import ClassVar

import torch

from analysis.framework.errors import SettingsError
from analysis.framework.registry import Method, Registry
from analysis.sae_v.modality import IMAGE, TEXT
from analysis.framework.settings import setting

SCORE_RULES: Registry["ScoreRule"] = Registry("SAE-V score rule")


# ---------------------------------------------------------------------------------------------
# Per-feature and per-pair maths the rules share


def top_token_counts(codes: torch.Tensor, modality: torch.Tensor, top: int = 30,
                     threshold: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_text, n_image) per feature among its `top` strongest tokens that are above `threshold`."""
    k = min(top, codes.shape[0])
    values, rows = codes.topk(k, dim=0)  # (k, F)
    live = values > threshold
    return ((modality[rows] == TEXT) & live).sum(0), ((modality[rows] == IMAGE) & live).sum(0)


def mean_top_cosine(acts: torch.Tensor, codes: torch.Tensor, modality: torch.Tensor, top: int = 5,
                    threshold: float = 0.0) -> torch.Tensor:
    """Per feature: mean cosine between the raw residuals of its `top` strongest text tokens and its
    `top` strongest image tokens (only tokens where it is above `threshold`; fewer when fewer fire).
    0 for a feature that never fires in one of the modalities."""
    unit = torch.nn.functional.normalize(acts.float(), dim=1)
    out = torch.zeros(codes.shape[1])
    sides = []
    for mod in (TEXT, IMAGE):
        rows = (modality == mod).nonzero().squeeze(1)
        if rows.numel() == 0:
            return out
        values, which = codes[rows].topk(min(top, rows.numel()), dim=0)  # (k, F)
        sides.append((values > threshold, rows[which]))
    (live_t, rows_t), (live_i, rows_i) = sides
    for f in range(codes.shape[1]):
        t = rows_t[live_t[:, f], f]
        i = rows_i[live_i[:, f], f]
        if t.numel() and i.numel():
            out[f] = (unit[t] @ unit[i].T).mean()
    return out


def top_per_token(codes: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's `k` largest codes kept, the others set to 0 (k = 0 or k >= width: unchanged)."""
    if k <= 0 or k >= codes.shape[1]:
        return codes
    values, which = codes.topk(k, dim=1)
    return torch.zeros_like(codes).scatter_(1, which, values)


def _amax_into(out: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")
        return out.index_reduce_(0, index, values, "amax", include_self=True)


def per_pair_max(codes: torch.Tensor, modality: torch.Tensor, pair: torch.Tensor, n_pairs: int,
                 mod: int) -> torch.Tensor:
    """(n_pairs, F): each feature's largest activation over the pair's tokens of one modality."""
    out = torch.zeros(n_pairs, codes.shape[1])
    rows = modality == mod
    if rows.any():
        _amax_into(out, pair[rows], codes[rows].float())
    return out


def pair_scores(codes: torch.Tensor, modality: torch.Tensor, pair: torch.Tensor, omega: torch.Tensor,
                n_pairs: int, threshold: float = 1.0,
                has_omega: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SAE-V data score per pair: s_i = sum of omega_k over the features active (> threshold) on a text
    token and on an image token of pair i that have an omega (`has_omega`; all features when None).

    Also the mean of omega_k over those features weighted by min(text max, image max) activation, and
    how many such features the pair has."""
    text_max = per_pair_max(codes, modality, pair, n_pairs, TEXT)
    image_max = per_pair_max(codes, modality, pair, n_pairs, IMAGE)
    shared = (text_max > threshold) & (image_max > threshold)
    if has_omega is not None:
        shared &= has_omega.bool()[None, :]
    score = (shared.float() * omega).sum(1)
    weight = torch.minimum(text_max, image_max) * shared
    weighted = (weight * omega).sum(1) / weight.sum(1).clamp_min(1e-12)
    return score, weighted, shared.sum(1)


# ---------------------------------------------------------------------------------------------
# The rules


@dataclass
class ScoreRule(Method):
    """Which features get an omega_k, and which shared features a pair's s_i sums over."""

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    score_label: ClassVar[str] = "s_i = Σ ω over shared features"  # what s_i is, for axes and buttons
    top: int = setting(30, label="Top tokens per feature", low=1, high=10_000,
                       help="ω: the modality count runs over each feature's strongest tokens.")
    minimum: int = setting(5, label="Tokens of each modality", low=1, high=10_000,
                           help="Official rule: a feature needs this many text and image tokens among its top "
                                "tokens to get an ω.")
    omega_top: int = setting(5, label="Tokens per side for ω", low=1, high=1000,
                             help="ω is the mean cosine of this many top text x top image residuals.")
    cooccur_threshold: float = setting(1.0, label="Active above (co-occurrence threshold)", low=0.0, high=1000.0,
                                       step=0.05, url="thr", cli="threshold",
                                       help="A feature counts as active on a token above this activation.")
    # SAELens-V's cal_top_cosimilarity lists only each token's 50 strongest features (torch.topk(..., k=50));
    # omega and the modality counts are read from those lists (co-occurrence for s_i is not cut)
    token_top: int = setting(50, label="Features per token for ω (0: all)", low=0, high=1 << 20, url="ttop",
                             cli="token-top",
                             help="ω reads only each token's strongest this many features, as the SAE-V code does "
                                  "(50); 0 reads every active feature.")

    def visible(self, codes: torch.Tensor) -> torch.Tensor:
        """The codes omega is read from: each token's `token_top` strongest features, the rest 0."""
        return top_per_token(codes, self.token_top)

    def validate(self) -> None:
        if self.minimum > self.top:
            raise SettingsError(f"Tokens of each modality must be at most the top tokens per feature ({self.top}), "
                                f"got {self.minimum}.")

    def weights(self, acts: torch.Tensor, codes: torch.Tensor, modality: torch.Tensor, omega_top: int | None = None,
                threshold: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(omega per feature, 0 where it has none; bool mask of the features that have one)."""
        raise NotImplementedError

    def pair_scores(self, codes: torch.Tensor, modality: torch.Tensor, pair: torch.Tensor, omega: torch.Tensor,
                    n_pairs: int, threshold: float,
                    has_omega: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(s_i, activation-weighted mean omega, shared-feature count) per pair: the official sum."""
        return pair_scores(codes, modality, pair, omega, n_pairs, threshold, has_omega)


@SCORE_RULES.register
@dataclass
class OfficialRule(ScoreRule):
    name: ClassVar[str] = "official"
    label: ClassVar[str] = "SAE-V official (ω for ≥5 text + ≥5 image of top 30; s_i over those)"
    colour: ClassVar[str] = "#7b1fa2"
    summary: ClassVar[str] = ("omega only for features with at least 5 text and 5 image tokens among their 30 "
                              "strongest; s_i sums omega over co-occurring features (activation > 1) that have one.")

    def weights(self, acts, codes, modality, omega_top=None, threshold=0.0):
        codes = self.visible(codes)
        n_text, n_image = top_token_counts(codes, modality, self.top, threshold)
        defined = (n_text >= self.minimum) & (n_image >= self.minimum)
        # with >= omega_top of each modality among the top tokens, the strongest omega_top of each
        # modality are exactly the first omega_top text and image entries of that top list
        omega = mean_top_cosine(acts, codes, modality, omega_top or self.omega_top, threshold)
        return torch.where(defined, omega, torch.zeros_like(omega)), defined


@SCORE_RULES.register
@dataclass
class AllSharedRule(ScoreRule):
    name: ClassVar[str] = "all-shared"
    label: ClassVar[str] = "Variant: ω for every feature firing in both modalities; s_i over all shared (> 0)"
    colour: ClassVar[str] = "#9e9e9e"
    summary: ClassVar[str] = ("Our earlier reading, not the paper's: omega for every feature that fires at least "
                              "once on each modality; s_i sums omega over every feature active (> 0) on both.")
    cooccur_threshold: float = setting(0.0, label="Active above (co-occurrence threshold)", low=0.0, high=1000.0,
                                       step=0.05, url="thr", cli="threshold",
                                       help="A feature counts as active on a token above this activation.")

    def weights(self, acts, codes, modality, omega_top=None, threshold=0.0):
        codes = self.visible(codes)
        omega = mean_top_cosine(acts, codes, modality, omega_top or self.omega_top, threshold)
        fires = [((codes > threshold) & (modality == m)[:, None]).any(0) for m in (TEXT, IMAGE)]
        return omega, fires[0] & fires[1]


@SCORE_RULES.register
@dataclass
class NormalisedRule(OfficialRule):
    name: ClassVar[str] = "normalised"
    label: ClassVar[str] = "Variant: official ω; s_i ÷ Σ|ω| active on either side (weighted Jaccard)"
    colour: ClassVar[str] = "#00897b"
    score_label: ClassVar[str] = "s_i = Σ ω shared ÷ Σ|ω| on either side"
    summary: ClassVar[str] = ("Not the paper's: the official omega, and s_i divided by the |omega| of the features "
                              "with an omega active (> 1) on the caption or on the image, so a pair is scored by the "
                              "share of what either side shows that the other confirms, not by how much it shows.")

    def pair_scores(self, codes, modality, pair, omega, n_pairs, threshold, has_omega=None):
        score, weighted, shared = pair_scores(codes, modality, pair, omega, n_pairs, threshold, has_omega)
        either = (per_pair_max(codes, modality, pair, n_pairs, TEXT) > threshold) \
            | (per_pair_max(codes, modality, pair, n_pairs, IMAGE) > threshold)
        if has_omega is not None:
            either &= has_omega.bool()[None, :]
        mass = (either.float() * omega.abs()).sum(1)
        return torch.where(mass > 0, score / mass.clamp_min(1e-12), torch.zeros_like(score)), weighted, shared


OMEGA_SETTINGS = ("top", "minimum", "omega_top", "token_top")  # the settings a rule's omega_k reads


def same_omega(a: ScoreRule, b: ScoreRule) -> bool:
    """Whether two rules give every feature the same omega_k (and the same features one): the same `weights`
    and the same settings it reads. The one place this is decided: a ranking reuses a feature store's omega
    only then, and the page, the cost estimate and the command line ask here."""
    return type(a).weights is type(b).weights and all(getattr(a, n) == getattr(b, n) for n in OMEGA_SETTINGS)


def score_rule(rule: "ScoreRule | str | None" = None, **settings) -> ScoreRule:
    """A rule instance from an instance, a registered name, or None (the official rule), with `settings`."""
    if isinstance(rule, ScoreRule):
        return rule
    return SCORE_RULES.create(rule or OfficialRule.name, **settings)


def score_label(rule_name: str) -> str:
    """How a rule's s_i reads on an axis; the plain sum's wording for a rule no longer registered."""
    return SCORE_RULES.get(rule_name).score_label if rule_name in SCORE_RULES else ScoreRule.score_label


def rule_settings(**flat) -> dict[str, dict]:
    """{rule name: its settings} from settings named by field (`top=30, cooccur_threshold=0.5`): each goes to
    every rule that declares it; names no rule declares are refused."""
    return SCORE_RULES.split_settings(**flat)

"""SAE-V scores: modality labels, cross-modal weights omega_k, pair scores s_i, ROC AUC and ranking.

Three score rules, each a registered class (`SCORE_RULES`) holding its own settings:

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

from analysis.models import ModelHandle
from analysis.registry import Method, Registry, check_range
from analysis.sae_v.activations import collect_activations, scaled
from analysis.sae_v.training import encode
from analysis.sae_v.types import (
    IMAGE, TEXT, Activations, FeatureStore, PairScore, PairSet, Progress, Ranking, SaeMeta,
)

SCORE_RULES: Registry["ScoreRule"] = Registry("SAE-V score rule")


# ---------------------------------------------------------------------------------------------
# Modality labels (shared by both rules)


def modality_labels(codes: torch.Tensor, modality: torch.Tensor, top: int = 30, minimum: int = 5,
                    threshold: float = 0.0) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """SAE-V modality label per feature from its top-`top` activating tokens (those above `threshold`).

    Cross-modal when at least `minimum` of them are text and `minimum` are image; otherwise the
    modality of the majority; "dead" if it never fires. Returns (labels, n_text, n_image).
    """
    n_text, n_image = top_token_counts(codes, modality, top, threshold)
    labels = []
    for t, i in zip(n_text.tolist(), n_image.tolist()):
        if t + i == 0:
            labels.append("dead")
        elif t >= minimum and i >= minimum:
            labels.append("cross-modal")
        else:
            labels.append("text-only" if t >= i else "image-only")
    return labels, n_text, n_image


def top_token_counts(codes: torch.Tensor, modality: torch.Tensor, top: int = 30,
                     threshold: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_text, n_image) per feature among its `top` strongest tokens that are above `threshold`."""
    k = min(top, codes.shape[0])
    values, rows = codes.topk(k, dim=0)  # (k, F)
    live = values > threshold
    return ((modality[rows] == TEXT) & live).sum(0), ((modality[rows] == IMAGE) & live).sum(0)


# ---------------------------------------------------------------------------------------------
# Cross-modal weight omega_k


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


def cross_modal_weights(acts: torch.Tensor, codes: torch.Tensor, modality: torch.Tensor, top: int = 5,
                        threshold: float = 0.0, rule: "ScoreRule | str | None" = None) -> torch.Tensor:
    """omega_k per feature under a score rule (default: the official one); 0 where a feature has none."""
    omega, _ = score_rule(rule).weights(acts, codes, modality, omega_top=top, threshold=threshold)
    return omega


# ---------------------------------------------------------------------------------------------
# Score rules


@dataclass
class ScoreRule(Method):
    """Which features get an omega_k, and which shared features a pair's s_i sums over."""

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    score_label: ClassVar[str] = "s_i = Σ ω over shared features"  # what s_i is, for axes and buttons
    top: int = 30  # modality count over a feature's strongest `top` tokens ...
    minimum: int = 5  # ... needs at least `minimum` of each modality (official rule only)
    omega_top: int = 5  # omega_k: top-`omega_top` text x top-`omega_top` image residuals
    cooccur_threshold: float = 1.0  # "active on a token" for s_i: activation above this

    def validate(self) -> None:
        check_range("top tokens per feature", self.top, low=1, integer=True)
        check_range("tokens of each modality", self.minimum, low=1, high=self.top, integer=True)
        check_range("tokens per side for omega", self.omega_top, low=1, integer=True)
        check_range("co-occurrence threshold", self.cooccur_threshold, low=0.0)

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
    cooccur_threshold: float = 0.0

    def weights(self, acts, codes, modality, omega_top=None, threshold=0.0):
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


def score_rule(rule: "ScoreRule | str | None" = None) -> ScoreRule:
    """A rule instance from an instance, a registered name, or None (the official rule)."""
    if isinstance(rule, ScoreRule):
        return rule
    return SCORE_RULES.create(rule or OfficialRule.name)


def score_label(rule_name: str) -> str:
    """How a rule's s_i reads on an axis; the plain sum's wording for a rule no longer registered."""
    return SCORE_RULES.get(rule_name).score_label if rule_name in SCORE_RULES else ScoreRule.score_label


# ---------------------------------------------------------------------------------------------
# Pair scores s_i


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


def roc_auc(positive: list[float], negative: list[float]) -> float | None:
    """P(a positive scores above a negative), ties counting one half (Mann-Whitney U / n+ n-)."""
    if not positive or not negative:
        return None
    pos = torch.tensor(positive, dtype=torch.float64)
    neg = torch.tensor(negative, dtype=torch.float64)
    greater = (pos[:, None] > neg[None, :]).double().sum()
    ties = (pos[:, None] == neg[None, :]).double().sum()
    return float((greater + 0.5 * ties) / (len(positive) * len(negative)))


def by_kind(rows: list[PairScore]) -> dict[str, dict]:
    """Per kind of pair (clean, another scene's caption, swapped attributes, ...): how many, their mean
    rank, s_i, weighted ω and shared-feature count, and for each corrupted kind the ROC AUC of s_i
    against the clean pairs alone (which kind of corruption the score can see)."""
    clean = [r.score for r in rows if not r.corrupted]
    out: dict[str, dict] = {}
    for kind in sorted({r.kind for r in rows}, key=lambda k: (k != "clean", k)):
        mine = [r for r in rows if r.kind == kind]
        n = len(mine)
        entry = {"pairs": n, "mean_rank": round(sum(r.rank for r in mine) / n, 1),
                 "mean_score": round(sum(r.score for r in mine) / n, 4),
                 "mean_weighted": round(sum(r.weighted for r in mine) / n, 4),
                 "mean_shared": round(sum(r.shared for r in mine) / n, 2)}
        if all(r.corrupted for r in mine):
            entry["roc_auc_vs_clean"] = roc_auc(clean, [r.score for r in mine])
        out[kind] = entry
    return out


def keep_top(rows: list[PairScore], keep: float) -> dict:
    """Keep the top `keep` share of a ranking (rows best first): how well that removes corrupted pairs.

    precision = corrupted among the removed / removed; recall = corrupted removed / all corrupted;
    also the clean share of what is kept."""
    check_range("keep fraction", keep, low=0.0, high=1.0)
    n_keep = int(round(keep * len(rows)))
    kept, removed = rows[:n_keep], rows[n_keep:]
    bad_removed = sum(r.corrupted for r in removed)
    bad_total = sum(r.corrupted for r in rows)
    return {
        "keep": keep, "kept": len(kept), "removed": len(removed),
        "precision": bad_removed / len(removed) if removed else None,
        "recall": bad_removed / bad_total if bad_total else None,
        "clean_share_kept": sum(not r.corrupted for r in kept) / len(kept) if kept else None,
    }


# ---------------------------------------------------------------------------------------------
# Ranking


def rank_pairs(store_or_meta: SaeMeta, omega: torch.Tensor, codes: torch.Tensor, acts: Activations,
               pairs: PairSet, by: str = "sum", threshold: float | None = None, has_omega: torch.Tensor | None = None,
               rule: "ScoreRule | str | None" = None) -> Ranking:
    """Rank image-caption pairs by their SAE-V score (highest first) and measure how well that
    separates corrupted pairs from clean ones. `threshold` defaults to the rule's co-occurrence
    threshold; `has_omega` to the features with a non-zero omega."""
    if by not in ("sum", "weighted"):
        raise ValueError("Rank by 'sum' or 'weighted'.")
    rule = score_rule(rule)
    threshold = rule.cooccur_threshold if threshold is None else threshold
    check_range("activity threshold", threshold, low=0.0)
    if has_omega is None:
        has_omega = omega != 0
    n = len(pairs.pairs)
    score, weighted, shared = rule.pair_scores(codes, acts.modality, acts.pair, omega, n, threshold, has_omega)
    rows = [PairScore(pair=i, text=p.text, corrupted=p.corrupted, kind=p.kind, score=round(float(score[i]), 4),
                      weighted=round(float(weighted[i]), 4), shared=int(shared[i]))
            for i, p in enumerate(pairs.pairs)]
    key = (lambda r: r.score) if by == "sum" else (lambda r: r.weighted)
    rows.sort(key=lambda r: (-key(r), r.pair))
    for rank, r in enumerate(rows, 1):
        r.rank = rank
    clean = [r for r in rows if not r.corrupted]
    bad = [r for r in rows if r.corrupted]
    auc = roc_auc([r.score for r in clean], [r.score for r in bad])
    auc_w = roc_auc([r.weighted for r in clean], [r.weighted for r in bad])
    precision = recall = None
    if clean and bad:
        top = rows[: n // 2]
        kept_clean = sum(not r.corrupted for r in top)
        precision = kept_clean / max(len(top), 1)
        recall = kept_clean / len(clean)
    return Ranking(model=store_or_meta.model, layer=store_or_meta.layer, by=by, threshold=threshold, rows=rows,
                   roc_auc=auc, roc_auc_weighted=auc_w, precision=precision, recall=recall, rule=rule.name)


def store_weights(store: FeatureStore) -> tuple[torch.Tensor, torch.Tensor]:
    """(omega, has_omega) per feature from a feature store."""
    omega = torch.tensor([f.omega for f in store.features])
    has = [f.has_omega if f.has_omega is not None else f.omega != 0 for f in store.features]
    return omega, torch.tensor(has, dtype=torch.bool)


def rank_dataset(handle: ModelHandle, sae, meta: SaeMeta, store: FeatureStore, pairs: PairSet,
                 by: str = "sum", threshold: float | None = None, progress: Progress | None = None,
                 rule: "ScoreRule | str | None" = None) -> Ranking:
    """Collect activations for `pairs`, encode them, and rank them.

    With the store's own score rule (`rule` None or the same name), omega comes from the store. With
    another rule, omega is recomputed under that rule from the residuals and codes of `pairs` (the
    store's own pairs give exactly what a store built with that rule would hold)."""
    acts = collect_activations(handle, pairs, meta.layer, progress=progress)
    codes = encode(sae, scaled(acts, meta.scales))
    stored = store.params.score_rule if store.params is not None else OfficialRule.name
    rule = score_rule(rule or stored)
    if rule.name == stored:
        omega, has_omega = store_weights(store)
    else:
        params = store.params
        rule = SCORE_RULES.create(rule.name, top=params.modality_top, minimum=params.modality_min,
                                  omega_top=params.omega_top)
        omega, has_omega = rule.weights(acts.acts, codes, acts.modality, threshold=params.threshold)
    return rank_pairs(meta, omega, codes, acts, pairs, by=by, threshold=threshold, has_omega=has_omega, rule=rule)

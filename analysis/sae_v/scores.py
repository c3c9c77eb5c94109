"""SAE-V scores: modality labels, cross-modal weights omega_k, ROC AUC, keep fractions and ranking.

The score rules themselves (which features get an omega_k, what s_i sums) are in `rules.py`.
"""
from __future__ import annotations

import torch

from analysis.model_access.models import ModelHandle
from analysis.framework.errors import SettingsError
from analysis.framework.registry import check_range
from analysis.sae_v.activations import collect_activations, scaled
from analysis.sae_v.rules import (  # noqa: F401  (re-exported: the panel's face)
    SCORE_RULES, AllSharedRule, NormalisedRule, OfficialRule, ScoreRule, mean_top_cosine, pair_scores, per_pair_max,
    same_omega, score_label, score_rule, top_token_counts,
)
from analysis.sae_v.training import encode
from analysis.sae_v.types import (
    IMAGE, TEXT, Activations, FeatureStore, PairScore, PairSet, Progress, Ranking, SaeMeta,
)


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


# ---------------------------------------------------------------------------------------------
# Cross-modal weight omega_k


def cross_modal_weights(acts: torch.Tensor, codes: torch.Tensor, modality: torch.Tensor, top: int = 5,
                        threshold: float = 0.0, rule: "ScoreRule | str | None" = None) -> torch.Tensor:
    """omega_k per feature under a score rule (default: the official one); 0 where a feature has none."""
    omega, _ = score_rule(rule).weights(acts, codes, modality, omega_top=top, threshold=threshold)
    return omega


# ---------------------------------------------------------------------------------------------
# Separation, filtering and ranking


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


def score_rows(pairs: list, codes: torch.Tensor, acts: Activations, omega: torch.Tensor, rule: ScoreRule,
               threshold: float, has_omega: torch.Tensor | None = None, offset: int = 0) -> list[PairScore]:
    """One PairScore per pair of `pairs` (acts.pair indexes them), numbered from `offset`."""
    if has_omega is None:
        has_omega = omega != 0
    score, weighted, shared = rule.pair_scores(codes, acts.modality, acts.pair, omega, len(pairs), threshold,
                                               has_omega)
    return [PairScore(pair=offset + i, text=p.text, corrupted=p.corrupted, kind=p.kind,
                      score=float(score[i]), weighted=float(weighted[i]), shared=int(shared[i]),  # rounded once, where shown
                      image=p.image, row=p.row)
            for i, p in enumerate(pairs)]


def finish_ranking(meta: SaeMeta, rows: list[PairScore], by: str, threshold: float, rule: ScoreRule,
                   labelled: bool = True, **extra) -> Ranking:
    """Sort (highest score first), number the ranks, and measure the separation of corrupted pairs from
    clean ones; with unlabelled data (or no corrupted pair) there is nothing to separate: no ROC,
    precision or recall."""
    key = (lambda r: r.score) if by == "sum" else (lambda r: r.weighted)
    rows.sort(key=lambda r: (-key(r), r.pair))
    for rank, r in enumerate(rows, 1):
        r.rank = rank
    clean = [r for r in rows if not r.corrupted] if labelled else []
    bad = [r for r in rows if r.corrupted] if labelled else []
    auc = roc_auc([r.score for r in clean], [r.score for r in bad])
    auc_w = roc_auc([r.weighted for r in clean], [r.weighted for r in bad])
    precision = recall = None
    if clean and bad:
        top = rows[: len(rows) // 2]
        kept_clean = sum(not r.corrupted for r in top)
        precision = kept_clean / max(len(top), 1)
        recall = kept_clean / len(clean)
    return Ranking(model=meta.model, layer=meta.layer, by=by, threshold=threshold, rows=rows, roc_auc=auc,
                   roc_auc_weighted=auc_w, precision=precision, recall=recall, rule=rule.name, labelled=labelled,
                   **extra)


def check_by(by: str) -> None:
    if by not in ("sum", "weighted"):
        raise SettingsError("Rank by 'sum' or 'weighted'.")


def rank_pairs(store_or_meta: SaeMeta, omega: torch.Tensor, codes: torch.Tensor, acts: Activations,
               pairs: PairSet, by: str = "sum", threshold: float | None = None, has_omega: torch.Tensor | None = None,
               rule: "ScoreRule | str | None" = None) -> Ranking:
    """Rank image-caption pairs by their SAE-V score (highest first) and measure how well that
    separates corrupted pairs from clean ones. `threshold` defaults to the rule's co-occurrence
    threshold; `has_omega` to the features with a non-zero omega."""
    check_by(by)
    rule = score_rule(rule)
    threshold = rule.cooccur_threshold if threshold is None else threshold
    check_range("activity threshold", threshold, low=0.0)
    rows = score_rows(pairs.pairs, codes, acts, omega, rule, threshold, has_omega)
    return finish_ranking(store_or_meta, rows, by, threshold, rule, labelled=pairs.labelled, source=pairs.source)


def store_weights(store: FeatureStore) -> tuple[torch.Tensor, torch.Tensor]:
    """(omega, has_omega) per feature from a feature store."""
    omega = torch.tensor([f.omega for f in store.features])
    has = [f.has_omega if f.has_omega is not None else f.omega != 0 for f in store.features]
    return omega, torch.tensor(has, dtype=torch.bool)


def rank_dataset(handle: ModelHandle, sae, meta: SaeMeta, store: FeatureStore, pairs: PairSet,
                 by: str = "sum", threshold: float | None = None, progress: Progress | None = None,
                 rule: "ScoreRule | str | None" = None) -> Ranking:
    """Collect activations for `pairs`, encode them, and rank them.

    With a rule that computes the store's omega (`rule` None, or `rules.same_omega`), omega comes from the
    store. With another one, omega is recomputed under that rule from the residuals and codes of `pairs`
    (the store's own pairs give exactly what a store built with that rule would hold)."""
    acts = collect_activations(handle, pairs, meta.layer, progress=progress)
    codes = encode(sae, scaled(acts, meta.scales))
    stored = store.params.rule() if store.params is not None else OfficialRule()
    rule = stored if rule is None else score_rule(rule) if not isinstance(rule, str) else \
        (store.params.rule(rule) if store.params is not None else score_rule(rule))
    if same_omega(rule, stored):
        omega, has_omega = store_weights(store)
    else:
        omega, has_omega = rule.weights(acts.acts, codes, acts.modality, threshold=store.params.threshold)
    return rank_pairs(meta, omega, codes, acts, pairs, by=by, threshold=threshold, has_omega=has_omega, rule=rule)

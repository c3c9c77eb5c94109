"""SAE-V scores: modality labels, cross-modal weights omega_k, pair scores s_i, ROC AUC and ranking."""
from __future__ import annotations

import warnings

import torch

from analysis.models import ModelHandle
from analysis.sae_v.activations import collect_activations, scaled
from analysis.sae_v.training import encode
from analysis.sae_v.types import (
    IMAGE, TEXT, Activations, FeatureStore, PairScore, PairSet, Progress, Ranking, SaeMeta,
)


def modality_labels(codes: torch.Tensor, modality: torch.Tensor, top: int = 30, minimum: int = 5,
                    threshold: float = 0.0) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """SAE-V modality label per feature from its top-`top` activating tokens.

    Cross-modal when at least `minimum` of them are text and `minimum` are image; otherwise the
    modality of the majority; "dead" if it never fires. Returns (labels, n_text, n_image).
    """
    k = min(top, codes.shape[0])
    values, rows = codes.topk(k, dim=0)  # (k, F)
    live = values > threshold
    is_text = (modality[rows] == TEXT) & live
    is_image = (modality[rows] == IMAGE) & live
    n_text, n_image = is_text.sum(0), is_image.sum(0)
    labels = []
    for t, i in zip(n_text.tolist(), n_image.tolist()):
        if t + i == 0:
            labels.append("dead")
        elif t >= minimum and i >= minimum:
            labels.append("cross-modal")
        else:
            labels.append("text-only" if t >= i else "image-only")
    return labels, n_text, n_image


def cross_modal_weights(acts: torch.Tensor, codes: torch.Tensor, modality: torch.Tensor, top: int = 5,
                        threshold: float = 0.0) -> torch.Tensor:
    """omega_k (SAE-V): mean cosine between the raw residual vectors of the feature's top text and
    top image tokens (all top-x top pairs). 0 when the feature never fires in one of the modalities."""
    unit = torch.nn.functional.normalize(acts.float(), dim=1)
    omega = torch.zeros(codes.shape[1])
    sides = []
    for mod in (TEXT, IMAGE):
        rows = (modality == mod).nonzero().squeeze(1)
        if rows.numel() == 0:
            return omega
        k = min(top, rows.numel())
        values, which = codes[rows].topk(k, dim=0)  # (k, F)
        sides.append((values > threshold, rows[which]))
    (live_t, rows_t), (live_i, rows_i) = sides
    for f in range(codes.shape[1]):
        t = rows_t[live_t[:, f], f]
        i = rows_i[live_i[:, f], f]
        if t.numel() and i.numel():
            omega[f] = (unit[t] @ unit[i].T).mean()
    return omega


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
                n_pairs: int, threshold: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SAE-V data score per pair: s_i = sum of omega_k over features active (> threshold) on a text
    token and on an image token of pair i. Also the mean of omega_k over those features weighted by
    min(text max, image max) activation, and the number of shared features."""
    text_max = per_pair_max(codes, modality, pair, n_pairs, TEXT)
    image_max = per_pair_max(codes, modality, pair, n_pairs, IMAGE)
    shared = (text_max > threshold) & (image_max > threshold)
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



def rank_pairs(store_or_meta: SaeMeta, omega: torch.Tensor, codes: torch.Tensor, acts: Activations,
               pairs: PairSet, by: str = "sum", threshold: float = 0.0) -> Ranking:
    """Rank image-caption pairs by their SAE-V score (highest first) and measure how well that
    separates corrupted pairs from clean ones."""
    if by not in ("sum", "weighted"):
        raise ValueError("Rank by 'sum' or 'weighted'.")
    n = len(pairs.pairs)
    score, weighted, shared = pair_scores(codes, acts.modality, acts.pair, omega, n, threshold)
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
                   roc_auc=auc, roc_auc_weighted=auc_w, precision=precision, recall=recall)


def rank_dataset(handle: ModelHandle, sae, meta: SaeMeta, store: FeatureStore, pairs: PairSet,
                 by: str = "sum", threshold: float = 0.0, progress: Progress | None = None) -> Ranking:
    """Collect activations for `pairs`, encode them, and rank with the store's omega."""
    acts = collect_activations(handle, pairs, meta.layer, progress=progress)
    omega = torch.tensor([f.omega for f in store.features])
    return rank_pairs(meta, omega, encode(sae, scaled(acts, meta.scales)), acts, pairs, by=by, threshold=threshold)



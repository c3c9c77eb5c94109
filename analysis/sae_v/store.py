"""SAE-V feature store: everything the browser shows per feature, computed once per (model, layer,
SAE, dataset), and its gzip JSON file."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch

from analysis.model_access import anatomy
from analysis.model_access.models import ModelHandle
from analysis.sae_v.datasets import DATASETS, dataset_for
from analysis.sae_v.activations import scaled
from analysis.sae_v.params import StoreParams
from analysis.sae_v.rules import _amax_into
from analysis.sae_v.scores import modality_labels
from analysis.sae_v.training import encode
from analysis.sae_v.types import (
    IMAGE, STORE_FILE, TEXT, Activations, Concept, Example, FeatureCard, FeatureStore, ImageExample, PairSet,
    Progress, QuantileBin, SaeMeta, Scored, TextExample, _noop,
)


def concept_precision(rows: list[int], concepts: list[set]) -> Concept | None:
    """The concept shared by most of the given tokens, with the share (precision)."""
    if not rows:
        return None
    counts: dict[str, int] = {}
    for r in rows:
        for c in concepts[r]:
            counts[c] = counts.get(c, 0) + 1
    if not counts:
        return None
    name = max(sorted(counts), key=counts.get)
    return Concept(name=name, precision=counts[name] / len(rows), support=len(rows))


def concept_in_both(text_rows: list[int], image_rows: list[int], concepts: list[set]) -> Concept | None:
    if not text_rows or not image_rows:
        return None
    best = None
    names = set().union(*(concepts[r] for r in text_rows)) & set().union(*(concepts[r] for r in image_rows))
    for name in sorted(names):
        pt = sum(name in concepts[r] for r in text_rows) / len(text_rows)
        pi = sum(name in concepts[r] for r in image_rows) / len(image_rows)
        p = min(pt, pi)
        if best is None or p > best.precision:
            best = Concept(name=name, precision=p, support=min(len(text_rows), len(image_rows)))
    return best


def _logit_lens(handle: ModelHandle, sae, top: int) -> list[list[Scored]]:
    """Tokens each decoder direction promotes most, read through the final norm's scale and lm_head."""
    w_dec = sae.W_dec.detach().float()  # (F, d)
    with handle.session():
        scale = anatomy.final_norm_scale(handle.model)
        direction = w_dec * scale.cpu() if scale is not None else w_dec
        logits = direction @ anatomy.unembedding(handle.model).weight.detach().float().cpu().T  # (F, V)
    values, ids = logits.topk(min(top, logits.shape[1]), dim=1)
    tok = handle.tokenizer
    return [[Scored(tok.convert_ids_to_tokens(int(i)), round(float(v), 4)) for v, i in zip(vs, is_)]
            for vs, is_ in zip(values, ids)]


def _round(xs, nd: int = 3) -> list[float]:
    return [round(float(x), nd) for x in xs]


class _Tokens:
    """Where each recorded position is: modality masks and the text / image rows of every pair."""

    def __init__(self, acts: Activations, n_pairs: int) -> None:
        self.modality, self.pair, self.index = acts.modality, acts.pair, acts.index
        self.is_text, self.is_image = acts.modality == TEXT, acts.modality == IMAGE
        self.n_text, self.n_image = int(self.is_text.sum()), int(self.is_image.sum())
        self.n_pairs = n_pairs
        self.text_rows = [((self.pair == p) & self.is_text).nonzero().squeeze(1) for p in range(n_pairs)]
        self.image_rows = [((self.pair == p) & self.is_image).nonzero().squeeze(1) for p in range(n_pairs)]


def _neighbour_tables(sae, codes: torch.Tensor, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(decoder cosine, activation correlation) between features; -2 on the diagonal and for dead features."""
    w_dec = torch.nn.functional.normalize(sae.W_dec.detach().float(), dim=1)
    dec_cos = w_dec @ w_dec.T
    dec_cos.fill_diagonal_(-2)
    centred = codes - codes.mean(0)
    std = centred.pow(2).mean(0).sqrt().clamp_min(1e-8)
    corr = (centred.T @ centred) / codes.shape[0] / (std[:, None] * std[None, :])
    corr.fill_diagonal_(-2)
    dead = ~active.any(0)
    corr[dead] = -2
    corr[:, dead] = -2
    return dec_cos, corr


def _token_concepts(acts: Activations, pairs: PairSet) -> list[set]:
    """Ground-truth concept set of every recorded position (empty when the dataset knows none)."""
    out: list[set] = [set() for _ in range(len(acts))]
    if pairs.dataset not in DATASETS:
        return out
    dataset = dataset_for(pairs.dataset)
    per_pair = [dataset.concepts(p, acts.tokens[i], acts.grid) for i, p in enumerate(pairs.pairs)]
    for r in range(len(acts)):
        text_sets, image_sets = per_pair[int(acts.pair[r])]
        sets = text_sets if acts.modality[r] == TEXT else image_sets
        idx = int(acts.index[r])
        out[r] = sets[idx] if idx < len(sets) else set()
    return out


def _top_rows(col: torch.Tensor, mask: torch.Tensor, n: int, threshold: float) -> list[int]:
    """The rows of `mask` where `col` is largest (at most n), keeping those above threshold."""
    masked = torch.where(mask, col, torch.full_like(col, -1.0))
    values, rows = masked.topk(min(n, col.numel()))
    return rows[values > threshold].tolist()


def _top_text(col: torch.Tensor, where: _Tokens, params: StoreParams) -> list[TextExample]:
    out = []
    for r in _top_rows(col, where.is_text, params.top_n, params.threshold):
        p = int(where.pair[r])
        out.append(TextExample(pair=p, index=int(where.index[r]), act=round(float(col[r]), 4),
                               context=_round(col[where.text_rows[p]])))
    return out


def _top_images(col: torch.Tensor, where: _Tokens, params: StoreParams) -> list[ImageExample]:
    """The images where the feature fires most, ranked by each image's best patch."""
    best = torch.full((where.n_pairs,), -1.0)
    _amax_into(best, where.pair, torch.where(where.is_image, col, torch.full_like(col, -1.0)))
    values, order = best.topk(min(params.top_images, where.n_pairs))
    out = []
    for v, p in zip(values.tolist(), order.tolist()):
        if v <= params.threshold:
            break
        rows = where.image_rows[p]
        heat = col[rows]
        out.append(ImageExample(pair=p, patch=int(where.index[rows[int(heat.argmax())]]), act=round(v, 4),
                                heatmap=_round(heat)))
    return out


def _quantiles(col: torch.Tensor, on: torch.Tensor, where: _Tokens, params: StoreParams,
               seed: int) -> list[QuantileBin]:
    """A few random active tokens from each activation quantile bin (seeded by the feature index)."""
    values = col[on]
    if not values.numel():
        return []
    qs = torch.quantile(values, torch.linspace(0, 1, params.quantile_bins + 1))
    on_rows = on.nonzero().squeeze(1)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for b in range(params.quantile_bins):
        lo, hi = float(qs[b]), float(qs[b + 1])
        upper = (values <= hi) if b == params.quantile_bins - 1 else (values < hi)
        inside = on_rows[(values >= lo) & upper]
        pick = inside[torch.randperm(inside.numel(), generator=gen)[:params.per_quantile]]
        out.append(QuantileBin(round(lo, 4), round(hi, 4), [
            Example(int(where.pair[r]), int(where.index[r]), int(where.modality[r]), round(float(col[r]), 4))
            for r in pick.tolist()]))
    return out


def _histogram(values: torch.Tensor, bins: int) -> tuple[list[float], list[int]]:
    if not values.numel():
        return [], []
    hist = torch.histogram(values.float(), bins=bins)
    return _round(hist.bin_edges, 4), [int(c) for c in hist.hist]


def _ranked(row: torch.Tensor, n: int) -> list[Scored]:
    values, idx = row.topk(min(n, row.numel() - 1))
    return [Scored(str(int(i)), round(float(v), 4)) for v, i in zip(values, idx) if v > -2]


def build_feature_store(handle: ModelHandle, sae, meta: SaeMeta, acts: Activations, pairs: PairSet,
                        params: StoreParams | None = None, progress: Progress | None = None) -> FeatureStore:
    """Everything the browser shows per feature, computed once from the SAE codes of `acts`.

    Steps: encode; modality label and omega_k per feature (under the store's score rule); decoder
    neighbours, co-activation and logit-lens tables; ground-truth concepts per position; then one
    card per feature."""
    params = params or StoreParams()
    progress = progress or _noop
    progress(0.0, "encoding")
    codes = encode(sae, scaled(acts, meta.scales))
    active = codes > params.threshold
    where = _Tokens(acts, len(pairs.pairs))

    rule = params.rule()
    labels, n_text_top, n_image_top = modality_labels(rule.visible(codes), acts.modality, params.modality_top,
                                                      params.modality_min, params.threshold)
    omega, has_omega = rule.weights(acts.acts, codes, acts.modality, threshold=params.threshold)
    progress(0.2, "neighbours")
    dec_cos, corr = _neighbour_tables(sae, codes, active)
    logit_tokens = _logit_lens(handle, sae, params.logit_tokens)
    concepts = _token_concepts(acts, pairs)

    cards = []
    n_feat = codes.shape[1]
    for f in range(n_feat):
        if f % 32 == 0:
            progress(0.3 + 0.7 * f / n_feat, f"feature {f}/{n_feat}")
        col, on = codes[:, f], active[:, f]
        values = col[on]
        text_rows = _top_rows(col, where.is_text, params.concept_top, params.threshold) if where.n_text else []
        image_rows = _top_rows(col, where.is_image, params.concept_top, params.threshold) if where.n_image else []
        edges, counts = _histogram(values, params.hist_bins)
        cards.append(FeatureCard(
            index=f, label=labels[f], omega=round(float(omega[f]), 4), has_omega=bool(has_omega[f]),
            density=float(on.float().mean()),
            density_text=float(on[where.is_text].float().mean()) if where.n_text else 0.0,
            density_image=float(on[where.is_image].float().mean()) if where.n_image else 0.0,
            max_act=round(float(values.max()), 4) if values.numel() else 0.0,
            mean_act=round(float(values.mean()), 4) if values.numel() else 0.0,
            n_text_top=int(n_text_top[f]), n_image_top=int(n_image_top[f]),
            top_text=_top_text(col, where, params) if where.n_text else [],
            top_images=_top_images(col, where, params) if where.n_image else [],
            quantiles=_quantiles(col, on, where, params, seed=f),
            hist_edges=edges, hist_counts=counts,
            neighbours=_ranked(dec_cos[f], params.neighbours),
            coactive=_ranked(corr[f], params.neighbours),
            logit_tokens=logit_tokens[f],
            concept_text=concept_precision(text_rows, concepts),
            concept_image=concept_precision(image_rows, concepts),
            concept_both=concept_in_both(text_rows, image_rows, concepts),
        ))
    progress(1.0, "feature store built")
    return FeatureStore(meta=meta, params=params, pairs=pairs, tokens=acts.tokens, grid=acts.grid, features=cards)


def save_store(store: FeatureStore, folder: str | Path) -> Path:
    path = Path(folder) / STORE_FILE
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(store.to_dict(), fh, separators=(",", ":"))
    return path


def read_store_json(folder: str | Path) -> dict:
    """The feature store as plain JSON (no typed cards): for readers that need a field or two."""
    with gzip.open(Path(folder) / STORE_FILE, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def load_store(folder: str | Path) -> FeatureStore:
    store = FeatureStore.from_dict(read_store_json(folder))
    if any(f.has_omega is None for f in store.features):
        # written before score rules existed: its omegas follow our earlier reading
        store.params.score_rule = "all-shared"
        for f in store.features:
            f.has_omega = f.omega != 0
    return store



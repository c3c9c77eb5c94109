"""SAE-V feature store: everything the browser shows per feature, computed once per (model, layer,
SAE, dataset), and its gzip JSON file."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch

from analysis import anatomy
from analysis.models import ModelHandle
from analysis.sae_v.datasets import DATASETS
from analysis.sae_v.scores import _amax_into, cross_modal_weights, modality_labels
from analysis.sae_v.training import encode
from analysis.sae_v.activations import scaled
from analysis.sae_v.types import (
    IMAGE, STORE_FILE, TEXT, Activations, Concept, Example, FeatureCard, FeatureStore, ImageExample, PairSet,
    Progress, QuantileBin, SaeMeta, Scored, StoreParams, TextExample, _noop,
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


def build_feature_store(handle: ModelHandle, sae, meta: SaeMeta, acts: Activations, pairs: PairSet,
                        params: StoreParams | None = None, progress: Progress | None = None) -> FeatureStore:
    """Everything the browser shows per feature, computed once from the SAE codes of `acts`."""
    params = params or StoreParams()
    progress = progress or _noop
    progress(0.0, "encoding")
    codes = encode(sae, scaled(acts, meta.scales))
    n_tok, n_feat = codes.shape
    thr = params.threshold
    active = codes > thr
    mod, pair_of, index_of = acts.modality, acts.pair, acts.index
    is_text, is_image = mod == TEXT, mod == IMAGE
    n_text, n_image = int(is_text.sum()), int(is_image.sum())

    labels, top_text_n, top_image_n = modality_labels(codes, mod, params.modality_top, params.modality_min, thr)
    omega = cross_modal_weights(acts.acts, codes, mod, params.omega_top, thr)
    progress(0.2, "neighbours")
    w_dec = torch.nn.functional.normalize(sae.W_dec.detach().float(), dim=1)
    dec_cos = w_dec @ w_dec.T
    dec_cos.fill_diagonal_(-2)
    centred = codes - codes.mean(0)
    std = centred.pow(2).mean(0).sqrt().clamp_min(1e-8)
    corr = (centred.T @ centred) / n_tok / (std[:, None] * std[None, :])
    corr.fill_diagonal_(-2)
    corr[~active.any(0)] = -2
    corr[:, ~active.any(0)] = -2
    logit_tokens = _logit_lens(handle, sae, params.logit_tokens)

    # ground-truth concepts per recorded position (Shapes World)
    dataset = DATASETS.get(pairs.dataset)
    token_concepts: list[set] = [set() for _ in range(n_tok)]
    if dataset is not None:
        per_pair = [dataset.concepts(p, acts.tokens[i], acts.grid) for i, p in enumerate(pairs.pairs)]
        for r in range(n_tok):
            t_sets, i_sets = per_pair[int(pair_of[r])]
            sets = t_sets if mod[r] == TEXT else i_sets
            idx = int(index_of[r])
            token_concepts[r] = sets[idx] if idx < len(sets) else set()

    # rows of each pair, for contexts and heatmaps
    text_rows_of: dict[int, torch.Tensor] = {}
    image_rows_of: dict[int, torch.Tensor] = {}
    for p in range(len(pairs.pairs)):
        rows = (pair_of == p)
        text_rows_of[p] = (rows & is_text).nonzero().squeeze(1)
        image_rows_of[p] = (rows & is_image).nonzero().squeeze(1)

    cards = []
    for f in range(n_feat):
        if f % 32 == 0:
            progress(0.3 + 0.7 * f / n_feat, f"feature {f}/{n_feat}")
        col = codes[:, f]
        on = active[:, f]
        values = col[on]
        top_text: list[TextExample] = []
        top_images: list[ImageExample] = []
        quantiles: list[QuantileBin] = []
        t_rows = i_rows = []
        if n_text:
            t_col = torch.where(is_text, col, torch.full_like(col, -1.0))
            tv, tr = t_col.topk(min(params.top_n, n_tok))
            tr = tr[tv > thr]
            for r in tr.tolist():
                p = int(pair_of[r])
                top_text.append(TextExample(pair=p, index=int(index_of[r]), act=round(float(col[r]), 4),
                                            context=_round(col[text_rows_of[p]])))
            tv, tr = t_col.topk(min(params.concept_top, n_tok))
            t_rows = tr[tv > thr].tolist()
        if n_image:
            # top images: by each image's best patch
            i_col = torch.where(is_image, col, torch.full_like(col, -1.0))
            best = torch.full((len(pairs.pairs),), -1.0)
            _amax_into(best, pair_of, i_col)
            bv, bp = best.topk(min(params.top_images, len(best)))
            for v, p in zip(bv.tolist(), bp.tolist()):
                if v <= thr:
                    break
                rows = image_rows_of[p]
                heat = col[rows]
                top_images.append(ImageExample(pair=p, patch=int(index_of[rows[int(heat.argmax())]]),
                                               act=round(v, 4), heatmap=_round(heat)))
            iv, ir = i_col.topk(min(params.concept_top, n_tok))
            i_rows = ir[iv > thr].tolist()
        if values.numel():
            qs = torch.quantile(values, torch.linspace(0, 1, params.quantile_bins + 1))
            on_rows = on.nonzero().squeeze(1)
            gen = torch.Generator().manual_seed(f)
            for b in range(params.quantile_bins):
                lo, hi = float(qs[b]), float(qs[b + 1])
                inside = on_rows[(values >= lo) & ((values <= hi) if b == params.quantile_bins - 1 else (values < hi))]
                pick = inside[torch.randperm(inside.numel(), generator=gen)[:params.per_quantile]]
                quantiles.append(QuantileBin(round(lo, 4), round(hi, 4), [
                    Example(int(pair_of[r]), int(index_of[r]), int(mod[r]), round(float(col[r]), 4))
                    for r in pick.tolist()]))
            hist = torch.histogram(values.float(), bins=params.hist_bins)
            edges, counts = _round(hist.bin_edges, 4), [int(c) for c in hist.hist]
        else:
            edges, counts = [], []
        nb_v, nb_i = dec_cos[f].topk(min(params.neighbours, n_feat - 1))
        co_v, co_i = corr[f].topk(min(params.neighbours, n_feat - 1))
        cards.append(FeatureCard(
            index=f, label=labels[f], omega=round(float(omega[f]), 4),
            density=float(on.float().mean()),
            density_text=float(on[is_text].float().mean()) if n_text else 0.0,
            density_image=float(on[is_image].float().mean()) if n_image else 0.0,
            max_act=round(float(values.max()), 4) if values.numel() else 0.0,
            mean_act=round(float(values.mean()), 4) if values.numel() else 0.0,
            n_text_top=int(top_text_n[f]), n_image_top=int(top_image_n[f]),
            top_text=top_text, top_images=top_images, quantiles=quantiles,
            hist_edges=edges, hist_counts=counts,
            neighbours=[Scored(str(int(i)), round(float(v), 4)) for v, i in zip(nb_v, nb_i) if v > -2],
            coactive=[Scored(str(int(i)), round(float(v), 4)) for v, i in zip(co_v, co_i) if v > -2],
            logit_tokens=logit_tokens[f],
            concept_text=concept_precision(t_rows, token_concepts),
            concept_image=concept_precision(i_rows, token_concepts),
            concept_both=concept_in_both(t_rows, i_rows, token_concepts),
        ))
    progress(1.0, "feature store built")
    return FeatureStore(meta=meta, params=params, pairs=pairs, tokens=acts.tokens, grid=acts.grid, features=cards)


def save_store(store: FeatureStore, folder: str | Path) -> Path:
    path = Path(folder) / STORE_FILE
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(store.to_dict(), fh, separators=(",", ":"))
    return path


def load_store(folder: str | Path) -> FeatureStore:
    path = Path(folder) / STORE_FILE
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return FeatureStore.from_dict(json.load(fh))



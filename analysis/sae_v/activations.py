"""SAE-V activation collection: the residual stream after one decoder layer at every text and image
position of a set of image-caption pairs, and the per-modality input scaling of the SAE. Every pair is
put in front of the model the same way, whatever its source (`prompts.pair_prompt`).

`collect_activations` returns every position of every pair (the feature store needs them together);
`iter_activations` yields one batch at a time, so a ranking of thousands of pairs never holds more
than one batch of residuals.
"""
from __future__ import annotations

import math
from typing import Callable, Iterator

import torch

from analysis.model_access import anatomy
from analysis import backends
from analysis.model_access.models import ModelHandle
from analysis.sae_v.prompts import pair_prompt
from analysis.sae_v.types import IMAGE, TEXT, Activations, PairSet, Progress, _noop


def collect_activations(handle: ModelHandle, pairs: PairSet, layer: int, batch_size: int = 32,
                        progress: Progress | None = None, images: list | None = None,
                        image_of: Callable[[int], object] | None = None) -> Activations:
    """Residual stream after decoder layer `layer` at every text and image position of every pair.

    Special tokens (BOS, padding) are skipped; image tokens are numbered by patch in row-major
    order. `images` (one per pair) or `image_of(i)` override the dataset's own images."""
    if images is not None:
        image_of = images.__getitem__
    parts = list(iter_activations(handle, pairs, layer, range(len(pairs.pairs)), batch_size, progress, image_of))
    if not parts or not sum(len(p) for p in parts):
        raise ValueError("No text or image positions were found in the inputs.")
    return concat(parts)


def concat(parts: list[Activations]) -> Activations:
    return Activations(acts=torch.cat([p.acts for p in parts]), modality=torch.cat([p.modality for p in parts]),
                       pair=torch.cat([p.pair for p in parts]), index=torch.cat([p.index for p in parts]),
                       tokens=[t for p in parts for t in p.tokens], layer=parts[0].layer,
                       grid=max(p.grid for p in parts))


def iter_activations(handle: ModelHandle, pairs: PairSet, layer: int, which, batch_size: int = 32,
                     progress: Progress | None = None,
                     image_of: Callable[[int], object] | None = None) -> Iterator[Activations]:
    """One `Activations` per batch of the pairs `which` (indices into pairs.pairs); `pair` holds those
    indices. The model's lock is held for one batch at a time."""
    progress = progress or _noop
    anatomy.check_layer(handle.model, layer)
    which = list(which)
    if image_of is None and handle.kind == "vlm":
        from analysis.sae_v.userdata import pair_image

        image_of = lambda i: pair_image(pairs, i)  # noqa: E731
    for start in range(0, len(which), batch_size):
        batch = which[start:start + batch_size]
        prompts = [pair_prompt(handle, pairs.pairs[i].text) for i in batch]
        images = [image_of(i) for i in batch] if handle.kind == "vlm" else None
        yield batch_activations(handle, layer, batch, prompts, images)
        done = start + len(batch)
        progress(done / max(len(which), 1), f"activations {done}/{len(which)}")


def batch_activations(handle: ModelHandle, layer: int, batch: list[int], prompts: list[str],
                      images: list | None) -> Activations:
    """The text and image positions of one batch of prompts (with their images on a VLM)."""
    is_vlm = handle.kind == "vlm"
    tok = handle.tokenizer
    img_id = anatomy.image_token_id(handle) if is_vlm else None
    skip = set(tok.all_special_ids) - ({img_id} if img_id is not None else set())
    grid = 0
    if is_vlm:
        processor = anatomy.require_processor(handle, "SAE-V")  # first: a VLM without one says why
        if images is None or any(im is None for im in images):
            raise ValueError("Every pair needs an image for a vision-language model.")
        with anatomy.model_step(handle, "preparing the SAE-V inputs"):
            enc = processor(images=[[im.convert("RGB")] for im in images], text=prompts, return_tensors="pt",
                            padding=True)
        grid = anatomy.patch_grid(handle, enc).cols
    else:
        enc = tok(prompts, return_tensors="pt", padding=True)
    site = backends.Site("block_out", layer)
    with anatomy.model_step(handle, f"collecting layer-{layer} activations"):
        hidden = backends.run(handle, backends.Request(inputs=dict(enc), reads=(site,)))[site].float()
    ids = enc["input_ids"].cpu()
    mask = enc["attention_mask"].cpu().bool()
    is_image = (ids == img_id) & mask if is_vlm else torch.zeros_like(mask)
    is_text = mask & ~is_image & ~torch.isin(ids, torch.tensor(sorted(skip), dtype=ids.dtype))
    acts, modality, pair_idx, index, tokens = [], [], [], [], []
    for row, i in enumerate(batch):
        keep = (is_text[row] | is_image[row]).nonzero().squeeze(1)  # positions in order
        image_here = is_image[row, keep]
        # text tokens count 0, 1, 2, ... and image tokens count patches 0, 1, 2, ... separately
        idx = torch.where(image_here, image_here.long().cumsum(0) - 1, (~image_here).long().cumsum(0) - 1)
        acts.append(hidden[row, keep])
        modality.append(image_here.long() * IMAGE + (~image_here).long() * TEXT)
        pair_idx.append(torch.full((keep.numel(),), i, dtype=torch.long))
        index.append(idx)
        tokens.append(tok.convert_ids_to_tokens(ids[row, keep[~image_here]].tolist()))
    return Activations(acts=torch.cat(acts), modality=torch.cat(modality), pair=torch.cat(pair_idx),
                       index=torch.cat(index), tokens=tokens, layer=layer, grid=grid)


def modality_scales(acts: Activations) -> list[float]:
    """Per-modality factors that give each modality a mean norm of sqrt(d) (1.0 for an absent one)."""
    d = acts.acts.shape[1]
    out = []
    for mod in (TEXT, IMAGE):
        rows = acts.modality == mod
        norm = float(acts.acts[rows].norm(dim=1).mean()) if rows.any() else 0.0
        out.append(math.sqrt(d) / norm if norm > 0 else 1.0)
    return out


def scaled(acts: Activations, scales: list[float]) -> torch.Tensor:
    """The SAE's input: each token's residual times its modality's scale."""
    factor = torch.tensor(scales, dtype=acts.acts.dtype)[acts.modality]
    return acts.acts * factor[:, None]


def usable_batches(handle: ModelHandle, pairs: PairSet, layer: int, which, batch_size: int = 16,
                   progress: Progress | None = None) -> Iterator[tuple[Activations | None, list[int], list]]:
    """Like `iter_activations`, for data whose images may be unreadable: per batch (activations of the
    usable pairs or None, their indices, [(index, reason)] of the pairs whose image could not be read)."""
    from analysis.framework.images import ImageError
    from analysis.sae_v.userdata import pair_image

    progress = progress or _noop
    anatomy.check_layer(handle.model, layer)
    which = list(which)
    for start in range(0, len(which), batch_size):
        # reported before the batch runs: a Stop raised here loses no finished batch (the caller kept them)
        progress(start / max(len(which), 1), f"pairs {start}/{len(which)}")
        batch, images, bad = [], [], []
        for i in which[start:start + batch_size]:
            if handle.kind == "vlm":
                try:
                    images.append(pair_image(pairs, i))
                except ImageError as exc:
                    bad.append((i, str(exc)))
                    continue
            batch.append(i)
        acts = None
        if batch:
            prompts = [pair_prompt(handle, pairs.pairs[i].text) for i in batch]
            acts = batch_activations(handle, layer, batch, prompts, images if handle.kind == "vlm" else None)
        yield acts, batch, bad
    progress(1.0, f"pairs {len(which)}/{len(which)}")

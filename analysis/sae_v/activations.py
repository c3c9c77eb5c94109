"""SAE-V activation collection: the residual stream after one decoder layer at every text and image
position of a set of image-caption pairs, and the per-modality input scaling of the SAE."""
from __future__ import annotations

import math

import torch

from analysis.models import ModelHandle
from analysis.sae_v.datasets import DATASETS, Dataset
from analysis.sae_v.types import IMAGE, TEXT, Activations, PairSet, Progress, _noop


class _StopForward(Exception):
    """Raised by the capture hook: layers after the chosen one are not needed."""


def decoder_layers(handle: ModelHandle) -> torch.nn.ModuleList:
    return handle.language_model.model.layers


def collect_activations(handle: ModelHandle, pairs: PairSet, layer: int, batch_size: int = 32,
                        progress: Progress | None = None, images: list | None = None) -> Activations:
    """Residual stream after decoder layer `layer` at every text and image position of every pair.

    Special tokens (BOS, padding) are skipped; image tokens are numbered by patch in row-major
    order. `images` overrides the dataset's rendered images (used by `explain_input`).
    """
    progress = progress or _noop
    layers = decoder_layers(handle)
    if not 0 <= layer < len(layers):
        raise ValueError(f"Layer {layer} is out of range: {handle.spec.label} has {len(layers)} decoder layers.")
    is_vlm = handle.kind == "vlm"
    tok = handle.tokenizer
    img_id = handle.model.config.image_token_id if is_vlm else None
    skip = set(tok.all_special_ids) - ({img_id} if img_id is not None else set())
    grid = int(round(math.sqrt(handle.info.image_tokens))) if is_vlm else 0
    dataset = DATASETS.get(pairs.dataset) or Dataset()
    captured: list[torch.Tensor] = []

    def hook(module, args, output):
        captured.append((output[0] if isinstance(output, tuple) else output).detach().float().cpu())
        raise _StopForward

    acts, modality, pair_idx, index, tokens = [], [], [], [], []
    n = len(pairs.pairs)
    with handle.patch() as patch, torch.no_grad():
        patch.hook(layers[layer], hook)
        for start in range(0, n, batch_size):
            batch = list(range(start, min(n, start + batch_size)))
            prompts = [dataset.prompt(handle, pairs.pairs[i].text) for i in batch]
            if is_vlm:
                imgs = [images[i] if images is not None else pairs.image(i) for i in batch]
                if any(im is None for im in imgs):
                    raise ValueError("Every pair needs an image for a vision-language model.")
                enc = handle.processor(images=[im.convert("RGB") for im in imgs], text=prompts,
                                       return_tensors="pt", padding=True)
            else:
                enc = tok(prompts, return_tensors="pt", padding=True)
            enc = {k: v.to(handle.device) for k, v in enc.items()}
            captured.clear()
            try:
                handle.model(**enc)
            except _StopForward:
                pass
            hidden = captured[0]
            ids = enc["input_ids"].cpu()
            mask = enc["attention_mask"].cpu().bool()
            is_image = (ids == img_id) & mask if is_vlm else torch.zeros_like(mask)
            is_text = mask & ~is_image & ~torch.isin(ids, torch.tensor(sorted(skip), dtype=ids.dtype))
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
            progress(batch[-1] / max(n, 1), f"activations {batch[-1] + 1}/{n}")
    if not sum(a.shape[0] for a in acts):
        raise ValueError("No text or image positions were found in the inputs.")
    return Activations(
        acts=torch.cat(acts), modality=torch.cat(modality), pair=torch.cat(pair_idx),
        index=torch.cat(index), tokens=tokens, layer=layer, grid=grid,
    )


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

"""SAE-V activation collection: the residual stream after one decoder layer at every text and image
position of a set of image-caption pairs, and the per-modality input scaling of the SAE."""
from __future__ import annotations

import math

import torch

from analysis import anatomy
from analysis.models import ModelHandle
from analysis.sae_v.datasets import dataset_for
from analysis.sae_v.types import IMAGE, TEXT, Activations, PairSet, Progress, _noop


def collect_activations(handle: ModelHandle, pairs: PairSet, layer: int, batch_size: int = 32,
                        progress: Progress | None = None, images: list | None = None) -> Activations:
    """Residual stream after decoder layer `layer` at every text and image position of every pair.

    Special tokens (BOS, padding) are skipped; image tokens are numbered by patch in row-major
    order. `images` overrides the dataset's rendered images (used by `explain_input`).
    """
    progress = progress or _noop
    anatomy.check_layer(handle.model, layer)
    is_vlm = handle.kind == "vlm"
    tok = handle.tokenizer
    processor = anatomy.require_processor(handle, "SAE-V") if is_vlm else None
    img_id = anatomy.image_token_id(handle) if is_vlm else None
    skip = set(tok.all_special_ids) - ({img_id} if img_id is not None else set())
    grid = 0
    dataset = dataset_for(pairs.dataset)

    acts, modality, pair_idx, index, tokens = [], [], [], [], []
    n = len(pairs.pairs)
    with handle.patch() as patch, torch.no_grad():
        cap = anatomy.Capture(layer).attach(patch, handle.model)
        for start in range(0, n, batch_size):
            batch = list(range(start, min(n, start + batch_size)))
            prompts = [dataset.prompt(handle, pairs.pairs[i].text) for i in batch]
            if is_vlm:
                imgs = [images[i] if images is not None else pairs.image(i) for i in batch]
                if any(im is None for im in imgs):
                    raise ValueError("Every pair needs an image for a vision-language model.")
                with anatomy.model_step(handle, "preparing the SAE-V inputs"):
                    enc = processor(images=[[im.convert("RGB")] for im in imgs], text=prompts,
                                    return_tensors="pt", padding=True)
                grid = grid or anatomy.patch_grid(handle, enc).cols
            else:
                enc = tok(prompts, return_tensors="pt", padding=True)
            enc = {k: v.to(handle.device) for k, v in enc.items()}
            with anatomy.model_step(handle, f"collecting layer-{layer} activations"):
                cap.run(handle.model, **enc)
            hidden = cap.output.detach().float().cpu()
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

"""Grounding: Integrated Gradients (Captum) of the verifier's answer margin w.r.t. the pixels, summed per patch."""
from __future__ import annotations

import torch

from analysis.captions.generation import vlm_inputs
from analysis.captions.verifiers import YesNoVerifier
from analysis.framework.progress import Progress


def ground_claims(verifier: YesNoVerifier, image, claims: list[str], steps: int = 8,
                  progress: Progress | None = None) -> list[list[list[float]]]:
    """One patch-grid heatmap (grid x grid) per claim: signed attribution of log p_T - log p_F."""
    from captum.attr import IntegratedGradients

    vlm = verifier.vlm
    grid = verifier.grid
    maps = []
    for i, claim in enumerate(claims):
        inputs = vlm_inputs(vlm, [image], [verifier.question(claim)])
        pixels = inputs.pop("pixel_values")

        def margin(px: torch.Tensor) -> torch.Tensor:
            rows = px.shape[0]
            batch = {k: v.expand(rows, *v.shape[1:]) for k, v in inputs.items()}
            logits = vlm.model(pixel_values=px, **batch).logits[:, -1].float()
            return verifier.answer_margin(logits)

        with vlm.patch(), torch.enable_grad():
            attr = IntegratedGradients(margin).attribute(pixels, baselines=torch.zeros_like(pixels),
                                                         n_steps=steps, internal_batch_size=steps)
        tile = attr[0]
        while tile.dim() > 3:  # tiled processors (LLaVA-NeXT, Idefics3): the first tile is the whole image
            tile = tile[0]
        per_pixel = tile.sum(0).detach()  # (H, W)
        patch = per_pixel.shape[-1] // grid
        maps.append(per_pixel.reshape(grid, patch, grid, patch).sum((1, 3)).tolist())
        if progress:
            progress((i + 1) / len(claims), f"grounding claim {i + 1}/{len(claims)}")
    return maps

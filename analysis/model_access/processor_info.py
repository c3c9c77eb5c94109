"""What a VLM's processor really does to an image: the side it hands the vision tower and the number of
image tokens it inserts into the prompt, measured by running it (`ModelInfo` reports these, not the
tower's pretraining size from `vision_config.image_size`, which a processor need not use)."""
from __future__ import annotations

import types
from typing import Any

import torch

from analysis.model_access import anatomy

# Two probe images of different sizes and shapes: a processor that crops every image to one size
# gives both the same pixels and the same number of image tokens; one that keeps (part of) the
# image's own resolution (Qwen2-VL, LLaVA-NeXT's tiles, Idefics3's splits) gives different counts.
IMAGE_PROBES = ((640, 480), (224, 352))


def image_geometry(model: torch.nn.Module, processor: Any) -> tuple[int | None, int | None] | None:
    """(side in pixels, image tokens per image) as the VLM's processor really makes them: it is run on
    the probe images, and the pixels it hands the tower and the image tokens it inserts are read back
    (not `vision_config.image_size`, the tower's pretraining size, which a processor may not use).
    Side is None unless every probe becomes the same square; tokens None unless every probe inserts
    the same number. None without a processor, or when it fails on the probes."""
    if processor is None:
        return None
    from PIL import Image

    view = types.SimpleNamespace(model=model, processor=processor, spec=None,
                                 tokenizer=getattr(processor, "tokenizer", None))
    sides, counts = set(), set()
    try:
        text = anatomy.image_prompt(view, "describe")
        for width, height in IMAGE_PROBES:
            enc = processor(images=[Image.new("RGB", (width, height), (90, 140, 200))], text=[text],
                            return_tensors="pt")
            counts.add(int(anatomy.image_mask(view, enc["input_ids"][:1]).sum()))
            pixels = enc.get("pixel_values")
            if pixels is not None and pixels.dim() == 4 and pixels.shape[-1] == pixels.shape[-2]:
                sides.add(int(pixels.shape[-1]))
            else:  # tiles (5-d), flattened patches (2-d) or a non-square crop
                sides.add(None)
    except Exception:  # a processor that cannot take this prompt: the config's numbers are all we have
        return None
    side = sides.pop() if len(sides) == 1 else None
    tokens = counts.pop() if len(counts) == 1 else None
    return side, (tokens or None)

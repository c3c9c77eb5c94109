"""Image helpers shared by the figure builders."""
from __future__ import annotations

import numpy as np


def tower_view(image, size: int) -> np.ndarray:
    """The image as the vision tower sees it: shortest side resized to `size`, centre-cropped."""
    from PIL import Image

    w, h = image.size
    scale = size / min(w, h)
    resized = image.convert("RGB").resize((max(size, round(w * scale)), max(size, round(h * scale))),
                                          Image.Resampling.BICUBIC)
    left, top = (resized.width - size) // 2, (resized.height - size) // 2
    return np.asarray(resized.crop((left, top, left + size, top + size)))

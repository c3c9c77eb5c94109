"""The two modalities of an SAE-V token and the modality labels of a feature."""
from __future__ import annotations

TEXT, IMAGE = 0, 1
MODALITY_NAMES = ("text", "image")
LABELS = ("text-only", "image-only", "cross-modal", "dead")

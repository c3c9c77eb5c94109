"""Attention sharpness: how each head disperses as inputs grow, and whether temperature helps (components/views/sharpness.py)."""
from components.views.sharpness import SharpnessView

SharpnessView().render()

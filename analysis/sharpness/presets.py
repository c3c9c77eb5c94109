"""The attention-sharpness panel's presets: settings that show one finding of *Softmax is not enough* on
the demo zoo (analysis/framework/presets.py; tests/page/test_presets.py re-checks each sentence on the page)."""
from __future__ import annotations

from dataclasses import replace

from analysis.framework.presets import REAL_MODEL, Preset, real_model_in_zoo
from analysis.sharpness.params import SweepParams

SWEEP = SweepParams(ns=[4, 8, 16, 32, 64, 128], samples=16)
# shapes-lm's retrieval head (layer 0, head 3), the temperature in all four layers, the views at n = 128
VIEW = {"theta": "1", "layer": 0, "head": 3, "sink": True, "tlayers": [0, 1, 2, 3], "spread": 4.0, "n_view": 128}

PRESETS = (
    Preset("dispersion", "Dispersion at large n",
           "shapes-lm's retrieval head (layer 0, head 3: the most weight on the largest number at n = 4 on "
           "these 16 prompts) puts 0.97 of its weight on it among 4 items but only 0.53 among 128, and "
           "accuracy falls from 100 % to 56 %: a fixed softmax head cannot stay sharp as n grows.",
           "zoo:shapes-lm", SWEEP, VIEW),
    Preset("adaptive-temperature", "Adaptive θ: no delay",
           "The paper's adaptive temperature in every layer: accuracy falls at the same n as with softmax "
           "(56 % at n = 128 either way), and the retrieval head's max-item weight there moves only from "
           "0.53 to 0.54. On this model it neither stops nor delays dispersion.",
           "zoo:shapes-lm", SWEEP, {**VIEW, "theta": "adaptive"}),
    Preset("lemma", "The lemma, no model",
           "With the maximum only δ = 2 above the other logits, its weight falls like 1/n at every fixed "
           "temperature and the entropy approaches ln n (first figure).",
           "zoo:shapes-lm", SWEEP, {**VIEW, "spread": 2.0}),
    *([Preset("real-retrieval-head", "A real model's retrieval head disperses",
              "SmolLM2-135M-Instruct recalls the asked key's code among n (16 prompts per n): the head found "
              "with the most weight on it, layer 24 head 4, puts 0.82 of its weight there among 2 items but "
              "0.07 among 16, while accuracy stays far above chance (100 % at n = 4, chance 25 %; 69 % at "
              "n = 16, chance 6 %). Adaptive θ in every layer costs accuracy here (25 % at n = 16).",
              f"zoo:{REAL_MODEL}", replace(SWEEP, ns=[2, 4, 8, 16]),
              {**VIEW, "theta": "adaptive", "layer": 24, "head": 4, "tlayers": list(range(30)), "n_view": 16})]
      if real_model_in_zoo() else []),
)

"""The caption-correction panel's presets: settings that show one finding of CapMAS on the demo zoo
(analysis/framework/presets.py; tests/page/test_presets.py re-checks each sentence on the page)."""
from __future__ import annotations

from dataclasses import replace

from analysis.captions.params import SHAPES_LM, CorrectionParams
from analysis.framework.presets import Preset

CORRECTION = CorrectionParams(pi=1.0, ground=False)  # the raw p_True/p_False, as CapMAS defines H
WEAK = {"source": "scene", "seed": 20000003, "cap": "weak", "lm": SHAPES_LM}  # shapes-vlm-weak hallucinates

PRESETS = (
    Preset("position-dropped", "A hallucinated position dropped",
           "The weak captioner puts the yellow triangle at the top middle; asked about that claim alone the "
           "verifier is sure it is false (H ≈ 9.2 nats), and the rewrite removes it: factuality rises.",
           "zoo:shapes-vlm", CORRECTION, WEAK),
    Preset("invented-objects", "Invented objects removed",
           "The weak captioner describes two objects with the wrong colour or shape; every claim about them is "
           "flagged and dropped, and factuality goes from 0 to 1.",
           "zoo:shapes-vlm", CORRECTION, {**WEAK, "seed": 20000004}),
    Preset("strict-threshold", "π = 0: only sure claims",
           "At π = 0 only claims the verifier is certain of survive: factuality stays high but coverage falls "
           "— the trade-off the threshold sweep shows.",
           "zoo:shapes-vlm", replace(CORRECTION, pi=0.0), WEAK),
)

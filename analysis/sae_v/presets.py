"""The SAE-V panel's presets: settings that show one finding of SAE-V on the demo zoo (analysis/framework/presets.py;
tests/page/test_presets.py re-checks each sentence on the page). Two read the demo SAE's feature cards (the
feature with the largest ω, the 'middle right' feature), when the link is made."""
from __future__ import annotations

import functools

from analysis.framework.presets import Preset
from analysis.sae_v.params import SaeChoice
from analysis.sae_v.store import read_store_json
from analysis.sae_v.types import SAE_ROOT


def _demo_features() -> list[dict]:
    # plain JSON, not load_store: the home page lists these presets, and rebuilding the store's typed cards
    # only to read two fields of each doubled its cold render
    folders = sorted((SAE_ROOT / "shapes-vlm").glob("layer*"))
    return read_store_json(folders[0])["features"] if folders else []


@functools.lru_cache(maxsize=1)
def top_cross_modal_feature() -> int:
    """The demo SAE's cross-modal feature with the largest ω (read from its stored feature cards)."""
    cross = [(card["omega"], i) for i, card in enumerate(_demo_features()) if card.get("label") == "cross-modal"]
    return max(cross)[1] if cross else 0


@functools.lru_cache(maxsize=1)
def steering_feature() -> int:
    """The demo SAE's cross-modal 'middle right' feature (its concept in both modalities, the most precise)."""
    found = [((card.get("concept_both") or {}).get("precision", 0), card["omega"], i)
             for i, card in enumerate(_demo_features())
             if card.get("label") == "cross-modal"
             and (card.get("concept_both") or {}).get("name") == "position:middle right"]
    return max(found)[2] if found else 0


CHOICE = SaeChoice()
LIST = {"sae": "layer1", "view": "list", "sort": "omega", "by": "sum", "thr": 0.0}

PRESETS = (
    Preset("cross-modal-list", "How many features are cross-modal",
           "The feature list sorted by cross-modal weight ω: on the demo SAE a few dozen features fire on "
           "both caption words and image patches (the 'Cross-modal' count), most with ω near 1; most features are "
           "text-only.",
           "zoo:shapes-vlm", CHOICE, LIST),
    Preset("cross-modal-feature", "One feature, a word and a patch",
           "The demo SAE's feature with the largest cross-modal weight ω: caption words and image patches "
           "are both among its 30 strongest tokens (the 'Top-30 tokens: text / image' card), shown on the "
           "words it shades and on the patches outlined in its top images.",
           "zoo:shapes-vlm", CHOICE, {**LIST, "view": "feature", "feature": top_cross_modal_feature}),
    Preset("ranking-other-scene", "s_i finds another scene's caption, not a swap",
           "Held-out pairs ranked by s_i: a caption of another scene shares fewer cross-modal features with "
           "the image and sinks (mean rank far below the clean pairs'), while a caption with two attributes "
           "swapped uses the same words and ranks like a clean one.",
           "zoo:shapes-vlm", CHOICE, {**LIST, "view": "ranking", "rule": "official", "thr": 1.0, "keep": 0.5}),
    Preset("steer-middle-right", "Steer one feature: the object moves",
           "The cross-modal feature of 'middle right' (caption words and image patches), added at strength 16 to "
           "the image tokens only: the caption's small red triangle moves from 'the bottom left' to 'the middle "
           "right'. On 87 held-out scenes with nothing there it moves an object to the middle right in 41 (47 %; "
           "3 change otherwise); the other cross-modal features rarely move one to their own place.",
           "zoo:shapes-vlm", CHOICE, {**LIST, "view": "feature", "feature": steering_feature,
                                      "steer": lambda: f"{steering_feature()}=16", "at": "image", "spair": 0,
                                      "mode": "add", "tokens": 48}),
)

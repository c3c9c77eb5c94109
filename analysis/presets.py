"""Presets for live talks: named settings that make one panel show one finding of its paper on the demo zoo.

A preset is data, declared in its panel's package (`ANALYSIS.presets`): a stable name (it appears in
links as `?preset=name`), the zoo model, a value of the panel's Params, and the values it pins of the
page's own controls (its view state: layer, head, metric), by field name. Its link holds the URL value
of every Params field, named by the fields (analysis/settings.py), so a setting added to the Params
later is in every preset's link too; view-state fields it does not pin start from the page's defaults. A page
applies a preset by writing these values into its URL, so a preset is also a permalink. Each finding
sentence was checked by running the preset on the zoo (tests/page/test_presets.py re-checks the numbers
it quotes).

    Preset("needle-streaming", "StreamingLLM loses the needle", "Budget 32 of 189 ...", "zoo:shapes-lm",
           KvParams(policy="streaming_llm", budget=32, seed=7), {"metric": "accuracy"})
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from analysis.settings import Flat, field_text, labelled, url_name, url_values
from analysis.tasks.generic import PLAIN_PROMPT  # the reconstruction page's prompt on a model outside Shapes World


@dataclass(frozen=True)
class Preset:
    name: str  # stable: appears in URLs (?preset=name)
    title: str  # button label
    finding: str  # what the audience sees, one or two sentences
    model: str  # zoo model label, e.g. "zoo:shapes-lm"
    params: Any = None  # the panel's Params value, or a function returning one (values read from files)
    state: dict[str, Any] = field(default_factory=dict)  # view-state field name -> value (or a function returning it)
    panel: str = ""  # the page's URL path, e.g. "kv-cache" (filled in from the panel's ANALYSIS)
    fields: tuple = ()  # (field, owner) of the panel's Params and view state as ANALYSIS declares them now
    urls: dict[str, str | Callable[[], str]] = field(default_factory=dict)  # a panel not yet converted: URL values

    def values(self) -> dict[str, str]:
        """The URL value of every field of the panel's Params and of the view-state fields the preset pins
        (computed values resolved)."""
        out = {k: (v() if callable(v) else v) for k, v in self.urls.items()}
        params_fields, state_fields = self.fields or (None, None)
        params = self.params() if callable(self.params) else self.params
        if params is not None:
            out.update(url_values(params, params_fields))
        by_name = {f.name: f for f, _ in state_fields or []}
        for name, value in self.state.items():
            f = by_name[name]  # a name the view state does not have: KeyError, at once
            if url_name(f):
                out[url_name(f)] = field_text(f, value() if callable(value) else value)
        return out

    def query(self) -> dict[str, str]:
        """The whole query string of the preset's permalink."""
        return {"model": self.model, "preset": self.name, **self.values()}


def panel_fields(analysis) -> tuple:
    """(Params fields, view-state fields) of a panel, as `url_values` reads them."""
    params = analysis.params
    fields = (params.flat_fields() if isinstance(params, type) and issubclass(params, Flat)
              else [(f, params) for f in labelled(params)] if params is not None else None)
    state = analysis.view_state
    return fields, ([(f, state) for f in labelled(state)] if state is not None else None)


def of(analysis) -> list[Preset]:
    """A panel's presets, each knowing its page and the panel's fields."""
    fields = panel_fields(analysis)
    return [dataclasses.replace(p, panel=analysis.url_path, fields=fields) for p in analysis.presets]


def all_presets() -> list[Preset]:
    """Every panel's presets, in the panel table's order."""
    from analysis import panels

    return [p for a in panels.analyses() for p in of(a)] + [p for p in LEGACY if p.panel not in _converted()]


def _converted() -> set[str]:
    from analysis import panels

    return {a.url_path for a in panels.analyses() if a.presets}


def __getattr__(name: str) -> Any:
    if name == "PRESETS":  # read afresh: a panel's declaration is the one source
        return all_presets()
    raise AttributeError(name)


@functools.lru_cache(maxsize=1)
def top_cross_modal_feature() -> str:
    """The demo SAE's cross-modal feature with the largest ω (read from its stored feature cards)."""
    from analysis import sae_v

    folders = sorted((sae_v.SAE_ROOT / "shapes-vlm").glob("layer*"))
    if not folders:
        return "0"
    # plain JSON, not load_store: the home page lists this preset, and rebuilding the store's
    # typed cards only to read two fields of each doubled its cold render
    features = sae_v.read_store_json(folders[0])["features"]
    cross = [(card["omega"], i) for i, card in enumerate(features) if card.get("label") == "cross-modal"]
    return str(max(cross)[1]) if cross else "0"


@functools.lru_cache(maxsize=1)
def steering_feature() -> str:
    """The demo SAE's cross-modal 'middle right' feature (its concept in both modalities, the most precise)."""
    from analysis import sae_v

    folders = sorted((sae_v.SAE_ROOT / "shapes-vlm").glob("layer*"))
    if not folders:
        return "0"
    features = sae_v.read_store_json(folders[0])["features"]
    found = [((card.get("concept_both") or {}).get("precision", 0), card["omega"], i) for i, card in enumerate(features)
             if card.get("label") == "cross-modal"
             and (card.get("concept_both") or {}).get("name") == "position:middle right"]
    return str(max(found)[2]) if found else "0"


PROB = "raw"  # captions.DEFAULT_PROBABILITIES: CapMAS's raw p_True / p_False
SHARPNESS_BASE = {"ns": "4,8,16,32,64,128", "samples": "16", "theta": "1", "layer": "0", "head": "3",
                  "sink": "1", "tlayers": "0,1,2,3", "spread": "4.0", "n_view": "128"}
REAL_MODEL = "smollm2-135m-instruct"  # the real instruct model, once the zoo has it (issue 31)


def real_model_in_zoo() -> bool:
    from analysis.models import all_zoo_models

    return REAL_MODEL in all_zoo_models()


INVERSION_BASE = {"prompt": "there is a large red circle at the top left . there is a small blue square at the "
                            "bottom right .", "layer": "2", "perm": "none", "perturb": "none", "order": "hybrid",
                  "noise": "0.5", "bits": "4", "seed": "0", "sweeps": "0", "exhaustive": "0", "parties": "2",
                  "sharding": "round_robin", "attacker": "0", "budget": "1000000"}
REAL_FINDING = ("SmolLM2-135M-Instruct, a real trained model: from its layer-15 states (of 30) all 14 tokens of the "
                "prompt come back exactly, each certified, after scoring 1,728 candidates instead of "
                "exhaustive search's 688,128 (14 positions × 49,152 tokens): 398× fewer.")
CAPTION_BASE = {"src": "scene", "seed": "20000003", "cap": "weak", "lm": "zoo:shapes-lm", "dec": "auto",
                "ver": "auto", "rew": "auto", "pi": "1.0", "prob": PROB, "ground": "0"}
SAE_BASE = {"sae": "layer1", "view": "list", "sort": "omega", "by": "sum", "thr": "0.0"}

def _legacy(panel: str, name: str, title: str, finding: str, model: str, urls: dict) -> Preset:
    return Preset(name, title, finding, model, urls=urls, panel=panel)


LEGACY: list[Preset] = [  # panels whose presets are not yet Params values in their package
    # --- Softmax is not enough: dispersion -----------------------------------------------------------
    _legacy("attention-sharpness", "dispersion", "Dispersion at large n",
           "shapes-lm's retrieval head (layer 0, head 3: the most weight on the largest number at n = 4 on "
           "these 16 prompts) puts 0.97 of its weight on it among 4 items but only 0.53 among 128, and "
           "accuracy falls from 100 % to 56 %: a fixed softmax head cannot stay sharp as n grows.",
           "zoo:shapes-lm", {**SHARPNESS_BASE}),
    _legacy("attention-sharpness", "adaptive-temperature", "Adaptive θ: no delay",
           "The paper's adaptive temperature in every layer: accuracy falls at the same n as with softmax "
           "(56 % at n = 128 either way), and the retrieval head's max-item weight there moves only from "
           "0.53 to 0.54. On this model it neither stops nor delays dispersion.",
           "zoo:shapes-lm", {**SHARPNESS_BASE, "theta": "adaptive"}),
    _legacy("attention-sharpness", "lemma", "The lemma, no model",
           "With the maximum only δ = 2 above the other logits, its weight falls like 1/n at every fixed "
           "temperature and the entropy approaches ln n (first figure).",
           "zoo:shapes-lm", {**SHARPNESS_BASE, "spread": "2.0"}),
    *([_legacy("attention-sharpness", "real-retrieval-head", "A real model's retrieval head disperses",
              "SmolLM2-135M-Instruct recalls the asked key's code among n (16 prompts per n): the head found "
              "with the most weight on it, layer 24 head 4, puts 0.82 of its weight there among 2 items but "
              "0.07 among 16, while accuracy stays far above chance (100 % at n = 4, chance 25 %; 69 % at "
              "n = 16, chance 6 %). Adaptive θ in every layer costs accuracy here (25 % at n = 16).",
              f"zoo:{REAL_MODEL}", {**SHARPNESS_BASE, "ns": "2,4,8,16", "samples": "16", "theta": "adaptive",
                                    "layer": "24", "head": "4", "tlayers": ",".join(map(str, range(30))),
                                    "n_view": "16"})] if real_model_in_zoo() else []),
    # --- Hidden No More / Cascade ------------------------------------------------------------------------
    _legacy("prompt-reconstruction", "shuffle-fails", "Shuffling does not protect",
           "States of layer 2 with their positions shuffled still give the prompt back token for token: the "
           "attacker matches against every unused row (only at layer 0 of a rotary model, the bare token "
           "embeddings, does the order stay hidden).",
           "zoo:shapes-lm", {**INVERSION_BASE, "perm": "shuffle_positions"}),
    _legacy("prompt-reconstruction", "noise-defeats", "Noise defeats the attack",
           "Gaussian noise of two state standard deviations buries the difference between neighbouring "
           "tokens: almost every position comes back wrong (and the states are useless for the model too).",
           "zoo:shapes-lm", {**INVERSION_BASE, "perturb": "gaussian_noise", "noise": "2.0"}),
    *([_legacy("prompt-reconstruction", "real-vocabulary", "A real 49 k vocabulary", REAL_FINDING, f"zoo:{REAL_MODEL}",
              {**INVERSION_BASE, "prompt": PLAIN_PROMPT, "layer": "15", "exhaustive": "1"})]
      if real_model_in_zoo() else []),
    _legacy("prompt-reconstruction", "cascade-contiguous", "Cascade: contiguous shards leak",
           "Contiguous blocks hand party 0 the start of the prompt with no gap: it inverts its shard with "
           "about 2,000 candidate sequences. Round-robin leaves gaps of k − 1 and costs ~47,000 — with a "
           "182-word vocabulary both are within reach (the verdict says so).",
           "zoo:shapes-lm", {**INVERSION_BASE, "sharding": "blocks", "parties": "2", "attacker": "0"}),
    # --- CapMAS -------------------------------------------------------------------------------------------
    _legacy("caption-correction", "position-dropped", "A hallucinated position dropped",
           "The weak captioner puts the yellow triangle at the top middle; asked about that claim alone the "
           "verifier is sure it is false (H ≈ 9.2 nats), and the rewrite removes it: factuality rises.",
           "zoo:shapes-vlm", {**CAPTION_BASE, "seed": "20000003"}),
    _legacy("caption-correction", "invented-objects", "Invented objects removed",
           "The weak captioner describes two objects with the wrong colour or shape; every claim about them is "
           "flagged and dropped, and factuality goes from 0 to 1.",
           "zoo:shapes-vlm", {**CAPTION_BASE, "seed": "20000004"}),
    _legacy("caption-correction", "strict-threshold", "π = 0: only sure claims",
           "At π = 0 only claims the verifier is certain of survive: factuality stays high but coverage falls "
           "— the trade-off the threshold sweep shows.",
           "zoo:shapes-vlm", {**CAPTION_BASE, "seed": "20000003", "pi": "0.0"}),
    # --- SAE-V --------------------------------------------------------------------------------------------
    _legacy("sae-features", "cross-modal-list", "How many features are cross-modal",
           "The feature list sorted by cross-modal weight ω: on the demo SAE a few dozen features fire on "
           "both caption words and image patches (the 'Cross-modal' count), most with ω near 1; most features are text-only.",
           "zoo:shapes-vlm", {**SAE_BASE}),
    _legacy("sae-features", "cross-modal-feature", "One feature, a word and a patch",
           "The demo SAE's feature with the largest cross-modal weight ω: caption words and image patches "
           "are both among its 30 strongest tokens (the 'Top-30 tokens: text / image' card), shown on the "
           "words it shades and on the patches outlined in its top images.",
           "zoo:shapes-vlm", {**SAE_BASE, "view": "feature", "feature": top_cross_modal_feature}),
    _legacy("sae-features", "ranking-other-scene", "s_i finds another scene's caption, not a swap",
           "Held-out pairs ranked by s_i: a caption of another scene shares fewer cross-modal features with "
           "the image and sinks (mean rank far below the clean pairs'), while a caption with two attributes "
           "swapped uses the same words and ranks like a clean one.",
           "zoo:shapes-vlm", {**SAE_BASE, "view": "ranking", "rule": "official", "thr": "1.0", "keep": "0.5"}),
    _legacy("sae-features", "steer-middle-right", "Steer one feature: the object moves",
           "The cross-modal feature of 'middle right' (caption words and image patches), added at strength 16 to "
           "the image tokens only: the caption's small red triangle moves from 'the bottom left' to 'the middle "
           "right'. On 87 held-out scenes with nothing there it moves an object to the middle right in 41 % "
           "(3 % change otherwise); the other cross-modal features rarely move one to their own place.",
           "zoo:shapes-vlm", {**SAE_BASE, "view": "feature", "feature": steering_feature,
                              "steer": lambda: f"{steering_feature()}=16", "at": "image", "spair": "0", "mode": "add",
                              "tokens": "48"}),
]


def for_panel(panel: str) -> list[Preset]:
    """The presets of the page at URL path `panel` ("kv-cache")."""
    return [p for p in all_presets() if p.panel == panel]


def get(panel: str, name: str) -> Preset | None:
    return next((p for p in for_panel(panel) if p.name == name), None)

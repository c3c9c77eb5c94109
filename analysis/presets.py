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


REAL_MODEL = "smollm2-135m-instruct"  # the real instruct model, once the zoo has it (issue 31)


def real_model_in_zoo() -> bool:
    from analysis.models import all_zoo_models

    return REAL_MODEL in all_zoo_models()


SAE_BASE = {"sae": "layer1", "view": "list", "sort": "omega", "by": "sum", "thr": "0.0"}

def _legacy(panel: str, name: str, title: str, finding: str, model: str, urls: dict) -> Preset:
    return Preset(name, title, finding, model, urls=urls, panel=panel)


LEGACY: list[Preset] = [  # panels whose presets are not yet Params values in their package
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

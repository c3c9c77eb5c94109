"""Presets for live talks: named settings that make one panel show one finding of its paper on the demo zoo.

A preset is data, declared in its panel's package (`ANALYSIS.presets`): a stable name (it appears in
links as `?preset=name`), the zoo model, a value of the panel's Params, and the values it pins of the
page's own controls (its view state: layer, head, metric), by field name. Its link holds the URL value
of every Params field, named by the fields (analysis/framework/settings.py), so a setting added to the Params
later is in every preset's link too; view-state fields it does not pin start from the page's defaults. A page
applies a preset by writing these values into its URL, so a preset is also a permalink. Each finding
sentence was checked by running the preset on the zoo (tests/page/test_presets.py re-checks the numbers
it quotes).

    Preset("needle-streaming", "StreamingLLM loses the needle", "Budget 32 of 189 ...", "zoo:shapes-lm",
           KvParams(policy="streaming_llm", budget=32, seed=7), {"metric": "accuracy"})
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from analysis.framework.settings import Flat, field_text, labelled, url_name, url_values


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

    def values(self) -> dict[str, str]:
        """The URL value of every field of the panel's Params and of the view-state fields the preset pins
        (computed values resolved)."""
        out: dict[str, str] = {}
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
    from analysis.framework import panels

    return [p for a in panels.analyses() for p in of(a)]


def __getattr__(name: str) -> Any:
    if name == "PRESETS":  # read afresh: a panel's declaration is the one source
        return all_presets()
    raise AttributeError(name)


REAL_MODEL = "smollm2-135m-instruct"  # the real instruct model, once the zoo has it (issue 31)


def real_model_in_zoo() -> bool:
    from analysis.model_access.models import all_zoo_models

    return REAL_MODEL in all_zoo_models()


def for_panel(panel: str) -> list[Preset]:
    """The presets of the page at URL path `panel` ("kv-cache")."""
    return [p for p in all_presets() if p.panel == panel]


def get(panel: str, name: str) -> Preset | None:
    return next((p for p in for_panel(panel) if p.name == name), None)

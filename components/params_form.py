"""A page's controls drawn from settings fields (analysis/framework/settings.py): label, range, choices, help and
URL name come from the field, so they are written once for the page, the link and the command line.

    fields = [(f, KvParams) for f in labelled(KvParams) if f.name in ("context", "pairs")]
    form = ParamsForm("kv_")
    values = form.draw(field_row(), fields, defaults={"context": 64})
    ...
    form.mirror()                       # the URL now holds the values shown
    form.check(lambda raw: validate(build(raw)))   # a link out of range: one message, nearest values shown

Every value starts from the URL (`?context=64`), parsed with the field's type (`url_value`: the one place
a page reads link text). A link value outside the field's range is clamped into it for the widget, and
`check` hands the unclamped values to the same validation the CLI runs, so a bad link gets the CLI's
one-line message. A value that does not parse, or a choice that does not exist, falls back on the
default (as every URL value on these pages does). A range or a list of choices that depends on the
model or the result (a layer, a head) is given when drawing (`overrides={"layer": {"high": 11}}`): the
link's value is clamped into it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import Field
from typing import Any, Callable, Iterable

import streamlit as st

from analysis.framework.errors import SettingsError
from analysis.framework.settings import (check_magnitude, choices_of, field_default, field_text, kind_of, parse_text,
                                         to_text, url_name)
from components.common import URL_TEXT_MAX, analysis_errors, set_url_params

WIDTH = 135  # px: six fields fit in a row at 1400 px, three at 1024
OUT_OF_RANGE = "This link's settings are out of range; the controls show the nearest allowed values: "


def _bounds(f: Field, overrides: dict) -> tuple[Any, Any]:
    return overrides.get("low", f.metadata.get("low")), overrides.get("high", f.metadata.get("high"))


def _clamp(f: Field, value: Any, kind: type, overrides: dict | None = None) -> Any:
    low, high = _bounds(f, overrides or {})
    if kind in (int, float) and not isinstance(value, bool):
        if low is not None and value < low:
            value = kind(low)
        if high is not None and value > high:
            value = kind(high)
    if kind is str and high is not None:
        value = value[:high]
    return value


def url_value(f: Field, owner: Any, default: Any, **overrides: Any) -> tuple[Any, Any]:
    """(as the link gives it, as the widget may show it) for one field; never raises. `overrides` may
    narrow its range (`low`, `high`) or its `choices` to what this model or result has; the default is
    clamped into a narrowed range too (a prompt of one token has one Cascade party)."""
    kind = kind_of(f, owner)
    fallback = (default, _clamp(f, default, kind, overrides)) if kind in (int, float) and default is not None \
        else (default, default)
    name = url_name(f)
    raw_text = st.query_params.get(name) if name else None
    if raw_text is None:
        return fallback
    try:
        value = parse_text(f, str(raw_text)[:URL_TEXT_MAX], owner)
    except (TypeError, ValueError, OverflowError):
        return fallback
    choices = overrides["choices"] if overrides.get("choices") is not None else offered(f)
    if kind is list:
        if choices is not None:
            value = [v for v in value if v in choices]
        elif f.metadata.get("item") in (int, float):
            value = [_clamp(f, v, f.metadata["item"], overrides) for v in value]
        if not value and not f.metadata.get("allow_empty"):
            return fallback
        return value, sorted(set(value), key=value.index)
    shown = _clamp(f, value, kind, overrides)
    if choices is not None and shown not in choices:
        return fallback
    return value, shown


def offered(f: Field) -> list | None:
    """The choices a page offers for field `f`: its own, or its `offer` metadata (the CLI takes any value)."""
    choices = choices_of(f)
    return choices if choices is not None else f.metadata.get("offer")


def labeller(f: Field) -> Any:
    """How the choices of field `f` read (its `labels` metadata: a dict or a function), or None."""
    labels = f.metadata.get("labels")
    if isinstance(labels, dict):
        return lambda choice: labels.get(choice, str(choice))
    return labels


def widget(container: Any, f: Field, owner: Any, *, key: str, value: Any, width: int | str | None = WIDTH,
           **overrides: Any) -> Any:
    """One Streamlit widget for field `f` showing `value`; returns what it holds."""
    meta = f.metadata
    kind = kind_of(f, owner)
    label = overrides.pop("label", meta["label"])
    help_text = overrides.pop("help", meta.get("help") or None)
    choices = overrides.pop("choices", None) or offered(f)
    hint = overrides.pop("widget", meta.get("widget"))
    if choices is not None and labeller(f) is not None:
        overrides.setdefault("format_func", labeller(f))
    if kind in (int, float):
        meta = {**meta, **{k: overrides.pop(k) for k in ("low", "high", "step") if k in overrides}}
    else:
        overrides.pop("low", None), overrides.pop("high", None), overrides.pop("step", None)
    common = dict(key=key, help=help_text, **({"width": width} if width is not None else {}), **overrides)
    if kind is list:
        if choices is None:
            text = container.text_input(label, to_text(value), **common)
            try:
                return parse_text(f, text, owner)
            except ValueError:
                return value
        # pills wrap: a row that scrolls sideways hid choices at 1024 px
        chosen = container.pills(label, choices, selection_mode="multi", default=value, wrap=True, **common) or []
        return [c for c in choices if c in chosen]  # in the choices' own order
    if choices is not None:
        if hint == "pills":
            return container.pills(label, choices, default=value, **common)
        if hint == "slider":
            return container.select_slider(label, choices, value=value, **common)
        if hint == "radio":
            return container.radio(label, choices, index=choices.index(value), horizontal=True, **common)
        if hint == "segmented":
            return container.segmented_control(label, choices, default=value, **common)
        return container.selectbox(label, choices, index=choices.index(value), **common)
    if kind is bool:  # a toggle's label sits beside it on one line: a fixed field width cuts it ("Check the…")
        if isinstance(common.get("width"), int):
            common["width"] = "content"
        return container.toggle(label, value=bool(value), **common)
    if kind is str:
        high = meta.get("high")
        if hint == "area":
            return container.text_area(label, value, max_chars=high, **common)
        return container.text_input(label, value, max_chars=high, **common)
    low = kind(meta["low"]) if meta.get("low") is not None else None
    high = kind(meta["high"]) if meta.get("high") is not None else None
    step = kind(meta["step"]) if meta.get("step") is not None else (kind(1) if kind is int else None)
    if hint == "slider" and low is not None and high is not None:
        return kind(container.slider(label, low, high, kind(value), step=step, **common))
    fmt = common.pop("format", "%d" if kind is int else None)
    return kind(container.number_input(label, low, high, kind(value), step=step, format=fmt, **common))


def _forget_if_outside(key: str, f: Field, owner: Any, overrides: dict) -> None:
    """Drop a widget's remembered value that this model or result no longer allows (a model with fewer
    layers, fewer parties than before): the widget then starts from the link or the default."""
    if key not in st.session_state:
        return
    value, kind = st.session_state[key], kind_of(f, owner)
    choices = overrides.get("choices") if overrides.get("choices") is not None else offered(f)
    low, high = _bounds(f, overrides)
    if kind is list:
        outside = choices is not None and isinstance(value, list) and not set(value) <= set(choices)
    elif choices is not None:
        outside = value not in choices
    else:
        outside = (kind in (int, float) and isinstance(value, (int, float)) and not isinstance(value, bool)
                   and ((low is not None and value < low) or (high is not None and value > high)))
    if outside:
        del st.session_state[key]


class ParamsForm:
    """The controls of one page (or one section): values shown, values the link gave, URL mirroring."""

    def __init__(self, prefix: str, link: bool = True) -> None:
        self.prefix = prefix
        self.link = link  # False: values start from the defaults, never from the URL (and are not mirrored)
        self.values: dict[str, Any] = {}  # field name -> value shown
        self.raw: dict[str, Any] = {}  # field name -> value the link gave (unclamped)
        self.fields: dict[str, Field] = {}

    def draw(self, container: Any, fields: Iterable[tuple[Field, Any]], *, defaults: dict | None = None,
             width: int | str | None = WIDTH, overrides: dict[str, dict] | None = None) -> dict[str, Any]:
        """A widget per (field, owner class) in `container`; returns {field name: value}. A field's own
        `width` metadata wins over `width`; `overrides[name]` over both (widget keywords, and `low`,
        `high`, `choices` that narrow what the link may set, `key` for the widget's key without prefix)."""
        defaults, overrides = defaults or {}, overrides or {}
        out = {}
        for f, owner in fields:
            kw = dict(overrides.get(f.name, {}))
            default = defaults.get(f.name, field_default(f))
            raw, shown = (url_value(f, owner, default, **{k: kw[k] for k in ("low", "high", "choices") if k in kw})
                          if self.link else (default, default))
            key = f"{self.prefix}{kw.pop('key', f.name)}"
            _forget_if_outside(key, f, owner, kw)
            out[f.name] = widget(container, f, owner, key=key, value=shown,
                                 width=kw.pop("width", f.metadata.get("width", width)), **kw)
            self.raw[f.name], self.fields[f.name] = raw, f
        self.values.update(out)
        return out

    def mirror(self) -> None:
        """Write every drawn value into the URL, so the link reproduces the view."""
        if not self.link:
            return
        set_url_params(**{url_name(f): field_text(f, self.values[name]) for name, f in self.fields.items()
                          if url_name(f)})

    def check(self, validate: Callable[[dict[str, Any]], None], stop: bool = True) -> None:
        """Run `validate(values the link gave)`; a SettingsError becomes one message and the page stops there
        (`stop=False`: goes on with the nearest allowed values). The widgets and the URL already hold the
        nearest allowed values, so any change of a control runs."""
        prefix = ("This link's settings are out of range (the controls show the nearest allowed values; change any "
                  "control to run with them): " if stop else OUT_OF_RANGE)
        with analysis_errors(prefix=prefix, stop=stop):
            for name, f in self.fields.items():  # before any panel's own check compares it with a float
                check_magnitude(f.metadata.get("label", name), self.raw[name], f.metadata)
            validate(dict(self.raw))


def fields_of(owner: Any, names: Iterable[str]) -> list[tuple[Field, Any]]:
    """(field, owner) for the named fields of a dataclass, in the order given."""
    by_name = {f.name: f for f in dataclasses.fields(owner)}
    return [(by_name[n], owner) for n in names]


__all__ = ["ParamsForm", "SettingsError", "fields_of", "url_value", "widget"]

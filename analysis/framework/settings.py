"""Settings described once, as dataclass fields: label, range, choices and help live in the field.

    @dataclass
    class SnapKV(Policy):
        snap_window: int = setting(8, label="SnapKV window w", low=1, high=4096,
                                   help="The last w queries vote.")

From that one declaration
- `check_settings(obj)` validates every labelled field (type, range, choices) with a message naming the
  label (`Method.__post_init__` runs it before the class's own cross-field `validate()`);
- `add_arguments(parser, fields)` / `read_arguments(args, fields)` make the command-line flags
  (`--snap-window`);
- `components/params_form.py` draws the page's widgets and mirrors them into the URL (`snap_window=`).

So a range or a label is written in one place, and the page, the link and the CLI validate through the
same path. Fields without a `label` are internal: no widget, no flag, not checked here.

Metadata keys: `label` (required), `help`, `low`, `high`, `step`, `choices` (a list, or a callable
returning one), `url` (the URL name; default: the field name; None: not in the URL, and so no page
control either), `cli` (the flag without dashes; default: the field name with dashes; None: no flag),
`item` (the element type of a list field, given on the command line and in the URL as comma-separated
values), `min_items`, `allow_empty` (a list field the user may empty: the link then says EMPTY_LIST).

Page hints (read by components/params_form.py and components/view.py, ignored elsewhere): `widget`
("slider", "select", "pills", "toggle", "text", "area", "number"), `labels` (how each choice reads: a
dict or a function of the choice), `offer` (the choices the page offers where the CLI takes any value
in range), `group` (the page section the control sits in; a page draws the
fields of no declared group in its last section, so a new field appears with no page edit), `width`
(px, or "stretch"), `span` (the field's share of a row of columns).

A panel's Params inherit `Flat`: the page, the link and the command line see one flat set of settings,
the Params' own labelled fields then every setting of the method families it holds (`METHODS`).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from dataclasses import MISSING, Field
from typing import Any, Callable, ClassVar, Iterable

from analysis.framework.errors import SettingsError

_UNSET = object()
EMPTY_LIST = "none"  # the text of a list the user emptied on purpose (`allow_empty`): an empty text means "default"
MAX_WHOLE = 2**53  # the largest whole number a setting may be (exact as a float; a link can carry far more digits)


def setting(default: Any = MISSING, *, label: str, help: str = "", low: Any = None, high: Any = None,
            step: Any = None, choices: list | Callable[[], list] | None = None, url: Any = _UNSET,
            cli: Any = _UNSET, widget: str | None = None, item: type | None = None, min_items: int = 0,
            default_factory: Callable[[], Any] = MISSING, **extra: Any) -> Any:
    """A dataclass field that carries its user-facing description (see the module docstring)."""
    meta = {"label": label, "help": help, "low": low, "high": high, "step": step, "choices": choices,
            "widget": widget, "item": item, "min_items": min_items, **extra}
    if url is not _UNSET:
        meta["url"] = url
    if cli is not _UNSET:
        meta["cli"] = cli
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def like(owner: Any, name: str, **changes: Any) -> Any:
    """A new field described as `owner`'s field `name` (its default, label, range, ...), with `changes`:
    one description for two places, e.g. a page's control of a setting that another run's Params owns."""
    f = next(f for f in dataclasses.fields(owner) if f.name == name)
    meta = {**f.metadata, **changes}
    kw = {"default_factory": f.default_factory} if f.default_factory is not MISSING else {"default": f.default}
    return dataclasses.field(**kw, metadata=meta)  # type: ignore[arg-type]


def labelled(cls_or_obj: Any) -> list[Field]:
    """The user-facing settings of a dataclass (fields with a label), in declaration order."""
    return [f for f in dataclasses.fields(cls_or_obj) if f.metadata.get("label")]


def field_default(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def choices_of(f: Field) -> list | None:
    choices = f.metadata.get("choices")
    return list(choices()) if callable(choices) else (list(choices) if choices is not None else None)


def kind_of(f: Field, owner: Any = None) -> type:
    """The value type of a field: int, float, bool, str or list (from its annotation or its default)."""
    hint = None
    if owner is not None:
        try:
            hint = typing.get_type_hints(owner if isinstance(owner, type) else type(owner)).get(f.name)
        except Exception:  # unresolvable annotations: fall back on the default's type
            hint = None
    origin = typing.get_origin(hint)
    if origin in (list, tuple) or hint in (list, tuple):
        return list
    if hint in (bool, int, float, str):
        return hint
    default = field_default(f)
    if isinstance(default, (list, tuple)):
        return list
    return type(default) if default is not None else str


def url_name(f: Field) -> str | None:
    return f.metadata.get("url", f.name)


def cli_name(f: Field) -> str | None:
    name = f.metadata.get("cli", f.name.replace("_", "-"))
    return name if name else None


# ---------------------------------------------------------------------------------------------
# Validation


def check_value(f: Field, value: Any, kind: type) -> None:
    """Raise SettingsError unless `value` is a valid value of field `f` (of type `kind`)."""
    meta = f.metadata
    label = meta["label"]
    choices = choices_of(f)
    if kind is list:
        if not isinstance(value, (list, tuple)):
            raise SettingsError(f"{label} must be a list, got {value!r}.")
        if len(value) < meta.get("min_items", 0):
            raise SettingsError(f"{label} needs at least {meta['min_items']} value(s).")
        item = meta.get("item") or float
        for v in value:
            _check_scalar(label, v, item, meta, choices)
        return
    _check_scalar(label, value, kind, meta, choices)


def _check_scalar(label: str, value: Any, kind: type, meta: dict, choices: list | None) -> None:
    if choices is not None:
        if value not in choices:
            raise SettingsError(f"{label} must be one of {', '.join(map(str, choices))}, got {value!r}.")
        return
    if kind is bool:
        if not isinstance(value, bool):
            raise SettingsError(f"{label} must be true or false, got {value!r}.")
        return
    if kind is str:
        if not isinstance(value, str):
            raise SettingsError(f"{label} must be text, got {value!r}.")
        high = meta.get("high")
        if high is not None and len(value) > high:
            raise SettingsError(f"{label} is too long ({len(value):,} characters; at most {high:,}).")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingsError(f"{label} must be a number, got {value!r}.")
    low, high = meta.get("low"), meta.get("high")
    check_magnitude(label, value, meta)
    if not math.isfinite(value):
        raise SettingsError(f"{label} must be finite, got {value}.")
    if kind is int and int(value) != value:
        raise SettingsError(f"{label} must be a whole number, got {value}.")
    if low is not None and value < low:
        raise SettingsError(f"{label} must be at least {low}, got {value}.")
    if high is not None and value > high:
        raise SettingsError(f"{label} must be at most {high}, got {value}.")


def check_magnitude(label: str, value: Any, meta: dict) -> None:
    """Refuse a whole number no float can hold (a 2,000-digit integer from a link) with the field's message,
    before anything compares it with a float; lists are checked item by item."""
    for v in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_WHOLE:
            low, high = meta.get("low"), meta.get("high")
            bound = (f"at most {high}" if high is not None else f"at most {MAX_WHOLE:,}") if v > 0 else \
                (f"at least {low}" if low is not None else f"at least {-MAX_WHOLE:,}")
            raise SettingsError(f"{label} must be {bound}, got a number of {len(str(abs(v))):,} digits.")


def check_settings(obj: Any, names: Iterable[str] | None = None) -> None:
    """Validate every labelled field of a dataclass instance (or those in `names`) from its metadata."""
    wanted = set(names) if names is not None else None
    for f in labelled(obj):
        if wanted is None or f.name in wanted:
            check_value(f, getattr(obj, f.name), kind_of(f, obj))


# ---------------------------------------------------------------------------------------------
# Text values: the command line and the URL carry settings as text


def parse_text(f: Field, text: str, owner: Any = None) -> Any:
    """A field's value from text ('4', '0.5', 'max', '1,2,4', 'true'); ValueError when it does not parse."""
    kind = kind_of(f, owner)
    if kind is list:
        if f.metadata.get("allow_empty") and str(text).strip() == EMPTY_LIST:
            return []
        item = f.metadata.get("item") or float
        return [_parse_scalar(part.strip(), item) for part in str(text).split(",") if part.strip()]
    return _parse_scalar(str(text), kind)


def _parse_scalar(text: str, kind: type) -> Any:
    if kind is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(text)
    if kind is int:
        try:
            return int(text.strip())
        except ValueError:
            number = float(text)  # "3.0", "1e3"
            if not math.isfinite(number) or number != int(number):
                raise
            return int(number)
    if kind is float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(text)
        return value
    return text


def to_text(value: Any) -> str:
    """The URL / command-line text of a value (lists comma-separated; booleans 1/0)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return ",".join(to_text(v) for v in value)
    return str(value)


def field_text(f: Field, value: Any) -> str:
    """The URL text of field `f`'s value (an emptied list that may be empty: EMPTY_LIST)."""
    if isinstance(value, (list, tuple)) and not value and f.metadata.get("allow_empty"):
        return EMPTY_LIST
    return to_text(value)


def url_values(obj: Any, fields: Iterable[tuple[Field, Any]] | None = None) -> dict[str, str]:
    """{URL name: text} of every field with a URL name: a preset's or a page's link. `obj` is a `Flat`
    value or a dataclass of settings; `fields` (default: its own) may hold fields `obj` lacks (a class
    grown since): those give their default."""
    if fields is None:
        fields = type(obj).flat_fields() if isinstance(obj, Flat) else [(f, type(obj)) for f in labelled(obj)]
    if isinstance(obj, Flat):
        values = {url_name(f): obj.value_of(f, owner) for f, owner in fields if url_name(f)}
        return {name: field_text(f, values[name]) for f, _ in fields if (name := url_name(f))
                and values[name] is not _UNSET}
    return {url_name(f): field_text(f, getattr(obj, f.name, field_default(f))) for f, _ in fields if url_name(f)}


# ---------------------------------------------------------------------------------------------
# A panel's settings as one flat set (the page's controls, the link, the command line)


class Flat:
    """A Params dataclass whose settings travel flat: its own labelled fields, then every labelled setting
    of each method family it holds as `{method name: {setting: value}}` (`METHODS`: (attribute, registry)
    pairs, e.g. (("policies", POLICIES),); two families may share one attribute). A setting two methods
    share (SnapKV's and PyramidKV's window) is one.

        values = KvParams.from_flat({"budget": 32, "snap_window": 4}).flat()
    """

    METHODS: ClassVar[tuple[tuple[str, Any], ...]] = ()

    @classmethod
    def flat_fields(cls) -> list[tuple[Field, Any]]:
        """(field, owner class) of every flat setting, in order: the Params' own, then each family's (two
        families' settings of one field name are two settings when their URL names differ: a decomposer's
        and a rewriter's token counts)."""
        out = [(f, cls) for f in labelled(cls)]
        seen = {url_name(f) or f.name for f, _ in out}
        for _, registry in cls.METHODS:
            for f, owner in registry.settings():
                if (url_name(f) or f.name) not in seen:
                    seen.add(url_name(f) or f.name)
                    out.append((f, owner))
        return out

    @classmethod
    def from_flat(cls, values: dict[str, Any], **others: Any) -> Any:
        """The Params of these flat values (absent ones: defaults); `others`: fields that are not settings."""
        own = {f.name for f in labelled(cls)}
        nested: dict[str, dict] = {}
        for attr, registry in cls.METHODS:
            declared = {f.name for f, _ in registry.settings()}
            nested.setdefault(attr, {}).update(
                registry.split_settings(**{k: v for k, v in values.items() if k in declared and k not in own}))
        return cls(**{k: v for k, v in values.items() if k in own}, **nested, **others)

    def value_of(self, f: Field, owner: Any) -> Any:
        """The value of one flat setting: a method's as held for its family (else its default, or, where the
        family's methods default differently, e.g. each decomposer its own token count, no value: the method
        that runs uses its own); the Params' own as the instance has it (a field it lacks, declared by a
        subclass: its default)."""
        for attr, registry in self.METHODS:
            if registry.get(owner.name) is owner if getattr(owner, "name", None) in registry else False:
                held = getattr(self, attr) or {}
                given = [v[f.name] for name, v in held.items() if name in registry and f.name in v]
                if given:
                    return given[0]
                defaults = {repr(field_default(g)) for cls in registry.values() for g in labelled(cls)
                            if g.name == f.name and url_name(g) == url_name(f)}
                return field_default(f) if len(defaults) == 1 else _UNSET
        return getattr(self, f.name, field_default(f))

    def flat(self) -> dict[str, Any]:
        """{field name: value} of every flat setting (a method's setting not given: its default)."""
        out = {f.name: getattr(self, f.name) for f in labelled(self)}
        for attr, registry in self.METHODS:
            held = getattr(self, attr) or {}
            for f, owner in registry.settings():
                if f.name in out:
                    continue
                given = [v[f.name] for name, v in held.items() if f.name in v]
                out[f.name] = given[0] if given else field_default(f)
        return out


# ---------------------------------------------------------------------------------------------
# The command line


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one SettingsError line (`python -m analysis` prints `error: ...`, exit 1)."""

    def error(self, message: str):  # noqa: D401 - argparse hook
        raise SettingsError(f"{message} (see {self.prog} --help).")


def add_arguments(parser: argparse.ArgumentParser, fields: Iterable[tuple[Field, Any]],
                  seen: set[str] | None = None) -> None:
    """One flag per labelled field; `fields` are (field, owner class) pairs. A flag shared by several
    owners (SnapKV's and PyramidKV's window) is added once. Values are parsed later by `read_arguments`,
    so a bad value gets the field's own message."""
    seen = set() if seen is None else seen
    for f, owner in fields:
        name = cli_name(f)
        if name is None or name in seen:
            continue
        seen.add(name)
        meta = f.metadata
        default = field_default(f)
        bits = []
        choices = choices_of(f)
        if choices is not None:
            bits.append(f"one of {', '.join(map(str, choices))}")
        elif kind_of(f, owner) in (int, float, list) and (meta.get("low") is not None or meta.get("high") is not None):
            bits.append(f"{meta.get('low', '')}..{meta.get('high', '')}")
        if default not in (None, "", []):
            bits.append(f"default {to_text(default)}")
        text = meta.get("help") or meta["label"]
        parser.add_argument(f"--{name}", dest=_dest(f), default=None, metavar=f.name.upper(),
                            help=text + (f" [{'; '.join(bits)}]" if bits else ""))


def _dest(f: Field) -> str:
    """A flag's argparse destination, by its flag name: two fields of one name with different flags
    (a decomposer's and a rewriter's `max_new_tokens`) are two flags."""
    return "setting__" + cli_name(f).replace("-", "_")


def read_arguments(args: argparse.Namespace, fields: Iterable[tuple[Field, Any]]) -> dict[str, Any]:
    """{field name: parsed value} of the flags given (absent flags are left out)."""
    out: dict[str, Any] = {}
    for f, owner in fields:
        text = getattr(args, _dest(f), None) if cli_name(f) else None
        if text is None:
            continue
        try:
            out[f.name] = parse_text(f, text, owner)
        except ValueError:
            raise SettingsError(f"--{cli_name(f)}: cannot read {text!r} as {f.metadata['label']}.") from None
    return out

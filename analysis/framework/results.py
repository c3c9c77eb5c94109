"""Typed results that travel: dataclasses that round-trip through JSON.

Every analysis returns a dataclass that inherits `Result`. `to_dict()` gives plain JSON types
(tensors and numpy arrays become nested lists), `from_dict()` rebuilds nested dataclasses from
the field type hints, so the page, the export, the saved-analysis store and the CLI all share
one representation. `rows_to_csv` writes a table of rows as CSV (the export and SAE-V's ranked list).
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import gc
import io
import json
import math
import threading
import types
import typing
from typing import Any, Callable, Iterable, Iterator, TypeVar

T = TypeVar("T", bound="Result")


def to_jsonable(value: Any) -> Any:
    """Convert a value to plain JSON types (dict, list, str, int, float, bool, None)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if _own_layout(type(value)):  # the class writes its own layout (and reads it in its from_dict)
            return to_jsonable(value.to_dict())
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # torch.Tensor, numpy arrays and numpy scalars
        return to_jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    return value


@functools.lru_cache(maxsize=None)
def _own_layout(cls: type) -> bool:
    """A Result subclass that overrides `to_dict`."""
    return issubclass(cls, Result) and cls.to_dict is not Result.to_dict


def _same(value: Any) -> Any:
    return value


@functools.lru_cache(maxsize=None)
def _builder(tp: Any) -> Callable[[Any], Any]:
    """A function that rebuilds a JSON value as type `tp` (dataclasses, lists, tuples, dicts, unions).

    Made once per type: a feature store is tens of thousands of nested values, and asking `typing`
    about the type again for each of them was most of the cost of loading one. Plain values (and
    lists of them) are taken as they are."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        subs = [_builder(arg) for arg in args if arg is not type(None)]
        if all(sub is _same for sub in subs):
            return _same

        def build_union(value: Any) -> Any:
            if value is None:
                return None
            for sub in subs:
                try:
                    return sub(value)
                except (TypeError, ValueError, KeyError):
                    continue
            return value
        return build_union
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        own = getattr(tp, "from_dict", None)
        if own is not None and getattr(own, "__func__", None) is not Result.from_dict.__func__:
            return lambda value: None if value is None else own(value)  # the class reads older layouts itself
        return lambda value: None if value is None else _from_dict(tp, value)
    if origin in (list, typing.List) and args:
        inner = _builder(args[0])
        if inner is _same:
            return lambda value: None if value is None else list(value)
        return lambda value: None if value is None else [inner(v) for v in value]
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            inner = _builder(args[0])
            return lambda value: None if value is None else tuple(inner(v) for v in value)
        subs = [_builder(a) for a in args]
        return lambda value: None if value is None else tuple(b(v) for b, v in zip(subs, value))
    if origin in (dict, typing.Dict) and len(args) == 2:
        key_type = args[0] if args[0] in (int, float) else _same
        inner = _builder(args[1])
        return lambda value: None if value is None else {key_type(k): inner(v) for k, v in value.items()}
    return _same


@functools.lru_cache(maxsize=None)
def _field_types(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, resolved type hint) of each field of a dataclass. Resolving string annotations is most of
    the cost of rebuilding a result (a feature store has thousands of nested dataclasses), so it is
    done once per class."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints.get(f.name, Any)) for f in dataclasses.fields(cls))


@functools.lru_cache(maxsize=None)
def _field_builders(cls: type) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    return tuple((name, _builder(tp)) for name, tp in _field_types(cls))


def _from_dict(cls: type, data: dict) -> Any:
    kwargs = {name: build(data[name]) for name, build in _field_builders(cls) if name in data}
    return cls(**kwargs)


_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = True


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a large result is rebuilt (re-entrant, thread-safe).

    A feature store is some 10^5 new objects: each allocation burst triggers collections that walk
    the whole heap, which in the app holds every loaded model. Measured on the demo feature store in
    a process with the model loaded: 0.9 s of a 1.3 s load was the collector. The objects built
    here hold no cycles; the collector runs again as soon as the last pause ends."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


class Result:
    """Mixin for analysis result (and params) dataclasses."""

    def to_dict(self) -> dict:
        return to_jsonable(self)

    @classmethod
    def from_dict(cls: type[T], data: dict) -> T:
        with gc_paused():
            return _from_dict(cls, data)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls: type[T], text: str) -> T:
        return cls.from_dict(json.loads(text))


def rows_to_csv(rows: Iterable[dict]) -> str:
    """Rows as CSV text: columns in first-seen order, lists and dicts as JSON, formula-like text quoted."""
    rows = [to_jsonable(r) for r in rows]
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv_cell(v) for k, v in row.items()})
    return buf.getvalue()


def _csv_cell(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    # Spreadsheet formula injection: a cell starting with these is treated as a formula.
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@") and not _is_number(value):
        return "'" + value
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False

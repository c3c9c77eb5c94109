"""Typed results that travel: dataclasses that round-trip through JSON.

Every analysis returns a dataclass that inherits `Result`. `to_dict()` gives plain JSON types
(tensors and numpy arrays become nested lists), `from_dict()` rebuilds nested dataclasses from
the field type hints, so the page, the export, the saved-analysis store and the CLI all share
one representation.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T", bound="Result")


def to_jsonable(value: Any) -> Any:
    """Convert a value to plain JSON types (dict, list, str, int, float, bool, None)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
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


def _build(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _build(arg, value)
            except (TypeError, ValueError, KeyError):
                continue
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _from_dict(tp, value)
    if origin in (list, typing.List) and args:
        return [_build(args[0], v) for v in value]
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in value)
        return tuple(_build(a, v) for a, v in zip(args, value))
    if origin in (dict, typing.Dict) and len(args) == 2:
        key_type = args[0] if args[0] in (int, float) else (lambda k: k)
        return {key_type(k): _build(args[1], v) for k, v in value.items()}
    return value


@functools.lru_cache(maxsize=None)
def _field_types(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, resolved type hint) of each field of a dataclass. Resolving string annotations is most of
    the cost of rebuilding a result (a feature store has thousands of nested dataclasses), so it is
    done once per class."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints.get(f.name, Any)) for f in dataclasses.fields(cls))


def _from_dict(cls: type, data: dict) -> Any:
    kwargs = {name: _build(tp, data[name]) for name, tp in _field_types(cls) if name in data}
    return cls(**kwargs)


class Result:
    """Mixin for analysis result (and params) dataclasses."""

    def to_dict(self) -> dict:
        return to_jsonable(self)

    @classmethod
    def from_dict(cls: type[T], data: dict) -> T:
        return _from_dict(cls, data)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls: type[T], text: str) -> T:
        return cls.from_dict(json.loads(text))

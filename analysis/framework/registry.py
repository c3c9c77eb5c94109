"""One registry for every family of methods (eviction policies, defences, proposal orders,
caption agents, SAE types, tasks).

A method is a small dataclass: its class attributes `name` (stable: it appears in URLs and saved
analyses), `label` and `colour` describe it, its fields are its settings, and `validate()` checks
them in one place with a message meant for the user. Adding a method is one decorated class:

    POLICIES = Registry("eviction policy")

    @POLICIES.register
    @dataclass
    class MyPolicy(Method):
        name: ClassVar[str] = "mine"
        label: ClassVar[str] = "My policy"
        budget: int = 64

        def validate(self) -> None:
            check_range("budget", self.budget, low=1)
"""
from __future__ import annotations

import math
from typing import ClassVar, Generic, Iterator, TypeVar

from analysis.framework.errors import SettingsError, UnknownMethod  # noqa: F401  (re-exported: the methods raise them)
from analysis.framework.settings import check_settings, labelled

T = TypeVar("T")


def check_range(what: str, value, low=None, high=None, integer: bool = False) -> None:
    """Raise SettingsError unless low <= value <= high (finite, and whole when `integer`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingsError(f"{what} must be a number, got {value!r}.")
    if not math.isfinite(value):
        raise SettingsError(f"{what} must be finite, got {value}.")
    if integer and int(value) != value:
        raise SettingsError(f"{what} must be a whole number, got {value}.")
    if low is not None and value < low:
        raise SettingsError(f"{what} must be at least {low}, got {value}.")
    if high is not None and value > high:
        raise SettingsError(f"{what} must be at most {high}, got {value}.")


class Method:
    """Base of every registered method: identity in class attributes, settings in dataclass fields."""

    name: ClassVar[str]
    label: ClassVar[str]
    colour: ClassVar[str] = "#888888"
    summary: ClassVar[str] = ""

    def validate(self) -> None:
        """Cross-field checks, with a user-facing message (each labelled field's own range and choices
        are checked first, from its metadata: analysis/framework/settings.py)."""

    def __post_init__(self) -> None:
        check_settings(self)
        self.validate()


class Registry(Generic[T]):
    """Classes of one family, looked up by their stable `name`, in registration order."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._classes: dict[str, type[T]] = {}

    def register(self, cls: type[T]) -> type[T]:
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{cls.__name__} needs a non-empty class attribute `name` to register as a {self.family}.")
        if not isinstance(getattr(cls, "label", None), str):
            raise TypeError(f"{cls.__name__} needs a class attribute `label` to register as a {self.family}.")
        known = self._classes.get(name)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise ValueError(f"{self.family} name '{name}' is taken by {known.__name__}.")
        self._classes[name] = cls
        return cls

    def unregister(self, name: str) -> None:
        self._classes.pop(name, None)

    def get(self, name: str) -> type[T]:
        try:
            return self._classes[name]
        except (KeyError, TypeError):
            raise UnknownMethod(f"Unknown {self.family} '{name}' (choose one of {', '.join(self._classes)}).") from None

    def create(self, name: str, **settings) -> T:
        """An instance of `name` with these settings (unknown settings are ignored), validated."""
        import dataclasses

        cls = self.get(name)
        if dataclasses.is_dataclass(cls):
            fields = {f.name for f in dataclasses.fields(cls) if f.init}
            settings = {k: v for k, v in settings.items() if k in fields}
        return cls(**settings)

    def names(self) -> list[str]:
        return list(self._classes)

    def labels(self) -> dict[str, str]:
        return {name: cls.label for name, cls in self._classes.items()}

    def colours(self) -> dict[str, str]:
        return {name: getattr(cls, "colour", "#888888") for name, cls in self._classes.items()}

    def label(self, name: str) -> str:
        cls = self._classes.get(name)
        return cls.label if cls is not None else str(name)

    def colour(self, name: str) -> str:
        cls = self._classes.get(name)
        return getattr(cls, "colour", "#888888") if cls is not None else "#888888"

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._classes))

    def __len__(self) -> int:
        return len(self._classes)

    def settings(self) -> list[tuple]:
        """(field, class) of every labelled setting of the family, each field name once (the first class
        that declares it): one widget, URL value and flag serves every method that has the setting."""
        seen: dict[str, tuple] = {}
        for cls in self._classes.values():
            for f in labelled(cls):
                seen.setdefault(f.name, (f, cls))
        return list(seen.values())

    def split_settings(self, **flat) -> dict[str, dict]:
        """{method name: its settings} from settings named by field (`sinks=4, snap_window=8`): each goes to
        every method of the family that declares a labelled field of that name; a name none declares is
        refused (SettingsError)."""
        out: dict[str, dict] = {}
        used: set[str] = set()
        for name, cls in self._classes.items():
            chosen = {f.name: flat[f.name] for f in labelled(cls) if f.name in flat}
            used |= set(chosen)
            if chosen:
                out[name] = chosen
        unknown = set(flat) - used
        if unknown:
            raise SettingsError(f"No {self.family} has the setting(s) {', '.join(sorted(unknown))}.")
        return out

    def items(self):
        return list(self._classes.items())

    def values(self):
        return list(self._classes.values())

    def __getitem__(self, name: str) -> type[T]:
        return self.get(name)

"""Temporary changes to a shared model (hooks, attributes, the attention function), undone in reverse order.

`ModelHandle.patch()` (analysis/model_access/models.py) hands one out under the model's lock; nothing else
changes a shared model.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from analysis.model_access.model_lock import ModelLock


class Patch:
    """Temporary changes to a model, undone in reverse order by `restore()`.

    A long analysis calls `checkpoint()` between its chunks (a position, a decode step): when other
    users wait for the model, every change is undone, the lock is passed on (first come, first
    served) and, once it is back, the same changes are made again — so the others never see this
    analysis' hooks, and it never holds the model for more than one chunk while they wait."""

    def __init__(self, lock: ModelLock | None = None) -> None:
        self._undo: list[Callable[[], None]] = []
        self._redo: list[Callable[[], None] | None] = []  # how to make each change again (None: cannot)
        self._lock = lock

    def hook(self, module: torch.nn.Module, fn: Callable, *, pre: bool = False, with_kwargs: bool = False) -> None:
        register = module.register_forward_pre_hook if pre else module.register_forward_hook
        handle = register(fn, with_kwargs=with_kwargs)
        self._undo.append(handle.remove)
        self._redo.append(lambda: self.hook(module, fn, pre=pre, with_kwargs=with_kwargs))

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        missing = object()
        old = getattr(obj, name, missing)
        # a value the object only reads from its class (a method such as `forward`) is undone by deleting
        # the instance's copy, not by writing the class's value onto the instance (which left every patched
        # module with its own bound `forward`, seen by the next patch as someone else's)
        from_class = (old is not missing and name not in getattr(obj, "__dict__", {name: None})
                      and getattr(type(obj), name, missing) is not missing
                      and not hasattr(type(getattr(type(obj), name)), "__set__"))
        setattr(obj, name, value)

        def undo() -> None:
            if old is missing or from_class:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
            else:
                setattr(obj, name, old)

        self._undo.append(undo)
        self._redo.append(lambda: self.setattr(obj, name, value))

    def attn_implementation(self, model: torch.nn.Module, name: str) -> None:
        """Switch the attention function of every sub-config of `model` to `name`."""
        configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
        for cfg in configs.values():
            for sub in _all_configs(cfg):
                self.setattr(sub, "_attn_implementation", name)

    def call_on_exit(self, fn: Callable[[], None]) -> None:
        self._undo.append(fn)
        self._redo.append(None)

    def checkpoint(self) -> bool:
        """Between chunks: if others wait for the model, let them have it first. True if it did."""
        lock = self._lock
        if lock is None or not lock.has_waiters() or None in self._redo:
            return False
        redo = list(self._redo)
        self.restore()
        depth = lock.release_all()
        lock.acquire_again(depth)  # behind everyone who was waiting
        for make in redo:
            make()
        return True

    def restore(self) -> None:
        errors = []
        while self._undo:
            self._redo.pop()
            try:
                self._undo.pop()()
            except Exception as exc:  # keep undoing the rest; report the first failure
                errors.append(exc)
        if errors:
            raise errors[0]


def _all_configs(cfg: Any) -> list[Any]:
    out = [cfg]
    for key in ("text_config", "vision_config"):
        sub = getattr(cfg, key, None)
        if sub is not None and sub is not cfg:
            out.append(sub)
    return out

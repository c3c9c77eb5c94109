"""The errors whose message is meant for the user: one base, `UserError`.

A page shows a `UserError` as one `st.error` line (no traceback) and the command line prints it as one
`error: ...` line and exits 1; anything else is our own bug and keeps its traceback. Every panel's own
error is a `SettingsError` (bad settings or input) or a `ModelLoadError` (a model that cannot be loaded
or inspected); neither view nor CLI has to list it.
"""
from __future__ import annotations


class UserError(Exception):
    """Something the user can fix; the message says what, in one line."""


class SettingsError(UserError, ValueError):
    """A setting or an input is out of range or malformed."""


class UnknownMethod(SettingsError):
    """A name that no class of a method family registered (analysis/framework/registry.py)."""


class ModelLoadError(UserError):
    """A model could not be loaded; the message says why, in words for the user."""


class AnatomyError(ModelLoadError, ValueError):
    """A part of the model could not be found (or a layer is out of range); the message names the part
    and the model."""


class ModelRunError(ModelLoadError):
    """The model itself raised while running a step; the message names the model and the step.
    `detail`: what the model said (`anatomy.model_step` names the caller's step with it)."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail


class MissingEstimator(LookupError):
    """An analysis function handed to the runner has no work estimate: a bug of ours (the cost gate
    fails closed: the run then waits for a click instead of starting unasked)."""

"""The panel's error: bad settings or a model it cannot run on; the message is meant for the user."""
from __future__ import annotations

from analysis.framework.errors import SettingsError


class SharpnessError(SettingsError):
    """The analysis cannot run on this input or model; the message is meant for the user."""

from __future__ import annotations

from analysis.framework.errors import SettingsError


class ResidualError(SettingsError):
    """Settings or prompts this model cannot run, or a lens it has none of; the message is for the user."""

"""How a slow computation says how far it is: `progress(fraction, message)`, fraction in [0, 1].

Every analysis, conversion and training loop that takes more than a moment accepts
`progress: Progress | None`; the page's runner passes one that draws a progress bar (components/runs.py),
the zoo's command line one that prints, a test none. Call `silent` where none was given.
"""
from __future__ import annotations

from typing import Callable

Progress = Callable[[float, str], None]


def silent(fraction: float, message: str = "") -> None:
    """A `Progress` that reports nothing."""
    return None

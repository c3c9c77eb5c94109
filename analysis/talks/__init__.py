"""Talks: a sequence of findings for a room, as data.

A talk is one module of this package that defines `TALK`: its name (the link is `?talk=<name>`), a title,
and an ordered list of steps. A step is a preset (its panel's URL path and the preset's name: the preset
holds the model and every setting, so its page link is the step's "explore this"), a title, one plain
sentence of narration (no symbols: the room hears it), and the one number the audience should look at
(a reading, analysis/talks/readings.py, of the result the preset's page shows). The preset's own finding
is the researcher's note under it.

    Talk("kv-cache", "What a small cache forgets", "...", steps=(
        Step("kv-cache", "needle-streaming", "Keep only the newest words", "...", "kv.accuracy"),))

`load(name)` returns a checked talk; every mistake (an unknown panel, preset or reading, an empty
sentence, two talks of one name) is one `TalkError` line naming the talk and the step.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass, field

from analysis.framework import panels
from analysis.framework import presets as P
from analysis.framework.errors import UserError
from analysis.talks.readings import READINGS

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")
NOT_TALKS = {"readings", "own"}  # modules of this package that hold no talk (own: the talks speakers make)


class TalkError(UserError):
    """A talk's data is wrong, or the link names no talk."""


@dataclass(frozen=True)
class Step:
    panel: str  # the page's URL path ("kv-cache")
    preset: str  # the preset's name on that page
    title: str
    narration: str  # one plain sentence: what the room sees and why it matters
    reading: str  # the number to look at (analysis/talks/readings.py)

    def preset_value(self) -> P.Preset:
        return P.get(self.panel, self.preset)


@dataclass(frozen=True)
class Talk:
    name: str  # stable: the link is ?talk=<name>
    title: str
    summary: str  # one plain sentence under the title
    steps: tuple[Step, ...] = field(default_factory=tuple)


def check(talk: Talk) -> Talk:
    """The talk, or a TalkError saying which step is wrong and how."""
    where = f"talk '{talk.name}'"
    if not NAME.match(talk.name or ""):
        raise TalkError(f"{where}: a talk's name is lower-case letters, digits and dashes (at most 48).")
    if not talk.title.strip() or not talk.summary.strip():
        raise TalkError(f"{where}: the title and the summary must not be empty.")
    if not talk.steps:
        raise TalkError(f"{where} has no steps.")
    pages = {a.url_path for a in panels.analyses() if a.page}
    for i, step in enumerate(talk.steps, 1):
        at = f"{where}, step {i} ('{step.title}')"
        if step.panel not in pages:
            raise TalkError(f"{at}: no page '{step.panel}' (pages: {', '.join(sorted(pages))}).")
        if step.preset_value() is None:
            names = ", ".join(p.name for p in P.for_panel(step.panel))
            raise TalkError(f"{at}: the page '{step.panel}' has no preset '{step.preset}' (it has: {names}).")
        if step.reading not in READINGS:
            raise TalkError(f"{at}: no reading '{step.reading}' (readings: {', '.join(READINGS)}).")
        if not step.title.strip():
            raise TalkError(f"{at}: the title must not be empty.")
        text = step.narration.strip()
        if not text or not text.endswith((".", "?", "!")) or re.search(r"[.?!]\s+[A-Z]", text):
            raise TalkError(f"{at}: the narration must be one sentence, ending with a full stop.")
    return talk


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in NOT_TALKS
                  and not m.name.startswith("_"))


def all_talks() -> list[Talk]:
    """Every shipped talk, checked, in name order (a mistake in any one: TalkError)."""
    talks: dict[str, Talk] = {}
    for module in _modules():
        talk = getattr(importlib.import_module(f"{__name__}.{module}"), "TALK", None)
        if not isinstance(talk, Talk):
            raise TalkError(f"analysis/talks/{module}.py defines no TALK = Talk(...).")
        if talk.name in talks:
            raise TalkError(f"Two talks are named '{talk.name}' (analysis/talks/{module}.py and another).")
        talks[talk.name] = check(talk)
    return sorted(talks.values(), key=lambda t: t.name)


def load(name: str) -> Talk:
    """The talk named in a link, or a TalkError listing the talks there are."""
    talks = {t.name: t for t in all_talks()}
    if name not in talks:
        shown = name if NAME.match(name or "") else "that name"
        raise TalkError(f"There is no talk '{shown}' (talks: {', '.join(talks)}).")
    return talks[name]

"""A talk a speaker makes from the gallery: saved analyses in an order, a sentence each, and a title.

It is kept in the store of saved analyses as a row of its own (panel `talk`, its steps in the params, its
maker as the owner), so its id is its link, `?talk=<id>`, on any instance that shares the store:

    talk = check_own(OwnTalk("What the cache forgets", (OwnStep("k3J9...", "KV run", "Watch the needle go."),)))
    OwnTalk.from_row(row.id, row.title, row.params)   # back from the store

A step names its saved analysis by id and keeps the analysis's title as it was when the talk was made, so a
link opened on an instance whose gallery lacks that analysis can still say which step is missing.
This module holds the data and its checks only; the store and the pages are components/own_talk.py's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from analysis.talks import TalkError

PANEL = "talk"  # the store's panel column of a saved talk
TITLE_MAX, SENTENCE_MAX, STEPS_MAX = 200, 400, 30


@dataclass(frozen=True)
class OwnStep:
    analysis: str  # the saved analysis's id
    title: str  # its title when the talk was made
    sentence: str  # the speaker's sentence for the room

    def to_dict(self) -> dict:
        return {"analysis": self.analysis, "title": self.title, "sentence": self.sentence}


@dataclass(frozen=True)
class OwnTalk:
    title: str
    steps: tuple[OwnStep, ...] = field(default_factory=tuple)
    id: str = ""  # the store's id, once saved

    @property
    def name(self) -> str:  # what the link names: ?talk=<id>
        return self.id

    def params(self) -> dict:
        return {"steps": [s.to_dict() for s in self.steps]}

    @classmethod
    def from_row(cls, talk_id: str, title: str, params: dict) -> "OwnTalk":
        """The talk a store row holds; a row not written by `params` (edited by hand) is one TalkError."""
        try:
            steps = tuple(OwnStep(str(s["analysis"]), str(s.get("title", "")), str(s["sentence"]))
                          for s in params["steps"])
        except (KeyError, TypeError) as exc:
            raise TalkError(f"The saved talk '{talk_id}' is damaged (its steps cannot be read).") from exc
        return cls(title, steps, talk_id)


def check_own(talk: OwnTalk) -> OwnTalk:
    """The talk with its texts trimmed, or a TalkError saying what the speaker must change."""
    title = " ".join(talk.title.split())
    if not title:
        raise TalkError("Give the talk a title.")
    if len(title) > TITLE_MAX:
        raise TalkError(f"The title is {len(title)} characters long; at most {TITLE_MAX}.")
    if not talk.steps:
        raise TalkError("Pick at least one saved analysis for the talk.")
    if len(talk.steps) > STEPS_MAX:
        raise TalkError(f"A talk has at most {STEPS_MAX} steps ({len(talk.steps)} picked).")
    steps = []
    for i, step in enumerate(talk.steps, 1):
        sentence = " ".join(step.sentence.split())
        if not sentence:
            raise TalkError(f"Write a sentence for step {i} ({step.title or step.analysis}).")
        if len(sentence) > SENTENCE_MAX:
            raise TalkError(f"The sentence of step {i} is {len(sentence)} characters long; at most {SENTENCE_MAX}.")
        steps.append(OwnStep(step.analysis, step.title, sentence))
    return OwnTalk(title, tuple(steps), talk.id)

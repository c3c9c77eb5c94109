"""The prompts tasks build, as records the panels read (independent of any panel)."""
from __future__ import annotations

from dataclasses import dataclass, field

from analysis.framework.errors import SettingsError
from analysis.framework.results import Result


class TaskError(SettingsError):
    """A task cannot be built for this model or these settings; the message is for the user."""


@dataclass
class KvTask(Result):
    """A prompt for the KV-cache panel. tokens[:prefill_len] is prefilled in one forward; every later token
    is fed one at a time (teacher forcing), so eviction also happens while the rest of the context is read.
    tokens[:context_len] is the context; the questions and answers follow it."""

    tokens: list[int]
    prefill_len: int
    context_len: int
    answer_positions: list[int] = field(default_factory=list)  # tokens scored for retrieval accuracy
    needle_positions: list[list[int]] = field(default_factory=list)  # per answer: its key and value positions
    source: str = "key-value recall"


def with_questions(context: list[int], questions: list[tuple[list[int], int, list[int]]], prefill: float,
                   source: str) -> KvTask:
    """The context followed by each (asking tokens, answer token, needle positions)."""
    tokens, answers, needles = list(context), [], []
    for ask, answer, needle in questions:
        tokens += [*ask, answer]
        answers.append(len(tokens) - 1)
        needles.append(list(needle))
    prefill_len = max(1, min(len(context), round(prefill * len(context))))
    return KvTask(tokens=tokens, prefill_len=prefill_len, context_len=len(context), answer_positions=answers,
                  needle_positions=needles, source=source)

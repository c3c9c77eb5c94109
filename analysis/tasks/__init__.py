"""Tasks for this model: which prompts each panel builds, decided once, by the model's tokenizer.

A panel asks `tasks_for(handle)` instead of checking whether it holds a demo-zoo model. A tokenizer
that speaks Shapes World (every word of its vocabulary, one token per word) gets the tasks the zoo
models were trained on, whose ground truth is known (`shapes_world.py`); any other model gets generic
tasks (`generic.py`). Adding a task family is one `Tasks` subclass and one line in `tasks_for`.
"""
from __future__ import annotations

from typing import Any

from analysis.tasks.generic import PLAIN_PROMPT, Tasks, synthetic_kv_task  # noqa: F401  (the package's face)
from analysis.tasks.records import KvTask, TaskError, with_questions  # noqa: F401
from analysis.tasks.shapes_world import (  # noqa: F401
    SHAPES_PROMPT, ShapesWorldTasks, shapes_kv_task, speaks_shapes_world,
)


def tasks_for(handle_or_tokenizer: Any) -> Tasks:
    """The tasks for this model (a `ModelHandle`, or a tokenizer)."""
    tok = getattr(handle_or_tokenizer, "tokenizer", handle_or_tokenizer)
    return ShapesWorldTasks() if speaks_shapes_world(tok) else Tasks()

"""Shapes World tasks: the formats the demo models were trained on, with the world's known ground truth."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from analysis.tasks.generic import Tasks
from analysis.tasks.records import KvTask, TaskError, with_questions
from analysis.tasks.retrieval import shapes_world_builder

SHAPES_PROMPT = "there is a large red circle at the top left . there is a small blue square at the bottom right ."


def world():
    """analysis.world.shapes_world, or None where the zoo is not installed (real models work without it)."""
    try:
        from analysis.world import shapes_world
    except ImportError:
        return None
    return shapes_world


@dataclass(frozen=True)
class ShapesWorldTasks(Tasks):
    name: str = "shapes-world"
    sae_dataset: str = "shapes"
    reconstruction_prompt: str = SHAPES_PROMPT
    verifier: str = "shapes-vlm"

    @property
    def shapes_world(self) -> bool:
        return True

    def retrieval_builder(self, tokenizer) -> Callable:
        return shapes_world_builder(tokenizer) or super().retrieval_builder(tokenizer)

    def kv_task(self, handle, *, context, pairs, seed, queries, prefill) -> KvTask:
        return shapes_kv_task(handle.tokenizer, context=context, pairs=pairs, seed=seed, queries=queries,
                              prefill=prefill)

    def long_response_task(self, handle, *, seed: int, max_new: int):
        from analysis.tasks.long_response import shapes_decomposition

        return shapes_decomposition(handle.tokenizer, seed, max_new)

    def caption_prompt(self, handle) -> str | None:
        return world().VLM_CAPTION_PROMPT if handle.kind == "vlm" else None


def speaks_shapes_world(tokenizer) -> bool:
    """True when every Shapes World word is one token of this tokenizer (the demo models' tokenizers)."""
    sw = world()
    if sw is None or tokenizer is None or not hasattr(tokenizer, "get_vocab"):
        return False
    vocab = tokenizer.get_vocab()
    if not all(w in vocab for w in sw.VOCAB):
        return False
    sentence = "there is a large red circle at the top left ."
    try:
        return tokenizer(sentence, add_special_tokens=False)["input_ids"] == [vocab[w] for w in sentence.split()]
    except Exception:  # a tokenizer that cannot encode plain text: not Shapes World's
        return False


def shapes_kv_task(tokenizer, *, context: int, pairs: int, seed: int, queries: int = 1,
                   prefill: float = 0.5) -> KvTask:
    """Shapes World's multi-needle prompt (`needle_example`, the format shapes-lm was trained on):
    "<s> needle : f3 k2 41 f9 ... query k2 = 41". With queries > 1 further needles are asked in turn
    ("... = 41 query k0 = 7"), which is beyond the training format."""
    sw = world()
    rng = random.Random(seed)
    try:
        prompt, _, _ = sw.needle_example(rng, context, max(1, min(pairs, len(sw.KEYS))))
    except ValueError as exc:
        raise TaskError(f"Cannot build the key-value prompt: {exc}.") from exc
    words = prompt.split()
    asked, body = words[-2], words[:-3]
    needles = {w: (i, i + 1) for i, w in enumerate(body[:-1]) if w in sw.KEYS}
    order = ([asked] + [k for k in needles if k != asked])[:max(1, queries)]
    ids = tokenizer(" ".join(body + ["query", "="] + [body[needles[k][1]] for k in order]),
                    add_special_tokens=False)["input_ids"]
    if len(ids) != len(body) + 2 + len(order):
        raise TaskError("This tokenizer does not map Shapes World words to single tokens.")
    ctx, query_id, eq_id = ids[:len(body)], ids[len(body)], ids[len(body) + 1]
    questions = [([query_id, ctx[needles[k][0]], eq_id], ctx[needles[k][1]], needles[k]) for k in order]
    return with_questions(ctx, questions, prefill, "Shapes World key-value recall")

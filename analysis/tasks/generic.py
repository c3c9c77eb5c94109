"""Generic tasks: prompts that work on any vocabulary (a model not trained on them scores near chance)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from analysis.tasks.records import KvTask, TaskError, with_questions
from analysis.tasks.retrieval import generic_builder

PLAIN_PROMPT = "My password is hunter2 and my PIN is 4921"


@dataclass(frozen=True)
class Tasks:
    """The tasks a panel builds for a model; this base is the generic family. Adding a family is one
    subclass (e.g. `ShapesWorldTasks`) and one line in `tasks_for`."""

    name: str = "generic"
    sae_dataset: str = "scenes"  # SAE-V pairs: Shapes World scenes with English captions (real corrupted pairs)
    reconstruction_prompt: str = PLAIN_PROMPT  # the inversion panel's default prompt
    verifier: str = "vlm-yesno"  # caption correction: a yes/no question through the chat template

    @property
    def shapes_world(self) -> bool:
        return False

    def retrieval_builder(self, tokenizer) -> Callable:
        """`build(n, seed)` -> a prompt that asks for one item among n (the sharpness panel): key-value recall
        where the tokenizer spells English, else max retrieval over numbers or the tokenizer's words."""
        return generic_builder(tokenizer)

    def kv_task(self, handle, *, context: int, pairs: int, seed: int, queries: int, prefill: float) -> KvTask:
        """The KV-cache panel's recall prompt: facts in English filler text asked through the chat template
        (analysis/tasks/kv_recall.py), or random key/value tokens for a tokenizer that cannot spell English."""
        from analysis.tasks.kv_recall import recall_task, speaks_english

        if speaks_english(handle.tokenizer):
            return recall_task(handle.tokenizer, context=context, pairs=pairs, seed=seed, queries=queries,
                               prefill=prefill)
        return synthetic_kv_task(handle.tokenizer, handle.info.vocab_size, context=context, pairs=pairs,
                                 seed=seed, queries=queries, prefill=prefill)

    def long_response_task(self, handle, *, seed: int, max_new: int):
        """The KV panel's long-response task: a list stated in the prompt and asked back (a tokenizer that cannot
        spell English: random tokens, no ground truth)."""
        from analysis.tasks.kv_recall import speaks_english
        from analysis.tasks.long_response import generic_list, synthetic_prompt

        if speaks_english(handle.tokenizer):
            return generic_list(handle.tokenizer, seed, max_new)
        return synthetic_prompt(plain_ids(handle.tokenizer, handle.info.vocab_size), seed, max_new)

    def caption_prompt(self, handle) -> str | None:
        """The captioning prompt (None: the caption panel's generic one through the chat template)."""
        return None


def plain_ids(tokenizer, vocab_size: int) -> list[int]:
    """Every token id of the vocabulary that is not a special token."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return [i for i in range(min(vocab_size, len(tokenizer))) if i not in special]


def synthetic_kv_task(tokenizer, vocab_size: int, *, context: int, pairs: int, seed: int, queries: int | None = None,
                      prefill: float = 0.5) -> KvTask:
    """Filler tokens with `pairs` key/value token pairs scattered in them, then `queries` keys asked
    ("key" -> value). Any vocabulary works; a model not trained on this format scores near chance."""
    rng = random.Random(seed)
    ids = plain_ids(tokenizer, vocab_size)
    if len(ids) < 3 * pairs + 4:
        raise TaskError("The vocabulary is too small for the key-value task.")
    rng.shuffle(ids)
    keys, values, filler = ids[:pairs], ids[pairs:2 * pairs], ids[2 * pairs:]
    body = [rng.choice(filler) for _ in range(max(context - 2 * pairs, pairs))]
    slots = sorted(rng.sample(range(len(body)), pairs))
    ctx, where = [], {}
    for i, tok in enumerate(body):
        ctx.append(tok)
        if i in slots:
            j = slots.index(i)
            where[j] = (len(ctx), len(ctx) + 1)
            ctx += [keys[j], values[j]]
    asked = rng.sample(range(pairs), min(pairs, queries or pairs))
    return with_questions(ctx, [([keys[j]], values[j], where[j]) for j in asked], prefill,
                          "synthetic key-value recall")

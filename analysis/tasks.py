"""Tasks for this model: which prompts each panel builds, decided once, by the model's tokenizer.

A panel asks `tasks_for(handle)` instead of checking whether it holds a demo-zoo model. A tokenizer
that speaks Shapes World (every word of its vocabulary, one token per word) gets the tasks the zoo
models were trained on, whose ground truth is known; any other model gets generic text tasks that
work on every vocabulary (numbers or vocabulary words, random key-value pairs, random captions).
Adding a task family is one class with the same methods and one line in `tasks_for`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

PLAIN_PROMPT = "My password is hunter2 and my PIN is 4921"
SHAPES_PROMPT = "there is a large red circle at the top left . there is a small blue square at the bottom right ."


def _shapes_world():
    try:
        from analysis.zoo import shapes_world
    except ImportError:  # the zoo is optional: real models work without it
        return None
    return shapes_world


def speaks_shapes_world(tokenizer: Any) -> bool:
    """True when every Shapes World word is one token of this tokenizer (the demo models' tokenizers)."""
    sw = _shapes_world()
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


@dataclass(frozen=True)
class Tasks:
    """Generic text tasks: work on any vocabulary; a model not trained on them scores near chance."""

    name: str = "generic"
    sae_dataset: str = "noise"  # SAE-V pairs: random blocks and vocabulary words
    reconstruction_prompt: str = PLAIN_PROMPT  # the inversion panel's default prompt
    verifier: str = "vlm-yesno"  # caption correction: a yes/no question through the chat template

    @property
    def shapes_world(self) -> bool:
        return False

    def retrieval_builder(self, tokenizer) -> Callable:
        """`build(n, seed)` -> a max-retrieval prompt with n items (the sharpness panel)."""
        from analysis import sharpness

        return sharpness._generic_builder(tokenizer, sharpness.item_format(tokenizer))

    def kv_task(self, handle, *, context: int, pairs: int, seed: int, queries: int, prefill: float):
        """The key-value recall prompt of the KV-cache panel."""
        from analysis import kv_eviction

        return kv_eviction.synthetic_kv_task(handle.tokenizer, handle.info.vocab_size, context=context, pairs=pairs,
                                             seed=seed, queries=queries, prefill=prefill)

    def caption_prompt(self, handle) -> str | None:
        """The captioning prompt (None: the caption panel's generic one through the chat template)."""
        return None


@dataclass(frozen=True)
class ShapesWorldTasks(Tasks):
    """The formats the demo models were trained on, with Shapes World's known ground truth."""

    name: str = "shapes-world"
    sae_dataset: str = "shapes"
    reconstruction_prompt: str = SHAPES_PROMPT
    verifier: str = "shapes-vlm"

    @property
    def shapes_world(self) -> bool:
        return True

    def retrieval_builder(self, tokenizer) -> Callable:
        from analysis import sharpness

        return sharpness._zoo_builder(tokenizer) or super().retrieval_builder(tokenizer)

    def kv_task(self, handle, *, context, pairs, seed, queries, prefill):
        from analysis import kv_eviction

        return kv_eviction.shapes_kv_task(handle.tokenizer, context=context, pairs=pairs, seed=seed,
                                          queries=queries, prefill=prefill)

    def caption_prompt(self, handle) -> str | None:
        return _shapes_world().VLM_CAPTION_PROMPT if handle.kind == "vlm" else None


def tasks_for(handle_or_tokenizer: Any) -> Tasks:
    """The tasks for this model (a `ModelHandle`, or a tokenizer)."""
    tok = getattr(handle_or_tokenizer, "tokenizer", handle_or_tokenizer)
    return ShapesWorldTasks() if speaks_shapes_world(tok) else Tasks()

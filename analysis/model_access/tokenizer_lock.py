"""One fast tokenizer shared by every session's runs, made safe to call from several threads at once.

A Hugging Face fast tokenizer keeps truncation and padding in its Rust backend, and transformers writes each
call's settings there before encoding (`set_truncation_and_padding`, then `encode_batch`): passing them per call
is not enough. Two runs on one model, one padding a batch and one not, interleave those two steps and one of
them encodes with the other's settings ("Unable to create tensor, you should probably activate truncation
and/or padding"; two SAE-V builds at once failed 2 of 4 times, #50). `guard(tokenizer)` makes the step
that sets and uses the backend's state one critical section per tokenizer; a processor calls the same object
(its `.tokenizer`), so it is covered too. Encoding is short next to a model's forward; nothing else waits.
"""
from __future__ import annotations

import functools
import threading
from typing import Any

_GUARDED = "_mi_encode_lock"


def guard(*tokenizers: Any) -> None:
    """Serialize each tokenizer's encoding step (idempotent; a slow tokenizer, None or a stand-in is left as is)."""
    for tokenizer in tokenizers:
        _guard(tokenizer)


def _guard(tokenizer: Any) -> Any:
    if tokenizer is None or getattr(tokenizer, _GUARDED, None) is not None:
        return tokenizer
    encode = getattr(tokenizer, "_encode_plus", None)
    if encode is None or not hasattr(tokenizer, "set_truncation_and_padding"):
        return tokenizer  # no backend state written per call
    lock = threading.RLock()

    @functools.wraps(encode)
    def encode_plus(*args, **kwargs):
        with lock:
            return encode(*args, **kwargs)

    tokenizer._encode_plus = encode_plus  # this instance only: the class and other tokenizers are untouched
    setattr(tokenizer, _GUARDED, lock)
    return tokenizer

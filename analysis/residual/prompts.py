"""Prompts as the model reads them, the scored tokens, and the pair a run uses."""
from __future__ import annotations

import torch

from analysis.model_access.models import ModelHandle
from analysis.residual.errors import ResidualError
from analysis.residual.pairs import OWN, Pair, find, pairs_for
from analysis.residual.params import ResidualParams
from analysis.tasks.retrieval import encode, leading_specials


def prompt_ids(tokenizer, text: str) -> list[int]:
    """The prompt's tokens as the model reads them (its BOS first, if the tokenizer adds one)."""
    return leading_specials(tokenizer) + encode(tokenizer, text)


def token_id(tokenizer, text: str, what: str) -> int:
    """The first token of `text` as it would follow a prompt (a space-led word where the vocabulary has
    one, else the bare text)."""
    stripped = text.strip()
    if not stripped:
        raise ResidualError(f"The {what} is empty.")
    for variant in (" " + stripped, stripped):
        ids = encode(tokenizer, variant)
        if ids and ids[0] != getattr(tokenizer, "unk_token_id", None):
            return ids[0]
    raise ResidualError(f"The {what} '{stripped}' is not in the model's vocabulary.")


def show(tokenizer, ids: list[int]) -> list[str]:
    """Each token as text (spaces visible as they decode)."""
    return [tokenizer.decode([i]) for i in ids]


def chosen_pair(handle: ModelHandle, params: ResidualParams) -> Pair:
    """The pair the settings name: an offered one, or the user's own two prompts."""
    if params.pair == OWN:
        return Pair(OWN, params.prompt, params.corrupt, params.answer, params.foil, "")
    if not params.pair:
        return pairs_for(handle)[0]
    found = find(handle, params.pair)
    if found is None:
        raise ResidualError(f"The pair '{params.pair}' is not offered for {handle.spec.label} (its pairs: "
                            f"{', '.join(p.name for p in pairs_for(handle))}).")
    return found


def encoded(handle: ModelHandle, text: str, what: str) -> torch.Tensor:
    ids = prompt_ids(handle.tokenizer, text)
    limit = handle.info.max_positions or 4096
    if len(ids) < 1 or not text.strip():
        raise ResidualError(f"The {what} is empty.")
    if len(ids) > limit:
        raise ResidualError(f"The {what} has {len(ids)} tokens, more than the model's {limit} positions.")
    return torch.tensor([ids])


def scored(handle: ModelHandle, text: str, default_logits: torch.Tensor | None, what: str) -> int:
    """The id of the scored token: `text`'s first token, or the top token of `default_logits` when empty."""
    if text.strip():
        return token_id(handle.tokenizer, text, what)
    if default_logits is None:
        raise ResidualError(f"Name the {what}.")
    return int(default_logits.argmax())

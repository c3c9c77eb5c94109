"""Branching generations: at any generated token, take another of the model's top tokens and let the model go on
from there with the same settings (greedy, or sampled from the same seed), beside the main continuation.

The branch is `prompt + main[:at] + chosen`, continued for the rest of the generation's token budget by the
same decoding as the main text (a sampled branch draws from the seed afresh, so it is what a plain seeded
`generate` on that text gives). Each continuation's probability from the branch point is the product of the
model's own probabilities (temperature 1) of its tokens, read from one plain forward over the whole text in
float64, so the two are comparable whatever the decoding; the first position where they differ is marked
(choosing the token the main text has gives the main text again when greedy).
"""
from __future__ import annotations

import math

import torch

from analysis import backends
from analysis.framework.errors import SettingsError
from analysis.framework.progress import Progress
from analysis.model_access import anatomy
from analysis.model_access.models import ModelHandle, require_kind
from analysis.residual.errors import ResidualError
from analysis.residual.generation import decode, end_ids
from analysis.residual.params import ResidualParams, validate_params
from analysis.residual.prompts import chosen_pair, encoded, show
from analysis.residual.records import Branch


def vocabulary_size(handle: ModelHandle) -> int:
    return int(anatomy.unembedding(handle.language_model).weight.shape[0])


def check_branch(handle: ModelHandle, at: int, token: int, generated: int) -> None:
    """A branch point inside the generated text and a token of the model's vocabulary (SettingsError)."""
    if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < generated:
        raise SettingsError(f"Branch at generated token must be a position in 0..{generated - 1} (the text has "
                            f"{generated} generated tokens), got {at!r}.")
    size = vocabulary_size(handle)
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < size:
        raise SettingsError(f"Branch token must be a token id in 0..{size - 1} ({handle.spec.label}'s vocabulary), "
                            f"got {token!r}.")


def branch(handle: ModelHandle, params: ResidualParams, progress: Progress | None = None, *, at: int, token: int,
           main: tuple[int, ...]) -> Branch:
    """The clean prompt continued by `main[:at]`, then `token` instead of `main[at]`, then the model's own
    continuation for the rest of the `params.new_tokens` budget, beside `main` (the generated token ids)."""
    require_kind(handle, "causal_lm", "vlm", panel="residual stream")
    validate_params(params)
    why = backends.local_only(handle, "Branching a generation")
    if why:
        raise ResidualError(why)
    main = [int(t) for t in main]
    check_branch(handle, at, token, len(main))
    prompt = encoded(handle, chosen_pair(handle, params).clean, "prompt")[0].tolist()
    start = prompt + main[:at] + [token]
    room = (handle.info.max_positions or 1 << 30) - len(start)
    n = min(params.new_tokens - at - 1, room)
    eos = end_ids(handle)
    if progress:
        progress(0.0, "regenerating from the branch point")
    rest: list[int] = []
    if n > 0 and token not in eos:
        out, eos = decode(handle, params, torch.tensor([start]), n)
        rest = out.sequences[0, len(start):].tolist()
    ids = [token] + rest
    if progress:
        progress(0.8, "scoring both continuations")
    main_prob = token_probs(handle, prompt + main, len(prompt) + at)
    prob = token_probs(handle, start[:-1] + ids, len(start) - 1)
    first = next((k for k, (a, b) in enumerate(zip(main[at:], ids)) if a != b), None)
    if first is None and len(main) - at != len(ids):
        first = min(len(main) - at, len(ids))  # one ends where the other goes on
    tok = handle.tokenizer
    if progress:
        progress(1.0, "done")
    return Branch(at=at, token_id=token, token=show(tok, [token])[0], main_ids=main[at:],
                  main_tokens=show(tok, main[at:]), main_prob=main_prob, main_text=tok.decode(main[at:]),
                  ids=ids, tokens=show(tok, ids), prob=prob, text=tok.decode(ids),
                  ended=bool(ids) and ids[-1] in eos, first_difference=first,
                  main_path_prob=_product(main_prob), path_prob=_product(prob))


def token_probs(handle: ModelHandle, ids: list[int], start: int) -> list[float]:
    """The model's P (temperature 1, softmax in float64) of each token of `ids` from `start` on, given all
    before it: one plain forward."""
    if start >= len(ids):
        return []
    lm = handle.language_model
    with handle.session(), anatomy.model_step(handle, "scoring the continuations"):
        logits = lm(input_ids=torch.tensor([ids], device=handle.device)).logits[0, start - 1:-1]
    logp = torch.log_softmax(logits.double(), -1).cpu()
    return logp.gather(1, torch.tensor(ids[start:])[:, None])[:, 0].exp().tolist()


def _product(probs: list[float]) -> float:
    return math.exp(sum(math.log(p) if p > 0 else -math.inf for p in probs))

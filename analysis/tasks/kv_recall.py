"""The KV panel's recall task for real language models: facts stated in plain filler text, then asked,
through the model's chat template where it has one, so the full cache answers and accuracy means
something (issue 31).

    <chat template: user turn> ... The river was calm after the long rain. Anna lives in Paris. A small
    boat drifted slowly across the lake. ... Ben lives in Rome. ...

    Where do Anna and Ben live? <end of turn> <assistant turn> Anna lives in| Paris|. Ben lives in| Rome|.

The scored tokens are the cities after "<Name> lives in" in the assistant's answer (teacher-forced, as
the retrieval table does); the needles are the tokens of each fact. Every piece is tokenised on its own
(each begins with a space or a newline), so the needles' token positions are exact. A tokenizer that
cannot spell the English words (a word-level test vocabulary) gets the synthetic token task instead.
"""
from __future__ import annotations

import random

from analysis.tasks.long_response import CITIES, PEOPLE
from analysis.tasks.records import KvTask, TaskError

FILLER = (
    "The weather was mild and the streets were quiet.", "A small boat drifted slowly across the lake.",
    "Children played in the park until the sun went down.", "The library opened early on Saturday mornings.",
    "An old clock ticked on the wall of the kitchen.", "The train to the city left every hour.",
    "Fresh bread was sold at the corner bakery.", "The garden was full of tall green plants.",
    "A gentle wind moved the leaves of the trees.", "The museum had a new room of paintings.",
    "People waited patiently at the bus stop.", "The river was calm after the long rain.",
    "A cat slept in the sun on the window sill.", "The market was busy on the first day of spring.",
    "Someone was playing the piano in the next room.", "The road wound slowly up the green hill.",
)
SOURCE = "natural-language recall (people and their cities in filler text)"


def speaks_english(tokenizer) -> bool:
    """True when the tokenizer spells the task's words (no unknown tokens, decoding gives the text back)."""
    text = f" {PEOPLE[0]} lives in {CITIES[0]}. {FILLER[0]}"
    try:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        unk = getattr(tokenizer, "unk_token_id", None)
        return bool(ids) and unk not in ids and tokenizer.decode(ids).strip() == text.strip()
    except Exception:  # a tokenizer that cannot encode plain text
        return False


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _turns(tokenizer) -> tuple[str, str]:
    """The chat template's text before the user's message and between it and the assistant's answer."""
    marker = "\x00MESSAGE\x00"
    if getattr(tokenizer, "chat_template", None):
        try:
            full = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                                 add_generation_prompt=True)
            before, after = full.split(marker)
            return before, after
        except Exception:  # a template that needs more than one user message: plain text below
            pass
    return "", "\n\nAnswer: "


def recall_task(tokenizer, *, context: int, pairs: int, seed: int, queries: int, prefill: float) -> KvTask:
    """`pairs` facts in about `context` tokens of filler; the first `queries` of them (in random order) asked."""
    if pairs > len(PEOPLE):
        raise TaskError(f"The recall task has {len(PEOPLE)} people; ask for at most that many needles.")
    rng = random.Random(seed)
    names, cities = rng.sample(PEOPLE, pairs), rng.sample(CITIES, pairs)
    before, after = _turns(tokenizer)
    tokens = _ids(tokenizer, before) if before else [*([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else [])]
    intro = _ids(tokenizer, "Read the notes, then answer the question.\n\n")
    facts = [_ids(tokenizer, f" {n} lives in {c}.") for n, c in zip(names, cities)]
    filler = []
    budget = context - len(tokens) - len(intro) - sum(map(len, facts))
    while sum(map(len, filler)) < budget:
        filler.append(_ids(tokenizer, " " + rng.choice(FILLER)))
    slots = sorted(rng.sample(range(len(filler) + 1), pairs)) if filler else [0] * pairs
    tokens += intro
    needles: dict[int, list[int]] = {}
    for i in range(len(filler) + 1):
        for j in [j for j, s in enumerate(slots) if s == i]:
            needles[j] = list(range(len(tokens), len(tokens) + len(facts[j])))
            tokens += facts[j]
        if i < len(filler):
            tokens += filler[i]
    context_len = len(tokens)
    asked = rng.sample(range(pairs), min(pairs, max(1, queries)))
    who = " and ".join(names[j] for j in asked)
    question = f"\n\nWhere {'does' if len(asked) == 1 else 'do'} {who} live?"
    tokens += _ids(tokenizer, question) + _ids(tokenizer, after)
    answers, needle_positions = [], []
    for k, j in enumerate(asked):
        tokens += _ids(tokenizer, f"{'' if k == 0 else ' '}{names[j]} lives in")
        city = _ids(tokenizer, f" {cities[j]}")
        answers += list(range(len(tokens), len(tokens) + len(city)))
        needle_positions += [needles[j]] * len(city)
        tokens += city + _ids(tokenizer, ".")
    prefill_len = max(1, min(context_len, round(prefill * context_len)))
    return KvTask(tokens=tokens, prefill_len=prefill_len, context_len=context_len, answer_positions=answers,
                  needle_positions=needle_positions, source=SOURCE)

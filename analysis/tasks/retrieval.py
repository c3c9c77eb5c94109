"""Retrieval prompts for the attention-sharpness panel: one item among n must be selected.

Three families, chosen by the tokenizer (`Tasks.retrieval_builder`):
- Shapes World's max retrieval, exactly the demo LM's training format ("<s> max : 12 7 93 41 =" -> "93");
- key-value recall for any tokenizer that spells English ("The code of pear is 41. The code of plum is 87.
  ... The code of plum is" -> "87"), through the model's chat template where it has one: a trained
  instruct LM can do it (SmolLM2-135M-Instruct: 1.00 / 1.00 / 0.81 / 0.69 at n = 2 / 4 / 8 / 16 on 16
  prompts each, chance 1/n), while max retrieval over numbers stays at chance on it;
- max retrieval over numbers 0-99, or over the tokenizer's own words, for toy tokenizers that cannot spell
  the recall prompt (no model can solve the words' "order", so its accuracy means nothing).

Every prompt knows its answer item's token positions (`target`), so the panel measures the attention
on it; a prompt with `candidates` is scored over them (chance 1/len(candidates)).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from analysis.framework.results import Result
from analysis.tasks.records import TaskError

MAX_RETRIEVAL = "max retrieval"
RECALL = "key-value recall"


@dataclass
class RetrievalPrompt(Result):
    """n items and a request for one of them; `target` are the answer item's token positions."""

    n: int
    text: str
    input_ids: list[int]
    answer_id: int  # first token of the answer
    answer: str
    target: list[int]
    values: list[int]
    format: str  # "shapes-world" | "numbers" | "vocabulary" | "key-value recall"
    runner_up_id: int = -1  # max retrieval: token of the second-largest distinct value (-1: none)
    task: str = MAX_RETRIEVAL  # MAX_RETRIEVAL | RECALL
    # Scored over these answers (token ids after `input_ids`), `candidates[answer_index]` the right one;
    # empty: the first answer token against the whole vocabulary.
    candidates: list[list[int]] = field(default_factory=list)
    answer_index: int = -1
    keys: list[str] = field(default_factory=list)  # recall: the key of each item, in order
    chat: bool = False  # written through the tokenizer's chat template

    @property
    def chance(self) -> float | None:
        return 1.0 / len(self.candidates) if self.candidates else None


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def leading_specials(tokenizer) -> list[int]:
    """Tokens the tokenizer puts before any text (a BOS), so prompts look like its usual input."""
    plain = encode(tokenizer, "a")
    full = list(tokenizer("a")["input_ids"])
    return full[: len(full) - len(plain)] if full[-len(plain):] == plain else []


def _seeded(n: int, seed: int) -> random.Random:
    return random.Random(seed * 1_000_003 + n)


# ---------------------------------------------------------------------------------------------
# Key-value recall (any tokenizer that spells English)

RECALL_KEYS = tuple("""apple pear plum peach lemon lime mango grape melon cherry olive onion carrot potato tomato
bean corn rice cat dog horse cow pig sheep goat mouse bird fish frog bear lion tiger wolf fox duck owl bee ant
car bus boat ship train bike truck plane cup pot pan knife fork spoon plate bowl chair table desk bed lamp door
window wall roof house tree rose leaf stone rock sand snow rain wind fire water milk bread cake egg cheese salt
sugar tea coffee book pen paper letter card map key lock ring bell drum flute piano guitar coin box bag hat shoe
sock coat shirt dress garden river lake hill road bridge tower castle farm forest island beach moon star
cloud sun flag wheel cart nest shell vase""".split())
RECALL_CODES = tuple(range(10, 100))  # two-digit codes: one token on GPT-2, two digits on most newer tokenizers
RECALL_ITEM = "The code of {key} is {value}."
RECALL_QUERY = "The code of {key} is"


def recall_keys(tokenizer) -> tuple[str, ...]:
    """The keys this tokenizer writes as one token each (so every prompt with n items has one length and
    the prompts of one n run in one batch), or every key when fewer than 16 are."""
    single = tuple(k for k in RECALL_KEYS if len(encode(tokenizer, " " + k)) == 1)
    return single if len(single) >= 16 else RECALL_KEYS


def _recall_keys(n: int, pool: tuple[str, ...], rng: random.Random) -> list[str]:
    """n distinct one-word keys (none inside another, so "The code of pear is" names one item)."""
    if n > len(pool):
        raise TaskError(f"The key-value task has {len(pool)} distinct keys for this tokenizer, so at most "
                        f"{len(pool)} items.")
    return rng.sample(pool, n)


def _recall_values(n: int, asked: int, rng: random.Random) -> list[int]:
    """Distinct codes while there are enough; beyond 90 items the others repeat, never the asked one's."""
    if n <= len(RECALL_CODES):
        return rng.sample(RECALL_CODES, n)
    answer = rng.choice(RECALL_CODES)
    others = [c for c in RECALL_CODES if c != answer]
    return [answer if i == asked else rng.choice(others) for i in range(n)]


def _chat_parts(tokenizer) -> tuple[str, str] | None:
    """(text before the user's message, text after it up to the assistant's answer) of the chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    marker = "\x00MESSAGE\x00"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                             add_generation_prompt=True)
    except Exception:  # a template that refuses a lone user turn: plain text instead
        return None
    if not isinstance(text, str) or text.count(marker) != 1:
        return None
    before, after = text.split(marker)
    return before, after


def _span_tokens(tokenizer, text: str, start: int, end: int, ids: list[int]) -> list[int]:
    """Positions in `ids` (the tokens of `text`) of the non-blank tokens covering text[start:end]."""
    # from the token before the value's own text: a tokenizer may write the space with the digits ("Ġ41")
    first, last = len(encode(tokenizer, text[:start].rstrip(" "))), len(encode(tokenizer, text[:end]))
    if encode(tokenizer, text[:end]) != ids[:last]:
        raise TaskError("This tokenizer merges a code with its neighbours; the recall prompt cannot mark it.")
    return [i for i in range(first, last) if tokenizer.decode([ids[i]]).strip()]


def _code_tokens(tokenizer) -> tuple[list[int], dict[int, list[int]]]:
    """(tokens every answer starts with, each code's own tokens after them), read off "The code of apple is
    10" / "... 55" / "... 99": a digit-splitting tokenizer writes the space as its own token, which then
    ends the prompt, so the model's next token is the code's first digit whatever the code."""
    query = RECALL_QUERY.format(key="apple")
    base = encode(tokenizer, query)
    probes = [encode(tokenizer, f"{query} {c}") for c in (10, 55, 99)]
    shared = len(base)
    while all(len(p) > shared + 1 for p in probes) and len({p[shared] for p in probes}) == 1:
        shared += 1
    if any(p[:len(base)] != base for p in probes):
        raise TaskError("This tokenizer merges the answer with the question; the recall prompt cannot be scored.")
    return probes[0][len(base):shared], {c: encode(tokenizer, f"{query} {c}")[shared:] for c in RECALL_CODES}


def recall_builder(tokenizer) -> Callable[[int, int], RetrievalPrompt] | None:
    """`build(n, seed)` for key-value recall, or None when the tokenizer cannot spell the prompt."""
    probe = RECALL_ITEM.format(key="apple", value=41) + " " + RECALL_QUERY.format(key="pear")
    unk = getattr(tokenizer, "unk_token_id", None)
    try:
        ids = encode(tokenizer, probe)
    except Exception:
        return None
    # the text must come back (spaces aside: a word-level tokenizer decodes "41." as "4 1 .")
    if not ids or (unk is not None and unk in ids) or "".join(tokenizer.decode(ids).split()) != "".join(probe.split()):
        return None
    chat = _chat_parts(tokenizer)
    bos = [] if chat else leading_specials(tokenizer)
    try:
        lead, code_ids = _code_tokens(tokenizer)
    except TaskError:
        return None
    pool = recall_keys(tokenizer)

    def build(n: int, seed: int) -> RetrievalPrompt:
        rng = _seeded(n, seed)
        keys = _recall_keys(n, pool, rng)
        asked = rng.randrange(n)
        values = _recall_values(n, asked, rng)
        items = [RECALL_ITEM.format(key=k, value=v) for k, v in zip(keys, values)]
        before, after = chat or ("", " ")
        text = before + " ".join(items) + after + RECALL_QUERY.format(key=keys[asked])
        item_at = len(before) + sum(len(item) + 1 for item in items[:asked])
        value_at = item_at + items[asked].rindex(str(values[asked]))
        codes = sorted(set(values))
        ids = encode(tokenizer, text) + lead
        candidates = [code_ids[c] for c in codes]
        if encode(tokenizer, f"{text} {values[asked]}") != ids + code_ids[values[asked]]:
            raise TaskError("This tokenizer writes the codes differently in context; the recall prompt cannot be scored.")
        target = _span_tokens(tokenizer, text, value_at, value_at + len(str(values[asked])), ids)
        index = codes.index(values[asked])
        return RetrievalPrompt(
            n=n, text=tokenizer.decode(ids), input_ids=bos + ids, answer_id=candidates[index][0],
            answer=str(values[asked]), target=[t + len(bos) for t in target], values=values, format=RECALL,
            task=RECALL, candidates=candidates, answer_index=index, keys=keys, chat=chat is not None,
        )

    return build


# ---------------------------------------------------------------------------------------------
# Max retrieval over numbers or the tokenizer's own words (toy tokenizers)


@dataclass
class ItemFormat:
    """How numbers become tokens for a tokenizer: value k is written `items[k]`."""

    name: str
    items: list[str]  # value -> text piece (with its leading space where the tokenizer needs one)
    prefix: str
    suffix: str
    bos: list[int]


def item_format(tokenizer) -> ItemFormat:
    """Numbers 0-99 as single tokens if the tokenizer has them, else its plain vocabulary words."""
    unk = tokenizer.unk_token_id
    bos = leading_specials(tokenizer)
    numbers = [f" {k}" for k in range(100)]
    ok = all(len(ids := encode(tokenizer, x)) == 1 and ids[0] != unk for x in numbers)
    prefix, suffix = "Numbers:", " The largest number is"
    if ok:
        words_ok = unk is None or unk not in encode(tokenizer, prefix + suffix)
        return ItemFormat("numbers", numbers, prefix if words_ok else "", suffix if words_ok else "", bos)
    special = set(tokenizer.all_special_ids)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    # A vocabulary entry is an item when " " + its text encodes back to it alone; the text comes from
    # decode(), so byte-level BPE entries ("Ġcat" -> " cat") qualify as well as word-level ones.
    pieces = []
    for w, i in vocab:
        if i in special or w.startswith("<"):
            continue
        text = tokenizer.decode([i]).strip()
        if text.isalnum() and encode(tokenizer, " " + text) == [i]:
            pieces.append(" " + text)
    if len(pieces) < 8:
        raise TaskError("Could not find enough single-token items in this tokenizer to build a retrieval prompt.")
    return ItemFormat("vocabulary", pieces[:100], "", "", bos)


def _sample_values(n: int, vmax: int, rng: random.Random) -> list[int]:
    """n values in [0, vmax) with a unique maximum at a random position."""
    top = rng.randrange(max(1, min(n, vmax // 2)), vmax) if vmax > 1 else 0
    values = [rng.randrange(0, top) for _ in range(n - 1)] if top > 0 else [0] * (n - 1)
    values.insert(rng.randrange(n), top)
    return values


def max_retrieval_builder(tokenizer, fmt: ItemFormat) -> Callable[[int, int], RetrievalPrompt]:
    def build(n: int, seed: int) -> RetrievalPrompt:
        rng = _seeded(n, seed)
        values = _sample_values(n, len(fmt.items), rng)
        ids = list(fmt.bos) + (encode(tokenizer, fmt.prefix) if fmt.prefix else [])
        target: list[int] = []
        top = max(values)
        for v in values:
            piece = encode(tokenizer, fmt.items[v])
            if v == top:
                target = list(range(len(ids), len(ids) + len(piece)))
            ids += piece
        if fmt.suffix:
            ids += encode(tokenizer, fmt.suffix)
        answer = fmt.items[top]
        second = [v for v in values if v != top]
        return RetrievalPrompt(
            n=n, text=tokenizer.decode(ids), input_ids=ids, answer_id=encode(tokenizer, answer)[0],
            answer=answer.strip(), target=target, values=values, format=fmt.name,
            runner_up_id=encode(tokenizer, fmt.items[max(second)])[0] if second else -1,
        )

    return build


def generic_builder(tokenizer) -> Callable[[int, int], RetrievalPrompt]:
    """Key-value recall where the tokenizer spells it, else max retrieval over numbers or words."""
    return recall_builder(tokenizer) or max_retrieval_builder(tokenizer, item_format(tokenizer))


# ---------------------------------------------------------------------------------------------
# Shapes World: the demo LM's training format


def shapes_world_builder(tokenizer) -> Callable[[int, int], RetrievalPrompt] | None:
    """The Shapes World training format ("<s> max : 12 7 93 41 =" -> "93") for the zoo's tokenizer."""
    try:
        from analysis.world import shapes_world as sw
    except ImportError:
        return None
    vocab = tokenizer.get_vocab()
    if not hasattr(sw, "max_retrieval_example") or not all(w in vocab for w in (*sw.NUMBERS, "max", sw.BOS)):
        return None

    def build(n: int, seed: int) -> RetrievalPrompt:
        text, answer = sw.max_retrieval_example(_seeded(n, seed), n)
        words = text.split()
        ids = encode(tokenizer, text)
        if len(ids) != len(words):
            raise TaskError("The zoo tokenizer does not map the prompt's words one to one.")
        items = words[words.index(":") + 1: -1]
        first = words.index(":") + 1
        second = [int(w) for w in items if w != answer]
        return RetrievalPrompt(
            n=n, text=text, input_ids=ids, answer_id=encode(tokenizer, answer)[0], answer=answer,
            target=[first + i for i, w in enumerate(items) if w == answer], values=[int(w) for w in items],
            format="shapes-world",
            runner_up_id=encode(tokenizer, str(max(second)))[0] if second else -1,
        )

    return build

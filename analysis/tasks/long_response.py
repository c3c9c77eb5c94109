"""Long-response tasks: a prompt read in one forward, then a long answer the model writes itself, whose
parts can be checked one by one (the KV panel's long-response evaluation; MorphKV's claim is about
such answers).

- Shapes World (`shapes_decomposition`): "<s> decompose : CAPTION =" for a four-object test scene;
  shapes-lm was trained to answer with the caption's 12 atomic claims joined by " ; " (about 84
  tokens), and the grammar's own decomposition (`shapes_world.decompose`) is the ground truth.
- Any instruct model (`generic_list`): a list of eight people and the city each lives in is stated in
  the prompt (through the model's chat template) and asked back, one line per person in the given
  order; each line is checked against the list (in the spirit of LongGenBench's per-item checks).
- A user's own prompt: no ground truth; only agreement with the full cache is measured.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from analysis.framework.results import Result
from analysis.tasks.records import TaskError

PEOPLE = ("Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Hugo", "Iris", "Jack", "Kate", "Liam",
          "Mia", "Noah", "Olga", "Paul")
CITIES = ("Paris", "London", "Madrid", "Berlin", "Rome", "Vienna", "Oslo", "Dublin", "Lisbon", "Prague",
          "Athens", "Warsaw", "Cairo", "Tokyo", "Sydney", "Toronto")
LIST_INSTRUCTION = "Here is where some people live:\n{facts}\n\nRepeat the list above, one line per person."


@dataclass
class LongTask(Result):
    """A prompt read in one forward and what a correct answer contains, item by item, in order."""

    tokens: list[int]  # the prompt
    source: str
    reference: list[str] = field(default_factory=list)  # the items a correct answer lists ([]: no ground truth)
    kind: str = "custom"  # "decomposition" | "list" | "custom": how an answer is split into items
    max_new: int = 96  # generated tokens at most (the text ends earlier at end-of-text)


@dataclass
class Item(Result):
    """One item of a generated answer: its text, the generated position of its last token, and whether
    it is one of the reference items."""

    text: str
    end: int
    correct: bool


def shapes_decomposition(tokenizer, seed: int, max_new: int) -> LongTask:
    """The `seed`-th four-object test scene's caption, to be decomposed into its claims."""
    from analysis.world import shapes_world as sw

    scenes = (s for s in sw.split_seeds("test", 100_000) if len(sw.generate_scene(s).objects) == sw.MAX_OBJECTS)
    scene = sw.generate_scene(next(s for i, s in enumerate(scenes) if i == seed))
    prompt, answer = sw.decompose_example(scene)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if len(ids) != len(prompt.split()):
        raise TaskError("This tokenizer does not map Shapes World words to single tokens.")
    return LongTask(tokens=ids, source="Shapes World caption decomposition (4 objects, 12 claims)",
                    reference=[c.strip() for c in answer.split(";")], kind="decomposition", max_new=max_new)


def generic_list(tokenizer, seed: int, max_new: int, people: int = 8) -> LongTask:
    """`people` lines "- <Name> lives in <City>." through the chat template, asked back one line per person;
    the answer's first line is given, the other `people` - 1 are checked. SmolLM2-135M-Instruct does not
    find the format alone (0 of 6-8 lines without the first line given); with it, it copies 8-person lists
    whole (7 of 7 lines on 3 prompts) but drifts after about five lines of a 12-person list (0.50 of 11)."""
    rng = random.Random(seed)
    names = rng.sample(PEOPLE, people)
    cities = rng.sample(CITIES, people)
    lines = [f"- {n} lives in {c}." for n, c in zip(names, cities)]
    text = LIST_INSTRUCTION.format(facts="\n".join(lines))
    if getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                               add_generation_prompt=True)
    else:
        prompt = text + "\n\n"
    ids = tokenizer(prompt + lines[0] + "\n", add_special_tokens=False)["input_ids"]
    return LongTask(tokens=ids, source=f"list recall ({people} people and their cities, asked back line by line)",
                    reference=[f"{n}: {c}" for n, c in zip(names[1:], cities[1:])], kind="list", max_new=max_new)


def synthetic_prompt(ids: list[int], seed: int, max_new: int, length: int = 32) -> LongTask:
    """Random plain tokens, for a vocabulary that cannot spell the list task: agreement with the full cache only."""
    rng = random.Random(seed)
    return LongTask(tokens=[rng.choice(ids) for _ in range(length)],
                    source="random tokens (no ground truth: agreement with the full cache only)", max_new=max_new)


def custom_prompt(tokenizer, prompt: str, max_new: int) -> LongTask:
    ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    if len(ids) < 2:
        raise TaskError("The prompt is too short: it needs at least two tokens.")
    return LongTask(tokens=ids, source="your prompt (no ground truth: agreement with the full cache only)",
                    max_new=max_new)


# ---------------------------------------------------------------------------------------------
# Checking an answer


def answer_items(task: LongTask, tokenizer, ids: list[int]) -> list[Item]:
    """The items of a generated answer `ids` (end-of-text excluded), each with the generated position of
    its last token, marked against the reference."""
    ends = [len(tokenizer.decode(ids[: i + 1], skip_special_tokens=True)) for i in range(len(ids))]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    reference = {_normal(task.kind, r) for r in task.reference}
    items = []
    for body, stop in _split(task.kind, text):
        norm = _normal(task.kind, body)
        if not norm:
            continue
        end = next((i for i, e in enumerate(ends) if e >= stop), len(ids) - 1)
        items.append(Item(text=norm, end=end, correct=norm in reference))
    return items


def _split(kind: str, text: str) -> list[tuple[str, int]]:
    """(item text, character offset where it ends) for each item of an answer."""
    sep = ";" if kind == "decomposition" else "\n"
    out, start = [], 0
    for m in re.finditer(re.escape(sep), text + sep):
        body = text[start:m.start()]
        out.append((body, start + len(body.rstrip())))  # ends at its last visible character
        start = m.end()
    return out


def _normal(kind: str, text: str) -> str:
    if kind == "decomposition":
        return " ".join(text.replace("</s>", " ").split())
    if kind == "list":
        m = re.match(r"^\W*([A-Z][a-z]+)\W*:?\s*(?:lives in\s+)?([A-Z][a-z]+)", text.strip())
        return f"{m.group(1)}: {m.group(2)}" if m else ""
    return text.strip()


def recalled(task: LongTask, items: list[Item]) -> list[bool]:
    """Per reference item, in order: did the answer contain it?"""
    got = {i.text for i in items if i.correct}
    return [_normal(task.kind, r) in got for r in task.reference]

"""Prompt pairs with known answers for activation patching: a clean prompt, a corrupted one of the same
length, and the answer each should give.

Which pairs a model is offered is asked of the task provider (analysis/tasks): a tokenizer that speaks
Shapes World gets pairs built from the world's tasks, whose answer sits at a known token (the needle's
value, the largest number, the object's colour word); one that spells English gets factual pairs (a
country swapped for another), whose subject is the one changed token; any other, pairs of plain tokens.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from analysis.framework.results import Result

OWN = "own"  # the user's own pair (the prompts typed in)


@dataclass(frozen=True)
class Pair(Result):
    name: str  # stable: appears in URLs
    clean: str
    corrupt: str
    answer: str  # what the clean prompt should continue with (its first token is scored)
    foil: str  # what the corrupted prompt should continue with
    where: str = ""  # where the answer's information enters the prompt, in words

    @property
    def label(self) -> str:
        """Both prompts and answers in full (Shapes World prompts run to hundreds of characters)."""
        return f"{self.clean} → {self.answer}  /  {self.corrupt} → {self.foil}"

    @property
    def short(self) -> str:
        """What a select box can show whole: the name and the two answers."""
        return f"{self.name} (→ {self.answer.strip()} / → {self.foil.strip()})"


# ---------------------------------------------------------------------------------------------
# English factual pairs (any tokenizer that spells English)

CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
            ("Russia", "Moscow"), ("England", "London"), ("China", "Beijing"), ("Greece", "Athens"),
            ("Austria", "Vienna"), ("Ireland", "Dublin"), ("Portugal", "Lisbon"), ("Canada", "Ottawa"),
            ("Kenya", "Nairobi"), ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Cuba", "Havana")]
LANGUAGES = [("France", "French"), ("Germany", "German"), ("Italy", "Italian"), ("Spain", "Spanish"),
             ("Japan", "Japanese"), ("Russia", "Russian")]


def factual_pairs() -> list[Pair]:
    """24 pairs: each capital asked after its country, the corrupted prompt naming the next country of the
    list; the official language likewise; the country asked after its capital."""
    out = []
    for i, (country, city) in enumerate(CAPITALS):
        other, other_city = CAPITALS[(i + 1) % len(CAPITALS)]
        out.append(Pair(f"capital-{country.lower()}", f"The capital of {country} is", f"The capital of {other} is",
                        city, other_city, f"the subject, '{country}'"))
    for i, (country, language) in enumerate(LANGUAGES[:4]):
        other, other_language = LANGUAGES[(i + 1) % len(LANGUAGES)]
        out.append(Pair(f"language-{country.lower()}", f"The official language of {country} is",
                        f"The official language of {other} is", language, other_language,
                        f"the subject, '{country}'"))
    for i, (country, city) in enumerate(CAPITALS[:3]):
        other, other_city = CAPITALS[(i + 1) % len(CAPITALS)]
        out.append(Pair(f"country-{city.lower()}", f"{city} is the capital of", f"{other_city} is the capital of",
                        country, other, f"the subject, '{city}'"))
    return out


# ---------------------------------------------------------------------------------------------
# Shapes World pairs (the demo zoo's language model)

ZOO_SEEDS = 3  # pairs of each kind offered


def _world():
    from analysis.world import shapes_world

    return shapes_world


def needle_pair(seed: int) -> Pair:
    """A needle prompt whose asked value is swapped for another value the same key may hold."""
    sw = _world()
    rng = random.Random(seed)
    prompt, answer, (_, at) = sw.needle_example(rng, 20, 2)
    words = prompt.split()
    foil = next(v for v in rng.sample(sw.key_values(words[at - 1]), 12) if v != answer)
    words[at] = foil
    return Pair(f"needle-{seed}", prompt, " ".join(words), answer, foil, f"the needle's value (token {at})")


def max_pair(seed: int) -> Pair:
    """A max-retrieval prompt whose largest number is lowered below the runner-up: the answer changes (the
    world's max-retrieval format, `<s> max : ... =`)."""
    rng = random.Random(seed)
    items = rng.sample(range(10, 100), 6)
    top = max(items)
    at = items.index(top)
    second = max(x for x in items if x != top)
    low = [x for x in range(second) if x not in items][-1]
    lowered = [low if x == top else x for x in items]
    clean = f"<s> max : {' '.join(map(str, items))} ="
    corrupt = f"<s> max : {' '.join(map(str, lowered))} ="
    return Pair(f"max-{seed}", clean, corrupt, str(top), str(second), f"the largest number (token {3 + at})")


def colour_pair(seed: int) -> Pair:
    """A caption being decomposed, its first object's colour swapped: the first claim names the colour."""
    sw = _world()
    scene = sw.generate_scene(sw.SPLIT_STARTS["test"] + seed)
    words = f"<s> decompose : {sw.caption(scene)} = there is a".split()
    colour = scene.objects[0].colour
    other = sw.COLOURS[(sw.COLOURS.index(colour) + 1) % len(sw.COLOURS)]
    at = words.index(colour)
    corrupt = list(words)
    corrupt[at] = other
    return Pair(f"colour-{seed}", " ".join(words), " ".join(corrupt), colour, other,
                f"the first object's colour word (token {at})")


def shapes_pairs(count: int = ZOO_SEEDS) -> list[Pair]:
    return [make(seed) for seed in range(count) for make in (needle_pair, max_pair, colour_pair)]


# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Token pairs (a tokenizer that spells neither): no known answer, the model's own predictions are scored

TOKEN_PAIRS = 3


def token_pairs(tokenizer) -> list[Pair]:
    """Six plain tokens, the third swapped for another: the answers are the model's top predictions (empty
    answer and foil), so these only show how a change travels, not whether the model knows anything. Pairs
    whose text does not tokenize back to six tokens are left out."""
    from analysis.tasks.generic import plain_ids

    ids = plain_ids(tokenizer, len(tokenizer))
    out = []
    for k in range(TOKEN_PAIRS):
        rng = random.Random(k)
        clean = [rng.choice(ids) for _ in range(6)]
        corrupt = list(clean)
        corrupt[2] = next(i for i in rng.sample(ids, 8) if i != clean[2])
        texts = [tokenizer.decode(x) for x in (clean, corrupt)]
        if all(len(tokenizer(t, add_special_tokens=False)["input_ids"]) == 6 for t in texts):
            out.append(Pair(f"tokens-{k}", texts[0], texts[1], "", "", "the third token"))
    return out


def pairs_for(handle_or_tokenizer) -> list[Pair]:
    """The pairs offered for this model (its task provider decides which family): Shapes World's, English
    factual pairs for a tokenizer that spells English, else token pairs."""
    from analysis.tasks import tasks_for
    from analysis.tasks.kv_recall import speaks_english

    tokenizer = getattr(handle_or_tokenizer, "tokenizer", handle_or_tokenizer)
    if tasks_for(tokenizer).shapes_world:
        return shapes_pairs()
    if speaks_english(tokenizer):
        return factual_pairs()
    return token_pairs(tokenizer) or factual_pairs()


def all_names() -> list[str]:
    """Every offered pair's name, every family, and `own` (a field's choices)."""
    return ([OWN] + [p.name for p in shapes_pairs()] + [p.name for p in factual_pairs()]
            + [f"tokens-{k}" for k in range(TOKEN_PAIRS)])


def find(handle_or_tokenizer, name: str) -> Pair | None:
    return next((p for p in pairs_for(handle_or_tokenizer) if p.name == name), None)

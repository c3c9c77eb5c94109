"""Shapes World: a procedurally generated world whose ground truth is known.

A scene is a 64x64 RGB image with 1-4 objects. Each object has a shape, a colour, a size and a
cell of a 3x3 grid; within a scene the cells are distinct and so are the (colour, shape) pairs, so
"the red circle" always names at most one object. Everything is a pure function of a seed.

Every string below is space-separated words of one word-level vocabulary (`VOCAB`; each word is one
token of the zoo tokenizers), so a prompt's token positions are its word positions.

Caption grammar (`caption`, `decompose`, `rewrite`)
    caption   := sentence { " " sentence }            objects in cell order (reading order)
    sentence  := "there is a " [SIZE " "] COLOUR " " SHAPE [" at the " POSITION] " ."
    full captions always carry size and position; partial sentences appear only in rewrites.
    a rewrite that keeps nothing is "there is nothing ."
    e.g. "there is a large red circle at the top left . there is a small blue square at the center ."

Atomic claims (`scene_facts`, `decompose`, `claim_truth`), three kinds:
    existence  "there is a red circle"
    size       "the red circle is large"
    position   "the red circle is at the top left"
    yes/no question (`question`): "is there a red circle ?" | "is the red circle large ?" |
    "is the red circle at the top left ?"

Language-model tasks (shapes-lm). Each example is (prompt, answer); the model continues the prompt
with the answer's words then "</s>". Prompts start with "<s>" (the BOS token, written out).
    max retrieval   "<s> max : 12 7 93 41 ="                          -> "93"
                    numbers 0-99 are single tokens; trained on n = 4..16 items
    needle          "<s> needle : f3 f17 k2 57 f9 ... f1 query k2 ="  -> "57"
                    filler words f0..f31, marker keys k0..k7 each followed by its value (a number),
                    n_needles distinct keys per context, query one of them at the end. Key k<i> owns
                    the values 12i..12i+11 (`key_values`), so the value can be found by content
                    alone (a 2-layer model learns that fast; binding arbitrary values needs
                    induction heads, which did not train in the CPU budget). The answer is only
                    recoverable while the needle's value token is in the context / KV cache.
    decomposition   "<s> decompose : CAPTION ="                       -> claims joined by " ; "
                    e.g. "there is a red circle ; the red circle is large ; the red circle is at the top left"
    rewrite         "<s> rewrite : CAPTION drop : CLAIM ; CLAIM ="    -> rewrite(CAPTION, kept claims)
                    the dropped claims are the false ones; "drop : none =" when nothing is dropped

Vision-language prompts (shapes-vlm; the processor expands "<image>" to 64 image tokens)
    caption         VLM_CAPTION_PROMPT = "<s> <image> describe :"     -> caption, then "</s>"
    yes/no          vlm_question_prompt(claim) =
                    "<s> <image> question : is there a red circle ? answer :"  -> "yes" | "no"
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle")
COLOURS = ("red", "green", "blue", "yellow")
SIZES = ("small", "large")
POSITIONS = (
    "top left", "top middle", "top right",
    "middle left", "center", "middle right",
    "bottom left", "bottom middle", "bottom right",
)
RGB = {"red": (225, 45, 45), "green": (40, 185, 70), "blue": (55, 95, 235), "yellow": (235, 215, 40)}
BACKGROUND = (24, 24, 24)
MAX_OBJECTS = 4
NUMBERS = tuple(str(i) for i in range(100))
FILLER = tuple(f"f{i}" for i in range(32))
KEYS = tuple(f"k{i}" for i in range(8))
GRAMMAR = ("there", "is", "a", "the", "at", "nothing", ".", "?", ";", ":", "=")
TASK_WORDS = ("max", "needle", "query", "decompose", "rewrite", "drop", "none", "describe", "question",
              "answer", "yes", "no")
POSITION_WORDS = ("top", "middle", "bottom", "left", "right", "center")
VOCAB = tuple(dict.fromkeys(
    GRAMMAR + TASK_WORDS + SHAPES + COLOURS + SIZES + POSITION_WORDS + NUMBERS + FILLER + KEYS
))
BOS, EOS = "<s>", "</s>"

VLM_CAPTION_PROMPT = "<s> <image> describe :"
SPLIT_STARTS = {"train": 0, "val": 10_000_000, "test": 20_000_000}
SPLIT_SIZE = 10_000_000


@dataclass
class Obj:
    shape: str
    colour: str
    size: str
    cell: int  # 0..8, row-major over the 3x3 grid

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"

    @property
    def position(self) -> str:
        return POSITIONS[self.cell]


@dataclass
class Scene:
    objects: list[Obj]
    seed: int

    def find(self, colour: str, shape: str) -> Obj | None:
        return next((o for o in self.objects if o.colour == colour and o.shape == shape), None)


@dataclass
class Claim:
    text: str
    truth: bool
    kind: str  # "existence" | "size" | "position"
    obj: Obj | None  # the scene object the claim is about (None if no such object)


@dataclass
class Pair:
    image: Image.Image = field(repr=False)
    caption: str
    scene: Scene
    corrupted: bool
    kind: str  # "clean" | "other_scene" | "swapped"


# ---------------------------------------------------------------------------------------------
# Scenes and images


def generate_scene(seed: int) -> Scene:
    rng = random.Random(f"scene-{seed}")
    n = rng.randint(1, MAX_OBJECTS)
    cells = sorted(rng.sample(range(9), n))
    kinds = rng.sample([(c, s) for c in COLOURS for s in SHAPES], n)
    objects = [Obj(shape=s, colour=c, size=rng.choice(SIZES), cell=cell) for cell, (c, s) in zip(cells, kinds)]
    return Scene(objects=objects, seed=seed)


def render(scene: Scene, size: int = 64) -> Image.Image:
    """Draw the scene; a small seeded jitter moves each object inside its cell."""
    return _draw(scene, size, "RGB", BACKGROUND, [RGB[o.colour] for o in scene.objects], Image.Resampling.LANCZOS)


def object_mask(scene: Scene, size: int = 64) -> "np.ndarray":
    """(size, size) int array: 0 for background, i + 1 where object i of `scene.objects` is drawn."""
    import numpy as np

    fills = list(range(1, len(scene.objects) + 1))
    return np.asarray(_draw(scene, size, "L", 0, fills, Image.Resampling.NEAREST)).astype(int)


def _draw(scene: Scene, size: int, mode: str, background, fills: list, resample) -> Image.Image:
    scale = 4  # draw large and downsample: smooth edges
    big = size * scale
    img = Image.new(mode, (big, big), background)
    draw = ImageDraw.Draw(img)
    rng = random.Random(f"render-{scene.seed}")
    cell = big / 3
    for obj, colour in zip(scene.objects, fills):
        row, col = divmod(obj.cell, 3)
        r = cell * (0.36 if obj.size == "large" else 0.2)
        jx, jy = (rng.uniform(-1, 1) * cell * 0.06 for _ in range(2))
        cx, cy = (col + 0.5) * cell + jx, (row + 0.5) * cell + jy
        if obj.shape == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
        elif obj.shape == "square":
            s = r * 0.88
            draw.rectangle([cx - s, cy - s, cx + s, cy + s], fill=colour)
        else:
            draw.polygon([(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)], fill=colour)
    return img.resize((size, size), resample)


# ---------------------------------------------------------------------------------------------
# Captions and claims


def _sentence(colour: str, shape: str, size: str | None, position: str | None) -> str:
    words = ["there is a"] + ([size] if size else []) + [colour, shape]
    if position:
        words.append(f"at the {position}")
    return " ".join(words) + " ."


def caption(scene: Scene, objects: list[Obj] | None = None) -> str:
    """The detailed caption: one sentence per object, in reading order unless `objects` gives another."""
    objs = sorted(scene.objects, key=lambda o: o.cell) if objects is None else objects
    return " ".join(_sentence(o.colour, o.shape, o.size, o.position) for o in objs)


def existence_claim(colour: str, shape: str) -> str:
    return f"there is a {colour} {shape}"


def size_claim(colour: str, shape: str, size: str) -> str:
    return f"the {colour} {shape} is {size}"


def position_claim(colour: str, shape: str, position: str) -> str:
    return f"the {colour} {shape} is at the {position}"


_C = "|".join(COLOURS)
_S = "|".join(SHAPES)
_Z = "|".join(SIZES)
_P = "|".join(POSITIONS)
SENTENCE_RE = re.compile(rf"there is a (?:({_Z}) )?({_C}) ({_S})(?: at the ({_P}))? \.")
CLAIM_RES = {
    "existence": re.compile(rf"^there is a ({_C}) ({_S})$"),
    "size": re.compile(rf"^the ({_C}) ({_S}) is ({_Z})$"),
    "position": re.compile(rf"^the ({_C}) ({_S}) is at the ({_P})$"),
}


def normalize(text: str) -> str:
    """One space between words and around punctuation ("left. there" -> "left . there"), as
    tokenizer decoding may glue punctuation to the previous word."""
    return " ".join(re.sub(r"([.?;:=])", r" \1 ", text).split())


def parse_claim(text: str) -> tuple[str, str, str, str | None] | None:
    """(kind, colour, shape, value) for a well-formed claim, else None."""
    text = normalize(text)
    for kind, pattern in CLAIM_RES.items():
        m = pattern.match(text)
        if m:
            groups = m.groups()
            return kind, groups[0], groups[1], groups[2] if len(groups) > 2 else None
    return None


def object_claims(obj: Obj) -> list[str]:
    return [existence_claim(obj.colour, obj.shape), size_claim(obj.colour, obj.shape, obj.size),
            position_claim(obj.colour, obj.shape, obj.position)]


def claim_truth(scene: Scene, text: str) -> bool:
    parsed = parse_claim(text)
    if parsed is None:
        return False
    kind, colour, shape, value = parsed
    obj = scene.find(colour, shape)
    if obj is None:
        return False
    return kind == "existence" or (kind == "size" and obj.size == value) or (
        kind == "position" and obj.position == value)


def label_claim(scene: Scene, text: str) -> Claim:
    parsed = parse_claim(text)
    kind = parsed[0] if parsed else "unparsed"
    obj = scene.find(parsed[1], parsed[2]) if parsed else None
    return Claim(text=text, truth=claim_truth(scene, text), kind=kind, obj=obj)


def scene_facts(scene: Scene) -> list[Claim]:
    """Every true atomic fact of the scene (3 per object), in caption order."""
    objs = sorted(scene.objects, key=lambda o: o.cell)
    kinds = ("existence", "size", "position")
    return [Claim(text=t, truth=True, kind=k, obj=o) for o in objs for k, t in zip(kinds, object_claims(o))]


def false_claims(scene: Scene, rng: random.Random, k: int) -> list[Claim]:
    """k distinct false claims: absent objects, wrong sizes and wrong positions of present ones."""
    pool: list[Claim] = []
    for c in COLOURS:
        for s in SHAPES:
            if scene.find(c, s) is None:
                pool.append(Claim(existence_claim(c, s), False, "existence", None))
    for o in scene.objects:
        pool.append(Claim(size_claim(o.colour, o.shape, "small" if o.size == "large" else "large"), False, "size", o))
        for p in POSITIONS:
            if p != o.position:
                pool.append(Claim(position_claim(o.colour, o.shape, p), False, "position", o))
    # Draw the kind first so wrong sizes/positions are not drowned out by absent objects.
    by_kind: dict[str, list[Claim]] = {}
    for c in pool:
        by_kind.setdefault(c.kind, []).append(c)
    out: list[Claim] = []
    while len(out) < k and any(by_kind.values()):
        kind = rng.choice(sorted(kk for kk, v in by_kind.items() if v))
        out.append(by_kind[kind].pop(rng.randrange(len(by_kind[kind]))))
    return out


def decompose(text: str) -> list[str]:
    """Caption -> atomic claim texts (reference decomposer; exact inverse of the caption grammar).

    Unparseable fragments are skipped; duplicate claims are kept once, in order.
    """
    claims: list[str] = []
    for m in SENTENCE_RE.finditer(normalize(text)):
        size, colour, shape, position = m.groups()
        claims.append(existence_claim(colour, shape))
        if size:
            claims.append(size_claim(colour, shape, size))
        if position:
            claims.append(position_claim(colour, shape, position))
    return list(dict.fromkeys(claims))


def rewrite(text: str, keep: list[str]) -> str:
    """The caption restricted to the kept claims (reference rewriter; adds nothing).

    An object whose existence claim is not kept is dropped with all its attributes.
    """
    kept = {normalize(k) for k in keep}
    sentences: list[str] = []
    seen: set[tuple[str, str]] = set()
    for m in SENTENCE_RE.finditer(normalize(text)):
        size, colour, shape, position = m.groups()
        if existence_claim(colour, shape) not in kept or (colour, shape) in seen:
            continue
        seen.add((colour, shape))
        size = size if size and size_claim(colour, shape, size) in kept else None
        position = position if position and position_claim(colour, shape, position) in kept else None
        sentences.append(_sentence(colour, shape, size, position))
    return " ".join(sentences) if sentences else "there is nothing ."


def question(claim_text: str) -> str:
    parsed = parse_claim(claim_text)
    if parsed is None:
        raise ValueError(f"not a Shapes World claim: {claim_text!r}")
    kind, colour, shape, value = parsed
    if kind == "existence":
        return f"is there a {colour} {shape} ?"
    if kind == "size":
        return f"is the {colour} {shape} {value} ?"
    return f"is the {colour} {shape} at the {value} ?"


def caption_claims(scene: Scene, text: str) -> list[Claim]:
    """Decompose a (possibly wrong) caption and label each claim against the scene."""
    return [label_claim(scene, c) for c in decompose(text)]


def factuality_coverage(scene: Scene, text: str) -> tuple[float, float, int]:
    """(share of the caption's claims that are true, share of scene facts stated, number of claims).

    A caption with no parseable claim has factuality 1.0 (it asserts nothing false) and coverage 0.
    """
    claims = caption_claims(scene, text)
    facts = {c.text for c in scene_facts(scene)}
    stated = {c.text for c in claims if c.truth}
    fact = sum(c.truth for c in claims) / len(claims) if claims else 1.0
    return fact, len(stated & facts) / len(facts), len(claims)


# ---------------------------------------------------------------------------------------------
# Corrupted image-caption pairs and questions


def swap_attributes(scene: Scene, rng: random.Random) -> Scene | None:
    """A scene that differs from `scene` in one attribute swap (None if no swap changes it)."""
    objs = [Obj(**vars(o)) for o in scene.objects]
    options = []
    if len(objs) >= 2:
        options += ["colours", "cells"]
    options += ["size"]
    rng.shuffle(options)
    for option in options:
        new = [Obj(**vars(o)) for o in objs]
        if option == "size":
            o = rng.choice(new)
            o.size = "small" if o.size == "large" else "large"
        else:
            a, b = rng.sample(range(len(new)), 2)
            if option == "colours":
                new[a].colour, new[b].colour = new[b].colour, new[a].colour
            else:
                new[a].cell, new[b].cell = new[b].cell, new[a].cell
        out = Scene(objects=new, seed=scene.seed)
        if len({(o.colour, o.shape) for o in new}) == len(new) and caption(out) != caption(scene):
            return out
    return None


def corrupted_pairs(seed: int, n: int) -> list[Pair]:
    """n image-caption pairs: a third clean, a third with another scene's caption, a third swapped."""
    rng = random.Random(f"pairs-{seed}")
    base = seed * 1000
    pairs = []
    for i in range(n):
        scene = generate_scene(base + i)
        kind = ("clean", "other_scene", "swapped")[i % 3]
        text = caption(scene)
        if kind == "other_scene":
            j = 1
            while caption(generate_scene(base + n + i * 7 + j)) == text:
                j += 1
            text = caption(generate_scene(base + n + i * 7 + j))
        elif kind == "swapped":
            swapped = swap_attributes(scene, rng)
            if swapped is None:
                kind = "clean"
            else:
                text = caption(swapped)
        pairs.append(Pair(image=render(scene), caption=text, scene=scene, corrupted=kind != "clean", kind=kind))
    return pairs


def question_set(scene: Scene, rng: random.Random, k: int) -> list[Claim]:
    """k claims about the scene, half true and half false, shuffled (odd k: the extra one is true
    or false with equal probability)."""
    facts = scene_facts(scene)
    n_true = k // 2 + (k % 2 == 1 and rng.random() < 0.5)
    true = [facts[i] for i in rng.sample(range(len(facts)), min(n_true, len(facts)))]
    while len(true) < n_true:
        true.append(rng.choice(facts))
    false = false_claims(scene, rng, k - len(true))
    out = true + false
    rng.shuffle(out)
    return out


def split_seeds(split: str, n: int) -> list[int]:
    if split not in SPLIT_STARTS:
        raise ValueError(f"unknown split {split!r} (use train, val or test)")
    if n > SPLIT_SIZE:
        raise ValueError(f"a split has {SPLIT_SIZE} seeds")
    start = SPLIT_STARTS[split]
    return list(range(start, start + n))


def split_of(seed: int) -> str:
    for name, start in SPLIT_STARTS.items():
        if start <= seed < start + SPLIT_SIZE:
            return name
    raise ValueError(f"seed {seed} is in no split")


# ---------------------------------------------------------------------------------------------
# Language-model tasks


def max_retrieval_example(rng: random.Random, n: int) -> tuple[str, str]:
    items = [rng.randrange(100) for _ in range(n)]
    return f"{BOS} max : {' '.join(map(str, items))} =", str(max(items))


def key_values(key: str) -> tuple[str, ...]:
    """The numbers key k<i> may hold: each key owns 12 of them (k0: 0-11, k1: 12-23, ...)."""
    i = KEYS.index(key)
    return NUMBERS[12 * i: 12 * i + 12]


def needle_example(rng: random.Random, length: int, n_needles: int = 4, depths: list[float] | None = None,
                   query: int | None = None) -> tuple[str, str, list[int]]:
    """Multi-needle retrieval. Returns (prompt, answer, positions of the queried needle's key and value).

    `length` is the prompt length in tokens (words). `depths` (0..1, one per needle) place needles at
    a fraction of the filler; `query` picks which needle is asked for (default: random).
    """
    if not 1 <= n_needles <= len(KEYS):
        raise ValueError(f"n_needles must be 1..{len(KEYS)}")
    head, tail = [BOS, "needle", ":"], ["query", None, "="]
    n_filler = length - len(head) - len(tail) - 2 * n_needles
    if n_filler < 0:
        raise ValueError(f"length {length} is too short for {n_needles} needles")
    keys = rng.sample(KEYS, n_needles)
    values = [rng.choice(key_values(k)) for k in keys]
    filler = [rng.choice(FILLER) for _ in range(n_filler)]
    if depths is None:
        slots = sorted(rng.sample(range(n_filler + 1), n_needles)) if n_filler + 1 >= n_needles else [0] * n_needles
    else:
        slots = [round(d * n_filler) for d in depths]
    order = sorted(range(n_needles), key=lambda i: (slots[i], i))
    body: list[str] = []
    positions: dict[int, int] = {}
    prev = 0
    for i in order:
        body += filler[prev:slots[i]]
        prev = slots[i]
        positions[i] = len(head) + len(body)
        body += [keys[i], values[i]]
    body += filler[prev:]
    q = rng.randrange(n_needles) if query is None else query
    tail[1] = keys[q]
    words = head + body + tail
    return " ".join(words), values[q], [positions[q], positions[q] + 1]


def decompose_example(scene: Scene) -> tuple[str, str]:
    text = caption(scene)
    return f"{BOS} decompose : {text} =", " ; ".join(decompose(text))


def rewrite_example(scene: Scene, rng: random.Random, caption_text: str | None = None) -> tuple[str, str]:
    """A caption (by default the scene's, with some claims falsified) and the claims to drop."""
    if caption_text is None:
        caption_text = caption(hallucinate(scene, rng))
    claims = caption_claims(scene, caption_text)
    drop = [c.text for c in claims if not c.truth]
    keep = [c.text for c in claims if c.truth]
    drop_text = " ; ".join(drop) if drop else "none"
    return f"{BOS} rewrite : {caption_text} drop : {drop_text} =", rewrite(caption_text, keep)


def hallucinate(scene: Scene, rng: random.Random) -> Scene:
    """A scene like `scene` with 0-2 random edits (extra object, changed size/cell/colour)."""
    objs = [Obj(**vars(o)) for o in scene.objects]
    for _ in range(rng.randint(0, 2)):
        edit = rng.choice(["add", "size", "cell", "colour"])
        used_cells = {o.cell for o in objs}
        used_kinds = {(o.colour, o.shape) for o in objs}
        free_kinds = [(c, s) for c in COLOURS for s in SHAPES if (c, s) not in used_kinds]
        if edit == "add" and len(objs) < MAX_OBJECTS and len(used_cells) < 9:
            c, s = rng.choice(free_kinds)
            objs.append(Obj(s, c, rng.choice(SIZES), rng.choice([i for i in range(9) if i not in used_cells])))
        elif edit == "size":
            o = rng.choice(objs)
            o.size = "small" if o.size == "large" else "large"
        elif edit == "cell" and len(used_cells) < 9:
            rng.choice(objs).cell = rng.choice([i for i in range(9) if i not in used_cells])
        elif edit == "colour":
            o = rng.choice(objs)
            options = [c for c in COLOURS if (c, o.shape) not in used_kinds]
            if options:
                o.colour = rng.choice(options)
    return Scene(objects=objs, seed=scene.seed)


# ---------------------------------------------------------------------------------------------
# Vision-language prompts


def vlm_question_prompt(claim_text: str) -> str:
    return f"<s> <image> question : {question(claim_text)} answer :"


def vlm_answer(truth: bool) -> str:
    return "yes" if truth else "no"

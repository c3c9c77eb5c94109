"""Shapes World ground-truth concepts per caption word and per image patch.

A concept is a string "kind:value" (e.g. "colour:red", "position:top left"). These label the
tokens a feature fires on, so a feature's concept precision can be measured (the SAE-V panel).

- `text_concepts`: a caption word carries the attributes its sentence has stated so far; both
  words of a position phrase carry the whole position.
- `patch_concepts`: an image patch carries the attributes of the object whose pixels cover it.
"""
from __future__ import annotations

from analysis.world import shapes_world as sw


def text_concepts(tokens: list[str]) -> list[set]:
    """One concept set per caption word."""
    out: list[set] = []
    stated: set = set()
    in_position = False
    for i, word in enumerate(tokens):
        if word == "there":
            stated, in_position = set(), False
        if word in sw.COLOURS:
            stated.add(f"colour:{word}")
        elif word in sw.SHAPES:
            stated.add(f"shape:{word}")
        elif word in sw.SIZES:
            stated.add(f"size:{word}")
        elif word == "the" and i > 0 and tokens[i - 1] == "at":
            in_position = True
        if in_position and word in sw.POSITION_WORDS:
            phrase = _position_phrase(tokens, i)
            if phrase in sw.POSITIONS:
                stated.add(f"position:{phrase}")
        out.append(set(stated))
        if word == ".":
            stated, in_position = set(), False
    return out


def _position_phrase(tokens: list[str], i: int) -> str:
    """The run of position words around token i (a position is one or two words)."""
    start = i
    while start > 0 and tokens[start - 1] in sw.POSITION_WORDS:
        start -= 1
    end = i
    while end + 1 < len(tokens) and tokens[end + 1] in sw.POSITION_WORDS:
        end += 1
    return " ".join(tokens[start:end + 1])


def object_concepts(obj) -> set:
    return {f"colour:{obj.colour}", f"shape:{obj.shape}", f"size:{obj.size}", f"position:{obj.position}"}


def patch_concepts(image_seed: int | None, grid: int) -> list[set]:
    """One concept set per patch of a grid x grid split of the scene (row-major); empty when unknown.

    A patch counts as covered when at least 20 % of its pixels are ink, or 30 ink pixels on coarse
    grids (a small object fills about 13 % of a scene cell); it then belongs to the object of the
    scene cell under the centre of its ink.
    """
    if image_seed is None or grid == 0:
        return []
    import numpy as np

    scene = sw.generate_scene(image_seed)
    size = 64
    pixels = np.asarray(sw.render(scene, size)).astype(int)
    ink = np.abs(pixels - np.array(sw.BACKGROUND)).max(-1) > 60
    step = size / grid
    by_cell = {o.cell: o for o in scene.objects}
    out: list[set] = []
    for r in range(grid):
        for c in range(grid):
            y0, y1, x0, x1 = int(r * step), int((r + 1) * step), int(c * step), int((c + 1) * step)
            patch = ink[y0:y1, x0:x1]
            if patch.sum() < min(0.2 * patch.size, 30):
                out.append(set())
                continue
            ys, xs = patch.nonzero()
            cy, cx = y0 + ys.mean(), x0 + xs.mean()
            obj = by_cell.get(int(cy // (size / 3)) * 3 + int(cx // (size / 3)))
            out.append(set() if obj is None else object_concepts(obj))
    return out


# ---------------------------------------------------------------------------------------------
# Ground-truth codes: what a perfect dictionary could fire on each side of an image-caption pair


def caption_code(text: str, binding: bool = False) -> set:
    """The concepts a caption states (per attribute: "colour:red", ...), or with `binding` the
    objects it describes, one frozenset of all the attributes its sentence states per object (the
    set on the word before each "." )."""
    tokens = text.split()
    per_word = text_concepts(tokens)
    if not binding:
        return set().union(*per_word) if per_word else set()
    return {frozenset(per_word[i - 1]) for i, word in enumerate(tokens) if word == "." and i and per_word[i - 1]}


def scene_code(scene, binding: bool = False) -> set:
    """The concepts an image shows, per attribute or (`binding`) per object, from its scene."""
    if binding:
        return {frozenset(object_concepts(o)) for o in scene.objects}
    return set().union(*(object_concepts(o) for o in scene.objects)) if scene.objects else set()

"""Shapes World, the demo zoo's generator, as the caption panel sees it: optional (loaded lazily, so real
models work without it) and the only source of ground truth.

A caption has ground truth only when the Shapes World grammar reads all of it (`grammar_covers`), and a
claim only when the grammar parses it (`claim_parses`); anything else is not measurable, never scored
as if it stated nothing.
"""
from __future__ import annotations

import re

from analysis.framework.errors import SettingsError


class CaptionError(SettingsError):
    """Bad input for the caption panel; the message is meant for a user (one line)."""


def shapes_world():
    try:
        from analysis.world import shapes_world as world
    except ImportError as exc:
        raise CaptionError("Shapes World is not installed (analysis/world/shapes_world.py is missing).") from exc
    return world


def has_shapes_world() -> bool:
    try:
        shapes_world()
    except CaptionError:
        return False
    return True


def shapes_text(text: str) -> str:
    """Shapes World spacing: every punctuation mark is its own word ('left.' -> 'left .').

    The word-level tokenizers' decoder glues punctuation to the previous word; the grammar needs it apart.
    """
    return " ".join(re.sub(r"([.;?:=])", r" \1 ", text).split())


def scene_image(seed: int):
    world = shapes_world()
    return world.render(world.generate_scene(seed))


NOTHING = "there is nothing ."  # the grammar's caption of no object (its rewrite when nothing is kept)


def grammar_covers(caption: str) -> bool:
    """True when the Shapes World grammar reads the whole caption: every word belongs to one of its
    sentences (or the caption is empty, or the grammar's own 'there is nothing .'). Only then do its
    claims carry ground truth for the caption; a caption with anything else in it is not measurable."""
    if not has_shapes_world():
        return False
    world = shapes_world()
    text = world.normalize(shapes_text(caption))
    if text in ("", NOTHING):
        return True
    rest = world.SENTENCE_RE.sub(" ", text)
    return not rest.strip()


def grammar_claim(claim: str) -> str:
    """A claim in the grammar's spelling when it is one in another case or with a full stop
    ('There is a red circle.' -> 'there is a red circle'): an instruct LM writes sentences."""
    return " ".join(claim.strip().rstrip(".").split()).lower()


def claim_parses(claim: str) -> bool:
    """True when the grammar parses the claim (up to case and a full stop), so the scene says whether it is true."""
    return has_shapes_world() and shapes_world().parse_claim(grammar_claim(claim)) is not None

"""The committed zoo models still score what their cards say, recomputed exactly.

A card's number is a measurement on a fixed, seeded sample (analysis/zoo/cards.py), and greedy
evaluation is deterministic, so each check recomputes it on the card's *whole* sample (the sizes in
`cards.FULL`) and allows one item of slack (a tie broken differently on another thread count), not a
sampling tolerance: a drift of a few points fails. A card value of exactly 0 or 1 holds on every
subset of its sample, so those are checked exactly on a subset. About 15 s on one CPU thread.
"""
from __future__ import annotations

import json

import pytest

from analysis.model_access.models import ZOO_DIR, ModelSpec, load_model
from analysis.zoo import cards
from analysis.world import shapes_world as sw

FULL = cards.FULL


def card_of(name: str) -> dict:
    path = ZOO_DIR / name / "card.json"
    if not path.is_file():
        pytest.skip(f"{name} has no card yet")
    return json.loads(path.read_text())


def same(measured: float, card_value: float, k: int) -> bool:
    """Equal up to one item of the k the card measured (a tie that flips on another thread count)."""
    return abs(measured - card_value) <= 1 / k + 1e-9


@pytest.fixture(scope="module")
def lm():
    card = card_of("shapes-lm")
    return card, load_model(ModelSpec("zoo", "shapes-lm"))


@pytest.fixture(scope="module")
def vlm():
    card = card_of("shapes-vlm")
    return card, load_model(ModelSpec("zoo", "shapes-vlm"))


def test_card_samples_are_the_full_sizes(lm, vlm):
    assert lm[0]["samples"] == {k: FULL[k] for k in ("max", "needle", "depth", "decompose", "rewrite")}
    assert vlm[0]["samples"] == {"yes_no_questions": 2 * FULL["yesno_scenes"], "captions": FULL["captions"]}


def test_lm_max_retrieval_matches_card(lm):
    card, handle = lm
    for n in ("8", "64"):
        acc = cards.lm_first_token_accuracy(handle, cards.max_pairs(int(n), FULL["max"]))
        assert same(acc, card["metrics"]["max_retrieval"][n], FULL["max"]), (n, acc)


def test_lm_needle_recall_at_256_tokens_matches_card(lm):
    card, handle = lm
    acc = cards.lm_first_token_accuracy(handle, cards.needle_pairs(256, FULL["needle"]), batch=25)
    assert same(acc, card["metrics"]["needle_by_length"]["256"], FULL["needle"]), acc


def test_lm_decomposition_and_rewrite_match_card(lm):
    card, handle = lm
    acc = cards.lm_answer_accuracy(handle, cards.decompose_pairs(FULL["decompose"]))
    assert same(acc, card["metrics"]["decomposition_exact"], FULL["decompose"]), acc
    acc = cards.lm_answer_accuracy(handle, cards.rewrite_pairs(FULL["rewrite"]))
    assert same(acc, card["metrics"]["rewrite_exact"], FULL["rewrite"]), acc


def test_vlm_yes_no_accuracy_and_caption_factuality_match_card(vlm):
    card, handle = vlm
    metrics = cards.evaluate_vlm(handle, dict(FULL, captions=12))  # all 600 questions, 12 captions
    questions = 2 * FULL["yesno_scenes"]
    assert same(metrics["yes_no_accuracy"], card["metrics"]["yes_no_accuracy"], questions)
    # the first captions of the card's sample are regenerated exactly (greedy decoding)
    for example in card["metrics"]["example_captions"]:
        scene = sw.generate_scene(example["seed"])
        assert cards.generate_captions(handle, [scene])[0] == example["generated"]
    # A perfect card value holds on any subset of its sample, so the first 12 captions must be perfect too.
    for key in ("caption_factuality", "caption_coverage", "caption_exact"):
        if card["metrics"][key] in (0.0, 1.0):
            assert metrics[key] == card["metrics"][key], key


def test_weak_captioner_hallucinates_per_its_card():
    card = card_of("shapes-vlm-weak")
    assert card["metrics"]["caption_factuality"] < 0.95
    handle = load_model(ModelSpec("zoo", "shapes-vlm-weak"))
    for example in card["metrics"]["example_captions"][:2]:
        scene = sw.generate_scene(example["seed"])
        assert cards.generate_captions(handle, [scene])[0] == example["generated"]

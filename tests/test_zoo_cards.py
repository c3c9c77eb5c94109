"""The committed zoo models still score what their cards say (on a sample of the card's own data)."""
from __future__ import annotations

import json
import math

import pytest

from analysis.models import ZOO_DIR, ModelSpec, load_model
from analysis.zoo import cards
from analysis.zoo import shapes_world as sw


def card_of(name: str) -> dict:
    path = ZOO_DIR / name / "card.json"
    if not path.is_file():
        pytest.skip(f"{name} has no card yet")
    return json.loads(path.read_text())


def close(measured: float, card_value: float, k: int) -> bool:
    """Within sampling error: the k items are the first k of the card's sample, so 4 sigma + 1/k."""
    p = min(max(card_value, 0.02), 0.98)
    return abs(measured - card_value) <= 4 * math.sqrt(p * (1 - p) / k) + 1 / k


@pytest.fixture(scope="module")
def lm():
    card = card_of("shapes-lm")
    return card, load_model(ModelSpec("zoo", "shapes-lm"))


@pytest.fixture(scope="module")
def vlm():
    card = card_of("shapes-vlm")
    return card, load_model(ModelSpec("zoo", "shapes-vlm"))


def test_lm_max_retrieval_matches_card(lm):
    card, handle = lm
    for n in ("8", "64"):
        acc = cards.lm_first_token_accuracy(handle, cards.max_pairs(int(n), 60))
        assert close(acc, card["metrics"]["max_retrieval"][n], 60), (n, acc)


def test_lm_needle_recall_at_256_tokens_matches_card(lm):
    card, handle = lm
    acc = cards.lm_first_token_accuracy(handle, cards.needle_pairs(256, 30), batch=15)
    assert close(acc, card["metrics"]["needle_by_length"]["256"], 30), acc


def test_lm_decomposition_and_rewrite_match_card(lm):
    card, handle = lm
    acc = cards.lm_answer_accuracy(handle, cards.decompose_pairs(30))
    assert close(acc, card["metrics"]["decomposition_exact"], 30), acc
    acc = cards.lm_answer_accuracy(handle, cards.rewrite_pairs(30))
    assert close(acc, card["metrics"]["rewrite_exact"], 30), acc


def test_vlm_yes_no_accuracy_and_caption_factuality_match_card(vlm):
    card, handle = vlm
    sizes = dict(cards.FULL, yesno_scenes=25, captions=12)
    metrics = cards.evaluate_vlm(handle, sizes)
    assert close(metrics["yes_no_accuracy"], card["metrics"]["yes_no_accuracy"], 50)
    # the first captions of the card's sample are regenerated exactly (greedy decoding)
    for example in card["metrics"]["example_captions"]:
        scene = sw.generate_scene(example["seed"])
        assert cards.generate_captions(handle, [scene])[0] == example["generated"]
    assert close(metrics["caption_factuality"], card["metrics"]["caption_factuality"], 30)


def test_weak_captioner_hallucinates_per_its_card():
    card = card_of("shapes-vlm-weak")
    assert card["metrics"]["caption_factuality"] < 0.95
    handle = load_model(ModelSpec("zoo", "shapes-vlm-weak"))
    for example in card["metrics"]["example_captions"][:2]:
        scene = sw.generate_scene(example["seed"])
        assert cards.generate_captions(handle, [scene])[0] == example["generated"]

"""Shapes World: determinism, ground truth, the caption grammar and the task formats."""
from __future__ import annotations

import random

import numpy as np
import pytest

from analysis.world import shapes_world as sw

SEEDS = range(300)


def brute_truth(scene: sw.Scene, kind: str, colour: str, shape: str, value: str | None) -> bool:
    """Truth of a claim from the object list alone, without shapes_world's parser or lookup."""
    for obj in scene.objects:
        if (obj.colour, obj.shape) == (colour, shape):
            return {"existence": True, "size": obj.size == value,
                    "position": sw.POSITIONS[obj.cell] == value}[kind]
    return False


def all_claims() -> list[tuple[str, str, str, str, str | None]]:
    out = []
    for c in sw.COLOURS:
        for s in sw.SHAPES:
            out.append((f"there is a {c} {s}", "existence", c, s, None))
            out += [(f"the {c} {s} is {z}", "size", c, s, z) for z in sw.SIZES]
            out += [(f"the {c} {s} is at the {p}", "position", c, s, p) for p in sw.POSITIONS]
    return out


def test_same_seed_gives_same_scene_image_and_caption():
    for seed in (0, 7, 12345):
        a, b = sw.generate_scene(seed), sw.generate_scene(seed)
        assert a == b
        assert sw.caption(a) == sw.caption(b)
        assert np.array_equal(np.asarray(sw.render(a)), np.asarray(sw.render(b)))
    assert len({sw.caption(sw.generate_scene(s)) for s in SEEDS}) > 250


def test_scenes_have_one_to_four_objects_in_distinct_cells_with_unique_names():
    counts = set()
    for seed in SEEDS:
        scene = sw.generate_scene(seed)
        counts.add(len(scene.objects))
        assert len({o.cell for o in scene.objects}) == len(scene.objects)
        assert len({(o.colour, o.shape) for o in scene.objects}) == len(scene.objects)
    assert counts == {1, 2, 3, 4}


def test_rendered_image_shows_each_object_in_its_cell():
    for seed in range(60):
        scene = sw.generate_scene(seed)
        image = np.asarray(sw.render(scene, 64)).astype(int)
        assert image.shape == (64, 64, 3)
        occupied = {o.cell: o for o in scene.objects}
        for cell in range(9):
            row, col = divmod(cell, 3)
            y, x = int((row + 0.5) * 64 / 3), int((col + 0.5) * 64 / 3)
            pixel = image[y, x]
            expected = sw.RGB[occupied[cell].colour] if cell in occupied else sw.BACKGROUND
            assert np.abs(pixel - np.array(expected)).max() < 40, (seed, cell, pixel, expected)


def test_every_claim_truth_agrees_with_the_scene():
    claims = all_claims()
    for seed in range(100):
        scene = sw.generate_scene(seed)
        for text, kind, c, s, v in claims:
            assert sw.claim_truth(scene, text) == brute_truth(scene, kind, c, s, v), (seed, text)
        facts = sw.scene_facts(scene)
        assert len(facts) == 3 * len(scene.objects)
        assert all(brute_truth(scene, *sw.parse_claim(f.text)) for f in facts)
        n_true = sum(brute_truth(scene, k, c, s, v) for _, k, c, s, v in claims)
        assert n_true == len(facts)  # scene_facts lists every true atomic claim
        for claim in sw.false_claims(scene, random.Random(seed), 6):
            assert not brute_truth(scene, *sw.parse_claim(claim.text)) and claim.truth is False


def test_decompose_is_the_exact_inverse_of_the_caption_grammar():
    for seed in SEEDS:
        scene = sw.generate_scene(seed)
        assert sw.decompose(sw.caption(scene)) == [f.text for f in sw.scene_facts(scene)]


def test_decompose_handles_false_objects_and_partial_sentences():
    text = "there is a green triangle . there is a small red circle at the center . junk words ."
    assert sw.decompose(text) == [
        "there is a green triangle", "there is a red circle", "the red circle is small",
        "the red circle is at the center",
    ]
    scene = sw.Scene([sw.Obj("circle", "red", "large", 4)], seed=-1)
    labels = [(c.text, c.truth) for c in sw.caption_claims(scene, text)]
    assert labels == [("there is a green triangle", False), ("there is a red circle", True),
                      ("the red circle is small", False), ("the red circle is at the center", True)]


def test_rewrite_keeps_only_true_claims_and_adds_nothing():
    rng = random.Random(0)
    for seed in range(200):
        scene = sw.generate_scene(seed)
        text = sw.caption(sw.hallucinate(scene, rng))
        claims = sw.caption_claims(scene, text)
        keep = [c.text for c in claims if c.truth]
        fixed = sw.rewrite(text, keep)
        assert set(sw.decompose(fixed)) == set(keep)  # everything kept, nothing added
        assert all(sw.claim_truth(scene, c) for c in sw.decompose(fixed))
        assert sw.rewrite(sw.caption(scene), [f.text for f in sw.scene_facts(scene)]) == sw.caption(scene)
    assert sw.rewrite("there is a large red circle at the center .", []) == "there is nothing ."


def test_questions_are_balanced_and_phrase_the_claim():
    rng = random.Random(1)
    truths = []
    for seed in range(200):
        scene = sw.generate_scene(seed)
        qs = sw.question_set(scene, rng, 4)
        assert sum(q.truth for q in qs) == 2
        truths += [q.truth for q in qs]
        for q in qs:
            assert q.truth == sw.claim_truth(scene, q.text)
    assert sum(truths) == len(truths) // 2
    assert sw.question("there is a red circle") == "is there a red circle ?"
    assert sw.question("the red circle is large") == "is the red circle large ?"
    assert sw.question("the red circle is at the top left") == "is the red circle at the top left ?"
    assert sw.vlm_question_prompt("there is a red circle") == "<s> <image> question : is there a red circle ? answer :"
    with pytest.raises(ValueError):
        sw.question("the sky is blue")


def test_corrupted_pairs_really_mismatch_and_clean_pairs_match():
    pairs = sw.corrupted_pairs(seed=3, n=60)
    kinds = {p.kind for p in pairs}
    assert kinds == {"clean", "other_scene", "swapped"}
    for p in pairs:
        claims = sw.caption_claims(p.scene, p.caption)
        if p.corrupted:
            assert p.caption != sw.caption(p.scene)
            assert not all(c.truth for c in claims)
        else:
            assert p.caption == sw.caption(p.scene) and all(c.truth for c in claims)
        assert np.array_equal(np.asarray(p.image), np.asarray(sw.render(p.scene)))


def test_splits_are_disjoint_and_deterministic():
    splits = {name: set(sw.split_seeds(name, 1000)) for name in ("train", "val", "test")}
    assert not splits["train"] & splits["val"] and not splits["val"] & splits["test"]
    assert not splits["train"] & splits["test"]
    assert sw.split_seeds("test", 5) == sw.split_seeds("test", 5)
    assert sw.split_of(sw.split_seeds("val", 1)[0]) == "val"


def test_max_retrieval_example_answer_is_the_maximum():
    rng = random.Random(2)
    for n in (1, 4, 16, 128):
        prompt, answer = sw.max_retrieval_example(rng, n)
        words = prompt.split()
        assert words[:3] == ["<s>", "max", ":"] and words[-1] == "="
        items = [int(w) for w in words[3:-1]]
        assert len(items) == n and int(answer) == max(items)


def test_needle_example_places_needles_and_answers_the_queried_key():
    rng = random.Random(3)
    for length, n in ((32, 1), (256, 4), (1024, 8)):
        prompt, answer, (key_pos, value_pos) = sw.needle_example(rng, length, n)
        words = prompt.split()
        assert len(words) == length
        assert words[-3] == "query" and words[-1] == "=" and words[key_pos] == words[-2]
        assert words[value_pos] == answer and value_pos == key_pos + 1
        assert sum(w in sw.KEYS for w in words[:-2]) == n
        assert answer in sw.key_values(words[-2])  # each key owns its own range of values
    # depth 0 puts the queried needle first, depth 1 last
    _, _, (first, _) = sw.needle_example(rng, 256, 4, depths=[0.0, 0.5, 0.5, 0.5], query=0)
    _, _, (last, _) = sw.needle_example(rng, 256, 4, depths=[1.0, 0.5, 0.5, 0.5], query=0)
    assert first == 3 and last == 256 - 3 - 2


def test_task_strings_use_only_vocabulary_words():
    rng = random.Random(4)
    vocab = set(sw.VOCAB) | {"<s>", "<image>"}
    scene = sw.generate_scene(5)
    texts = [*sw.max_retrieval_example(rng, 10), *sw.needle_example(rng, 64, 3)[:2],
             *sw.decompose_example(scene), *sw.rewrite_example(scene, rng), sw.VLM_CAPTION_PROMPT,
             sw.vlm_question_prompt("the red circle is at the top left"), sw.caption(scene)]
    for text in texts:
        assert set(text.split()) <= vocab, set(text.split()) - vocab


def test_decompose_accepts_decoded_text_with_glued_punctuation():
    scene = sw.generate_scene(11)
    glued = sw.caption(scene).replace(" .", ".")
    assert sw.decompose(glued) == sw.decompose(sw.caption(scene))
    assert sw.normalize(glued) == sw.caption(scene)
    assert sw.claim_truth(scene, sw.scene_facts(scene)[0].text + " ")


def test_single_questions_are_balanced_too():
    rng = random.Random(7)
    truths = [sw.question_set(sw.generate_scene(s), rng, 1)[0].truth for s in range(400)]
    assert 160 < sum(truths) < 240

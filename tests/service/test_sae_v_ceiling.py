"""benchmarks/sae_v_ceiling.py and the ground-truth codes it scores (analysis.world.concepts)."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest

from analysis.world import concepts
from analysis.world import shapes_world as sw

from analysis.framework.paths import ROOT
SENTENCE = re.compile(r"there is a (\w+) (\w+) (\w+) at the ([a-z ]+?) \.")


def bench():
    spec = importlib.util.spec_from_file_location("sae_v_ceiling", ROOT / "benchmarks" / "sae_v_ceiling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parsed_objects(text: str) -> set:
    """Independent reading of a caption: one (size, colour, shape, position) per sentence."""
    return {tuple(m.groups()) for m in SENTENCE.finditer(text)}


def scene_objects(scene) -> set:
    return {(o.size, o.colour, o.shape, o.position) for o in scene.objects}


def reference_scores(pair) -> dict:
    text, image = parsed_objects(pair.caption), scene_objects(pair.scene)
    attrs = lambda objs: {(i, v) for o in objs for i, v in enumerate(o)}  # noqa: E731
    both, either = attrs(text) & attrs(image), attrs(text) | attrs(image)
    return {"per attribute, official sum": len(both),
            "per attribute, normalised": len(both) / len(either),
            "per object (binding), official sum": len(text & image),
            "per object (binding), normalised": len(text & image) / len(text | image)}


def brute_auc(clean, bad):
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in clean for b in bad) / (len(clean) * len(bad))


def two_objects():
    return sw.Scene(objects=[sw.Obj("circle", "red", "large", 0), sw.Obj("square", "blue", "small", 8)], seed=0)


def test_ground_truth_codes_per_attribute_and_per_object():
    scene = two_objects()
    text = sw.caption(scene)
    attributes = {"colour:red", "colour:blue", "shape:circle", "shape:square", "size:large", "size:small",
                  "position:top left", "position:bottom right"}
    assert concepts.caption_code(text) == concepts.scene_code(scene) == attributes
    objects = {frozenset({"colour:red", "shape:circle", "size:large", "position:top left"}),
               frozenset({"colour:blue", "shape:square", "size:small", "position:bottom right"})}
    assert concepts.caption_code(text, binding=True) == concepts.scene_code(scene, binding=True) == objects


def test_a_colour_swap_is_invisible_to_attributes_and_visible_to_objects():
    scene = two_objects()
    swapped = sw.Scene(objects=[sw.Obj("circle", "blue", "large", 0), sw.Obj("square", "red", "small", 8)], seed=0)
    text = sw.caption(swapped)
    assert concepts.caption_code(text) == concepts.scene_code(scene)
    assert not concepts.caption_code(text, binding=True) & concepts.scene_code(scene, binding=True)


def test_ceiling_matches_an_independent_reading_of_the_captions():
    pairs = sw.corrupted_pairs(20_003, 30)
    rows = bench().ceiling(pairs)
    refs = [reference_scores(p) for p in pairs]
    for name in refs[0]:
        clean = [r[name] for r, p in zip(refs, pairs) if p.kind == "clean"]
        for kind in ("other_scene", "swapped"):
            bad = [r[name] for r, p in zip(refs, pairs) if p.kind == kind]
            assert rows[name][kind] == pytest.approx(brute_auc(clean, bad), abs=1e-4), (name, kind)
        bad = [r[name] for r, p in zip(refs, pairs) if p.kind != "clean"]
        assert rows[name]["all"] == pytest.approx(brute_auc(clean, bad), abs=1e-4), name
    # the tuned weights can only match or beat equal weights (1 is on the grid)
    best = rows["per attribute, official sum, best kind weights"]
    assert best["all"] >= rows["per attribute, official sum"]["all"]
    assert set(best["weights"]) == {"colour", "shape", "size", "position"}


def test_cli_writes_its_json_and_rejects_bad_seeds_with_one_error_line(tmp_path):
    out = tmp_path / "ceiling.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sae_v_ceiling.py"), "--seeds", "4",
                          "--pairs", "24", "--no-sae", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    record = json.loads(out.read_text())
    assert record["pairs_per_pool"] == 24 and list(record["pools"]) == ["4"] and "demo_sae" not in record
    assert "| per object (binding), official sum |" in run.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sae_v_ceiling.py"), "--seeds", "two"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == ["error: --seeds takes non-negative integers separated by commas, "
                                               "got 'two'"]


def _objects(n, seed):
    import random

    rng = random.Random(seed)
    return [frozenset({f"size:{rng.choice(sw.SIZES)}", f"colour:{rng.choice(sw.COLOURS)}",
                       f"shape:{rng.choice(sw.SHAPES[:2])}", f"position:{rng.choice(sw.POSITIONS[:2])}"})
            for _ in range(n)]


def test_held_out_r2_tells_an_additive_code_from_a_binding_one():
    import numpy as np

    module = bench()
    rng = np.random.default_rng(0)
    objects = _objects(800, 1)  # 2 sizes x 4 colours x 2 shapes x 2 positions = 32 kinds of object
    values = sorted({v for o in objects for v in o})
    direction = {v: rng.normal(size=16) for v in values}
    offset = 5.0 * np.ones(16)  # a shared offset: R² must be about the variance around the mean
    additive = offset + np.stack([sum(direction[v] for v in o) for o in objects]) + 0.1 * rng.normal(size=(800, 16))
    r2 = module.held_out_r2(additive, objects)
    # independent reference: numpy's least squares on indicator columns, fitted on the first half
    x = np.array([[1.0] + [float(v in o) for v in values] for o in objects])
    fit = np.linalg.lstsq(x[:400], additive[:400], rcond=None)[0]
    centre = additive[:400].mean(0)
    expected = 1 - ((additive[400:] - x[400:] @ fit) ** 2).sum() / ((additive[400:] - centre) ** 2).sum()
    assert r2["sum_of_attributes"] == pytest.approx(expected, abs=1e-3) and expected > 0.95
    assert r2["tokens_fit_scored"] == [400, 400]
    # a binding code: one unrelated vector per whole object; a sum of attributes cannot fit it
    kinds = {o: rng.normal(size=16) for o in set(objects)}
    bound = np.stack([kinds[o] for o in objects]) + 0.1 * rng.normal(size=(800, 16))
    r2 = module.held_out_r2(bound, objects)
    assert r2["one_mean_per_object"] > 0.95 > r2["with_pairwise_interactions"] > r2["sum_of_attributes"] + 0.05


def test_kmeans_code_is_one_nearest_centroid_per_token_and_centres_as_asked():
    import torch

    module = bench()
    g = torch.Generator().manual_seed(0)
    points = torch.nn.functional.normalize(torch.randn(4, 16, generator=g), dim=1) * 10  # 4 objects
    offset = torch.zeros(16)
    offset[0] = 40.0  # image tokens sit far from text tokens along one direction

    def tokens(n):
        which = torch.arange(n) % 4
        modality = (torch.arange(n) // 4) % 2  # text and image copies of every object
        x = points[which] + 0.05 * torch.randn(n, 16, generator=g) + modality[:, None] * offset
        return x, modality, which

    train, train_mod, _ = tokens(400)
    test, test_mod, which = tokens(80)
    for per_modality, k in ((False, 8), (True, 4)):  # k: how many groups the centring leaves
        codes = module.kmeans_code(train, train_mod, test, test_mod, k=k, per_modality=per_modality)
        assert ((codes > 0).sum(1) <= 1).all()  # one feature per token at most
        fired = codes.argmax(1)
        assert (codes.max(1).values > 5).all()  # the projection of a 10-long vector onto its own centroid
        # tokens of one object in one modality fire one cluster
        for obj in range(4):
            for mod in (0, 1):
                rows = (which == obj) & (test_mod == mod)
                assert len(set(fired[rows].tolist())) == 1
        same = [fired[(which == o) & (test_mod == 0)][0] == fired[(which == o) & (test_mod == 1)][0] for o in range(4)]
        # with one mean the offset keeps the modalities apart; with each modality's own mean removed a
        # text token and the image token of the same object share their cluster
        assert all(same) if per_modality else not any(same)

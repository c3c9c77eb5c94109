"""One way into the model for every pair (issue 40, items 2-4): your pairs and the built-in ones that are
identical in content give identical residuals, features and scores; a pair longer than the context is
reported, never scored silently; the kept subset of your file is its own lines."""
from __future__ import annotations

import csv
import json

import pytest
import torch

from analysis import sae_v
from sae_lens_factory import cache, save_sae_lens  # noqa: F401  (cache: a fixture)


@pytest.fixture(scope="module")
def shapes_llava(model_root):
    """A tiny LLaVA whose tokenizer speaks Shapes World: its task provider gives it the demo VLM's captioning
    prompt and the `shapes` pairs, the case where user pairs used to be read without that prompt."""
    from analysis.model_access import tiny_models
    from analysis.model_access.models import ModelSpec, load_model
    from analysis.world import shapes_world as sw

    folder = tiny_models.save_tiny_llava(model_root / "shapes-llava", words=list(sw.VOCAB))
    return load_model(ModelSpec("local", str(folder)))


def write_as_user_data(pairs: sae_v.PairSet, folder):
    """The generated pairs as a user's folder: each image saved as PNG (lossless), captions.jsonl with labels."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, pair in enumerate(pairs.pairs):
        sae_v.render_pair(pairs, i).save(folder / f"{i}.png")
        lines.append({"image": f"{i}.png", "caption": pair.text, **({"corrupted": pair.corrupted} if pairs.labelled else {})})
    (folder / "captions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


def test_user_pairs_and_built_in_pairs_identical_in_content_score_identically(shapes_llava, model_root, cache):
    tiny_llava = shapes_llava
    assert sae_v.default_dataset(tiny_llava) == "shapes" and "describe" in sae_v.caption_prompt(tiny_llava)
    sae = save_sae_lens(model_root / "pairs-sae", "jumprelu", "none", d_in=32, seed=5)
    n = 12
    # all-shared: a random SAE on a tiny model has no feature with 5 text and 5 image tokens in its top 30,
    # so the official s_i would be 0 everywhere and show nothing
    built_in = sae_v.choose(tiny_llava, str(sae), "dataset:shapes", sae_v.RankParams, store_pairs=n,
                            rule="all-shared")
    pairs, _, _ = sae_v.data_pairs(tiny_llava, built_in)
    folder = write_as_user_data(pairs, model_root / "pairs-as-user-data")
    user = sae_v.choose(tiny_llava, str(sae), str(folder), sae_v.RankParams, store_pairs=n, rule="all-shared")
    mine, _, _ = sae_v.data_pairs(tiny_llava, user)
    assert [p.text for p in mine.pairs] == [p.text for p in pairs.pairs]
    a = sae_v.collect_activations(tiny_llava, pairs, 1)
    b = sae_v.collect_activations(tiny_llava, mine, 1)
    assert a.tokens == b.tokens and torch.equal(a.modality, b.modality)
    assert torch.allclose(a.acts, b.acts, atol=1e-5)  # the same prompt and image reach the model
    store_a, store_b = sae_v.store_for(tiny_llava, built_in), sae_v.store_for(tiny_llava, user)
    assert [f.omega for f in store_a.features] == pytest.approx([f.omega for f in store_b.features], abs=1e-4)
    rank_a, rank_b = sae_v.rank(tiny_llava, built_in), sae_v.rank(tiny_llava, user)
    score_a = {r.pair: r.score for r in rank_a.rows}
    score_b = {r.row: r.score for r in rank_b.rows}
    assert any(score_a.values())  # something to compare
    assert [score_b[i] for i in range(n)] == pytest.approx([score_a[i] for i in range(n)], abs=1e-3)
    assert [r.pair for r in rank_a.rows] == [r.row for r in rank_b.rows]  # the same order
    assert rank_a.labelled and rank_b.labelled and rank_a.roc_auc == pytest.approx(rank_b.roc_auc)


def test_a_pair_is_the_models_caption_prompt_then_the_caption(tiny_llava, tiny_llama):
    prompt = sae_v.pair_prompt(tiny_llava, "a red circle")
    assert prompt == sae_v.caption_prompt(tiny_llava) + " a red circle"
    assert prompt.startswith("<image>")
    text = sae_v.pair_prompt(tiny_llama, "w1 w2")
    ids = tiny_llama.tokenizer(text)["input_ids"]
    assert ids[0] == tiny_llama.tokenizer.bos_token_id and ids.count(tiny_llama.tokenizer.bos_token_id) == 1


def test_a_caption_longer_than_the_context_is_reported_not_scored(tiny_llava, model_root, cache):
    sae = save_sae_lens(model_root / "long-sae", "standard", "none", d_in=32, seed=6)
    pairs = sae_v.make_pairs(tiny_llava, "noise", 5, 2)
    folder = write_as_user_data(pairs, model_root / "long-captions")
    lines = (folder / "captions.jsonl").read_text().splitlines()
    row = json.loads(lines[2])
    row["caption"] = " ".join(["w1"] * 600)  # tiny_llava reads 512 positions
    lines[2] = json.dumps(row)
    (folder / "captions.jsonl").write_text("\n".join(lines) + "\n")
    choice = sae_v.choose(tiny_llava, str(sae), str(folder), sae_v.RankParams, store_pairs=5)
    ranking = sae_v.rank(tiny_llava, choice)
    assert sorted(r.row for r in ranking.rows) == [0, 1, 3, 4]
    [skipped] = ranking.skipped
    assert skipped.row == 2 and "too long" in skipped.reason and "512" in skipped.reason
    with pytest.raises(sae_v.SettingsError, match="too long"):
        sae_v.explain_input(tiny_llava, *sae_v.open_sae(tiny_llava, choice), " ".join(["w1"] * 600),
                            image=sae_v.render_pair(pairs, 0))


def test_the_kept_subset_is_the_files_own_lines(tiny_llava, model_root, tmp_path):
    from PIL import Image

    folder = model_root / "kept-lines"
    folder.mkdir(exist_ok=True)
    Image.new("RGB", (16, 16), (200, 0, 0)).save(folder / "a.png")
    Image.new("RGB", (16, 16), (0, 200, 0)).save(folder / "b.png")
    lines = [{"image": "a.png", "caption": "w1 w2"}, None, {"image": "b.png", "caption": "w3 w4"},
             {"image": "a.png", "caption": "w1 w2"}, {"image": "b.png", "caption": "w9"}]
    (folder / "captions.jsonl").write_text("".join((json.dumps(x) if x else "") + "\n" for x in lines))
    old = sae_v.types.CACHE_ROOT
    sae_v.types.CACHE_ROOT = tmp_path
    try:
        sae = save_sae_lens(model_root / "rows-sae", "standard", "none", d_in=32)
        ranking = sae_v.rank(tiny_llava, sae_v.choose(tiny_llava, str(sae), str(folder), sae_v.RankParams,
                                                      store_pairs=4))
        assert sorted(r.row + 1 for r in ranking.rows) == [1, 3, 5]
        content, _ = sae_v.kept_subset(str(folder), ranking, 1.0)
        lines = (folder / "captions.jsonl").read_text().splitlines()
        assert content.decode().splitlines() == [lines[0], lines[2], lines[4]]
        with open(folder / "captions.csv", "w", newline="") as fh:
            csv.writer(fh).writerows([["image", "caption"], ["a.png", "w1"], [], ["b.png", "w2"]])
        ranking = sae_v.rank(tiny_llava, sae_v.choose(tiny_llava, str(sae), str(folder / "captions.csv"),
                                                      sae_v.RankParams, store_pairs=4))
        content, _ = sae_v.kept_subset(str(folder / "captions.csv"), ranking, 1.0)
        assert list(csv.reader(content.decode().splitlines())) == [["image", "caption"], ["a.png", "w1"],
                                                                   ["b.png", "w2"]]
    finally:
        sae_v.types.CACHE_ROOT = old

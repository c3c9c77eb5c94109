"""SAE-V analysis: statistics against brute-force references, save/load, feature store, activations."""
from __future__ import annotations

import json
import math

import pytest
import torch

from analysis import sae_v
from analysis.sae_v import IMAGE, TEXT


# ---------------------------------------------------------------------------------------------
# Synthetic activations with planted features


def planted():
    """60 tokens over 6 pairs (5 text + 5 image tokens each), 4 features:
    0 cross-modal (fires on 8 text + 8 image tokens), 1 text-only, 2 image-only, 3 dead.
    Residual vectors of feature 0's text and image tokens share a direction, so omega_0 is high."""
    g = torch.Generator().manual_seed(0)
    n_pairs, per = 6, 5
    modality, pair = [], []
    for p in range(n_pairs):
        modality += [TEXT] * per + [IMAGE] * per
        pair += [p] * (2 * per)
    modality, pair = torch.tensor(modality), torch.tensor(pair)
    n = len(modality)
    acts = torch.randn(n, 16, generator=g)
    codes = torch.zeros(n, 4)
    text_rows = (modality == TEXT).nonzero().squeeze(1)
    image_rows = (modality == IMAGE).nonzero().squeeze(1)
    shared = torch.randn(16, generator=g) * 4
    for j, r in enumerate(text_rows[::3][:8].tolist()):
        codes[r, 0] = 5.0 - 0.3 * j
        acts[r] += shared
    for j, r in enumerate(image_rows[::3][:8].tolist()):
        codes[r, 0] = 4.9 - 0.3 * j
        acts[r] += shared
    codes[text_rows[:20], 1] = torch.rand(20, generator=g) + 0.5
    codes[image_rows[:2], 1] = 0.1  # two weak image hits: still text-only (< 5 image tokens in its top 30)
    codes[image_rows[5:25], 2] = torch.rand(20, generator=g) + 0.5
    return acts, codes, modality, pair, n_pairs


def brute_omega(acts, codes, modality, top=5):
    out = []
    for f in range(codes.shape[1]):
        sides = []
        for mod in (TEXT, IMAGE):
            rows = [r for r in range(len(modality)) if modality[r] == mod and codes[r, f] > 0]
            rows.sort(key=lambda r: -float(codes[r, f]))
            sides.append(rows[:top])
        t, i = sides
        if not t or not i:
            out.append(0.0)
            continue
        cos = [float(torch.dot(acts[a], acts[b]) / (acts[a].norm() * acts[b].norm())) for a in t for b in i]
        out.append(sum(cos) / len(cos))
    return out


def brute_labels(codes, modality, top=30, minimum=5):
    labels = []
    for f in range(codes.shape[1]):
        rows = sorted(range(len(modality)), key=lambda r: -float(codes[r, f]))[:top]
        rows = [r for r in rows if codes[r, f] > 0]
        t = sum(1 for r in rows if modality[r] == TEXT)
        i = len(rows) - t
        labels.append("dead" if not rows else "cross-modal" if t >= minimum and i >= minimum
                      else "text-only" if t >= i else "image-only")
    return labels


def brute_scores(codes, modality, pair, omega, n_pairs, threshold):
    sums, weighted, counts = [], [], []
    for p in range(n_pairs):
        total = wsum = wtotal = 0.0
        count = 0
        for f in range(codes.shape[1]):
            text = [float(codes[r, f]) for r in range(len(pair)) if pair[r] == p and modality[r] == TEXT]
            image = [float(codes[r, f]) for r in range(len(pair)) if pair[r] == p and modality[r] == IMAGE]
            if text and image and max(text) > threshold and max(image) > threshold:
                total += float(omega[f])
                w = min(max(text), max(image))
                wsum += w * float(omega[f])
                wtotal += w
                count += 1
        sums.append(total)
        weighted.append(wsum / wtotal if wtotal else 0.0)
        counts.append(count)
    return sums, weighted, counts


def test_omega_matches_brute_force_and_is_high_for_planted_cross_modal_feature():
    acts, codes, modality, _, _ = planted()
    omega = sae_v.cross_modal_weights(acts, codes, modality, top=5)
    ref = brute_omega(acts, codes, modality)
    assert omega.tolist() == pytest.approx(ref, abs=1e-5)
    assert omega[0] > 0.8  # shared direction planted
    assert omega[2] == 0 and omega[3] == 0  # never active on a text token


def test_modality_labels_match_brute_force_on_planted_features():
    _, codes, modality, _, _ = planted()
    labels, n_text, n_image = sae_v.modality_labels(codes, modality, top=30, minimum=5)
    assert labels == brute_labels(codes, modality)
    assert labels == ["cross-modal", "text-only", "image-only", "dead"]
    assert (int(n_text[0]), int(n_image[0])) == (8, 8)


def test_modality_label_needs_five_of_each_modality():
    modality = torch.tensor([TEXT] * 10 + [IMAGE] * 10)
    codes = torch.zeros(20, 2)
    codes[:10, 0] = 1.0
    codes[10:14, 0] = 2.0  # only 4 image tokens
    codes[:10, 1] = 1.0
    codes[10:15, 1] = 2.0  # 5 image tokens
    labels, _, _ = sae_v.modality_labels(codes, modality, top=30, minimum=5)
    assert labels == ["text-only", "cross-modal"]


@pytest.mark.parametrize("threshold", [0.0, 0.7])
def test_pair_scores_match_brute_force(threshold):
    acts, codes, modality, pair, n_pairs = planted()
    omega = sae_v.cross_modal_weights(acts, codes, modality)
    score, weighted, shared = sae_v.pair_scores(codes, modality, pair, omega, n_pairs, threshold)
    ref_s, ref_w, ref_c = brute_scores(codes, modality, pair, omega, n_pairs, threshold)
    assert score.tolist() == pytest.approx(ref_s, abs=1e-5)
    assert weighted.tolist() == pytest.approx(ref_w, abs=1e-5)
    assert shared.tolist() == ref_c
    assert max(ref_c) >= 1  # the planted cross-modal feature is shared by some pair


def test_roc_auc_counts_pairs_and_ties():
    assert sae_v.roc_auc([3.0, 2.0], [1.0, 2.0]) == pytest.approx(0.875)
    assert sae_v.roc_auc([1.0], [2.0]) == 0.0
    assert sae_v.roc_auc([], [1.0]) is None


def test_ranking_puts_higher_scores_first_and_measures_separation():
    acts, codes, modality, pair, n_pairs = planted()
    omega = sae_v.cross_modal_weights(acts, codes, modality)
    pairs = sae_v.PairSet(dataset="noise", seed=0, image_size=None,
                          pairs=[sae_v.Pair(text=f"p{i}", corrupted=i % 2 == 1) for i in range(n_pairs)])
    a = sae_v.Activations(acts=acts, modality=modality, pair=pair, index=torch.zeros_like(pair),
                          tokens=[[]] * n_pairs, layer=0, grid=0)
    meta = sae_v.SaeMeta(model="m", layer=0, d_in=16, train=sae_v.TrainParams(), dataset="noise", n_pairs=0,
                         n_tokens=0, fve=0, l0=0, dead=0)
    ranking = sae_v.rank_pairs(meta, omega, codes, a, pairs)
    scores = [r.score for r in ranking.rows]
    assert scores == sorted(scores, reverse=True)
    assert [r.rank for r in ranking.rows] == list(range(1, n_pairs + 1))
    clean = [r.score for r in ranking.rows if not r.corrupted]
    bad = [r.score for r in ranking.rows if r.corrupted]
    assert ranking.roc_auc == pytest.approx(sae_v.roc_auc(clean, bad))


# ---------------------------------------------------------------------------------------------
# SAE training, save / load


@pytest.mark.parametrize("arch", sae_v.ARCHITECTURES)
def test_saved_sae_reloads_with_identical_encodings(arch, tmp_path):
    g = torch.Generator().manual_seed(1)
    data = torch.randn(600, 16, generator=g) @ torch.randn(16, 16, generator=g)
    params = sae_v.TrainParams(architecture=arch, d_sae=32, k=4, steps=40, batch_size=64)
    sae = sae_v.train_sae(data, params)
    meta = sae_v.SaeMeta(model="synthetic", layer=0, d_in=16, train=params, dataset="noise", n_pairs=0,
                         n_tokens=600, fve=0.0, l0=0.0, dead=0)
    sae_v.save_sae(sae, meta, tmp_path / "sae")
    again, meta2 = sae_v.load_sae(tmp_path / "sae")
    assert torch.equal(sae_v.encode(sae, data), sae_v.encode(again, data))
    assert meta2 == meta
    if arch == "topk":
        assert (sae_v.encode(again, data) > 0).sum(1).max() <= 4


def test_topk_sae_learns_to_reconstruct():
    g = torch.Generator().manual_seed(2)
    dictionary = torch.randn(24, 16, generator=g)
    picks = torch.randint(0, 24, (2000, 2), generator=g)
    data = dictionary[picks].sum(1) * (torch.rand(2000, 1, generator=g) + 0.5)
    sae = sae_v.train_sae(data, sae_v.TrainParams(d_sae=48, k=4, steps=300, batch_size=128, lr=3e-3))
    fve, l0, _ = sae_v.reconstruction_metrics(sae, data)
    assert l0 <= 4.0
    assert fve > 0.8


# ---------------------------------------------------------------------------------------------
# On a real (tiny, random) LLaVA


@pytest.fixture(scope="module")
def llava_pairs(tiny_llava):
    return sae_v.make_pairs(tiny_llava, "noise", 12, seed=3)


def test_activations_are_the_layer_outputs_at_text_and_image_positions(tiny_llava, llava_pairs):
    acts = sae_v.collect_activations(tiny_llava, llava_pairs, layer=0, batch_size=5)
    n_img = tiny_llava.info.image_tokens
    for p, pair in enumerate(llava_pairs.pairs):
        rows = acts.pair == p
        assert int((rows & (acts.modality == IMAGE)).sum()) == n_img
        assert sorted(acts.index[rows & (acts.modality == IMAGE)].tolist()) == list(range(n_img))
        assert acts.tokens[p] == pair.text.split()
    # brute force: one unbatched forward with all hidden states (the last one is after the final norm,
    # so compare layer 0's output, hidden_states[1])
    p = 4
    enc = tiny_llava.processor(images=[llava_pairs.image(p)], text=[f"<image> {llava_pairs.pairs[p].text}"],
                               return_tensors="pt")
    with tiny_llava.session():
        hidden = tiny_llava.model(**enc, output_hidden_states=True).hidden_states[1][0]
    img_id = tiny_llava.model.config.image_token_id
    image_pos = (enc["input_ids"][0] == img_id).nonzero().squeeze(1)
    text_pos = (enc["input_ids"][0] != img_id).nonzero().squeeze(1)
    mine = acts.acts[acts.pair == p]
    mod = acts.modality[acts.pair == p]
    assert torch.allclose(mine[mod == IMAGE], hidden[image_pos], atol=1e-4)
    assert torch.allclose(mine[mod == TEXT], hidden[text_pos], atol=1e-4)


def test_modality_scales_equalise_mean_norms(tiny_llava, llava_pairs):
    acts = sae_v.collect_activations(tiny_llava, llava_pairs, layer=1)
    x = sae_v.scaled(acts, sae_v.modality_scales(acts))
    d = x.shape[1]
    for mod in (TEXT, IMAGE):
        assert float(x[acts.modality == mod].norm(dim=1).mean()) == pytest.approx(math.sqrt(d), rel=1e-4)


def test_layer_out_of_range_is_a_clear_error(tiny_llava, llava_pairs):
    with pytest.raises(ValueError, match="out of range"):
        sae_v.collect_activations(tiny_llava, llava_pairs, layer=7)


@pytest.fixture(scope="module")
def tiny_store(tiny_llava, llava_pairs):
    acts = sae_v.collect_activations(tiny_llava, llava_pairs, layer=1)
    params = sae_v.TrainParams(d_sae=32, k=4, steps=60, batch_size=64)
    scales = sae_v.modality_scales(acts)
    sae = sae_v.train_sae(sae_v.scaled(acts, scales), params)
    meta = sae_v.SaeMeta(model="tiny", layer=1, d_in=acts.acts.shape[1], train=params, dataset="noise",
                         n_pairs=12, n_tokens=len(acts), fve=0, l0=0, dead=0, scales=scales)
    store = sae_v.build_feature_store(tiny_llava, sae, meta, acts, llava_pairs,
                                      sae_v.StoreParams(top_n=6, top_images=3))
    return sae, acts, store


def test_feature_store_top_examples_are_the_true_top_activations(tiny_store):
    sae, acts, store = tiny_store
    codes = sae_v.encode(sae, sae_v.scaled(acts, store.meta.scales))
    checked = 0
    for card in store.features:
        f = card.index
        text_vals = sorted((float(codes[r, f]) for r in range(len(acts)) if acts.modality[r] == TEXT), reverse=True)
        expected = [v for v in text_vals[:6] if v > 0]
        assert [e.act for e in card.top_text] == pytest.approx(expected, abs=1e-3)
        for e in card.top_text:  # the example points at a token that really has that activation
            row = ((acts.pair == e.pair) & (acts.modality == TEXT) & (acts.index == e.index)).nonzero().item()
            assert float(codes[row, f]) == pytest.approx(e.act, abs=1e-3)
            ctx_rows = ((acts.pair == e.pair) & (acts.modality == TEXT)).nonzero().squeeze(1)
            assert e.context == pytest.approx(codes[ctx_rows, f].tolist(), abs=1e-3)
        best_per_image = {}
        for r in range(len(acts)):
            if acts.modality[r] == IMAGE:
                p = int(acts.pair[r])
                best_per_image[p] = max(best_per_image.get(p, 0.0), float(codes[r, f]))
        expected_img = [v for v in sorted(best_per_image.values(), reverse=True)[:3] if v > 0]
        assert [e.act for e in card.top_images] == pytest.approx(expected_img, abs=1e-3)
        for e in card.top_images:
            assert max(e.heatmap) == pytest.approx(e.act, abs=1e-3)
            assert e.heatmap[e.patch] == pytest.approx(e.act, abs=1e-3)
        on = (codes[:, f] > 0).float()
        assert card.density == pytest.approx(float(on.mean()), abs=1e-6)
        assert sum(card.hist_counts) == int(on.sum())
        checked += bool(card.top_text or card.top_images)
    assert checked > 3


def test_feature_store_round_trips_through_disk(tiny_store, tmp_path):
    _, _, store = tiny_store
    sae_v.save_store(store, tmp_path)
    again = sae_v.load_store(tmp_path)
    assert again.to_dict() == json.loads(json.dumps(store.to_dict()))
    assert isinstance(again.features[0], sae_v.FeatureCard)


def test_neighbours_are_sorted_decoder_cosines(tiny_store):
    sae, _, store = tiny_store
    w = torch.nn.functional.normalize(sae.W_dec.detach(), dim=1)
    card = store.features[0]
    values = [n.value for n in card.neighbours]
    assert values == sorted(values, reverse=True)
    for n in card.neighbours:
        assert float(w[0] @ w[int(n.key)]) == pytest.approx(n.value, abs=1e-3)
    best_other = max(float(w[0] @ w[j]) for j in range(1, w.shape[0]))
    assert values[0] == pytest.approx(best_other, abs=1e-3)


def test_explain_input_lists_features_per_patch_and_token(tiny_store, tiny_llava, llava_pairs):
    sae, _, store = tiny_store
    image = llava_pairs.image(0)
    result = sae_v.explain_input(tiny_llava, sae, store.meta, "w1 w2 w3", image)
    acts = sae_v.collect_activations(
        tiny_llava, sae_v.PairSet("", 0, tiny_llava.info.image_size, [sae_v.Pair("w1 w2 w3")]), 1, images=[image])
    codes = sae_v.encode(sae, sae_v.scaled(acts, store.meta.scales))
    assert result.tokens == ["w1", "w2", "w3"]
    assert len([p for p in result.positions if p.modality == IMAGE]) == tiny_llava.info.image_tokens
    first = result.positions[0]
    best = int(codes[0].argmax())
    if codes[0].max() > 0:
        assert first.features[0].key == str(best)
    assert float(result.totals[0].value) == pytest.approx(float(codes.max()), abs=1e-3)


def test_explain_input_rejects_an_image_for_a_text_only_model(tiny_llama):
    from PIL import Image

    params = sae_v.TrainParams(d_sae=16, k=2, steps=5, batch_size=64)
    sae = sae_v.train_sae(torch.randn(300, tiny_llama.info.hidden_size), params)
    meta = sae_v.SaeMeta(model="tiny", layer=0, d_in=tiny_llama.info.hidden_size, train=params, dataset="noise",
                         n_pairs=0, n_tokens=0, fve=0, l0=0, dead=0)
    with pytest.raises(ValueError, match="text-only"):
        sae_v.explain_input(tiny_llama, sae, meta, "w1 w2", Image.new("RGB", (8, 8)))
    result = sae_v.explain_input(tiny_llama, sae, meta, "w1 w2")
    assert result.grid == 0 and all(p.modality == TEXT for p in result.positions)


# ---------------------------------------------------------------------------------------------
# Shapes World ground truth


def test_caption_words_carry_the_attributes_stated_so_far():
    tokens = "describe : there is a large red circle at the top left . there is a small blue square .".split()
    concepts = sae_v.ShapesDataset.text_concepts(tokens)
    by_word = dict(zip(range(len(tokens)), concepts))
    assert by_word[0] == set()
    assert by_word[6] == {"size:large", "colour:red"}  # "red"
    assert by_word[7] == {"size:large", "colour:red", "shape:circle"}
    assert "position:top left" in by_word[10] and "position:top left" in by_word[11]
    assert by_word[13] == set()  # "there" starts the next object
    assert by_word[17] == {"size:small", "colour:blue"}


def test_patches_carry_the_attributes_of_the_object_under_them():
    from analysis.zoo import shapes_world as sw

    seed = next(s for s in range(1000) if any(o.size == "large" for o in sw.generate_scene(s).objects))
    scene = sw.generate_scene(seed)
    obj = next(o for o in scene.objects if o.size == "large")
    grid = 8
    concepts = sae_v.ShapesDataset.patch_concepts(seed, grid)
    row, col = divmod(obj.cell, 3)
    centre = int((row + 0.5) * grid / 3) * grid + int((col + 0.5) * grid / 3)
    assert f"colour:{obj.colour}" in concepts[centre] and f"shape:{obj.shape}" in concepts[centre]
    occupied = {o.cell for o in scene.objects}
    empty_cell = next(c for c in range(9) if c not in occupied)
    r, c = divmod(empty_cell, 3)
    assert concepts[int((r + 0.5) * grid / 3) * grid + int((c + 0.5) * grid / 3)] == set()


def test_on_a_three_by_three_grid_each_patch_is_its_cells_object():
    from analysis.zoo import shapes_world as sw

    for seed in range(40):
        scene = sw.generate_scene(seed)
        concepts = sae_v.ShapesDataset.patch_concepts(seed, 3)
        by_cell = {o.cell: o for o in scene.objects}
        for cell in range(9):
            obj = by_cell.get(cell)
            expected = set() if obj is None else {f"colour:{obj.colour}", f"shape:{obj.shape}",
                                                  f"size:{obj.size}", f"position:{obj.position}"}
            assert concepts[cell] == expected, (seed, cell)


def test_concept_precision_is_the_share_of_tokens_with_the_concept():
    concepts = [{"colour:red"}, {"colour:red", "shape:circle"}, {"shape:circle"}, set()]
    c = sae_v.concept_precision([0, 1, 2, 3], concepts)
    assert c.precision == pytest.approx(0.5) and c.support == 4
    both = sae_v.concept_in_both([0, 1], [1, 2], concepts)
    assert both.name == "colour:red" and both.precision == pytest.approx(0.5)  # 1.0 in text, 0.5 in image


def test_cli_trains_and_prints_json(tiny_llava_dir, tmp_path, capsys):
    code = sae_v.cli(["--model", f"local:{tiny_llava_dir}", "--layer", "1", "--d-sae", "16", "--k", "2",
                      "--steps", "20", "--train-pairs", "8", "--eval-pairs", "6", "--out", str(tmp_path / "s"),
                      "--rank", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["meta"]["layer"] == 1 and out["summary"]["features"] == 16
    assert len(out["meta"]["model_fingerprint"]) == 16
    assert set(out["ranking"]) == {"roc_auc", "roc_auc_weighted", "precision", "recall"}


# ---------------------------------------------------------------------------------------------
# The committed demo SAE cannot drift from its model


DEMO = sae_v.SAE_ROOT / "shapes-vlm"


@pytest.mark.skipif(not list(DEMO.glob("layer*/" + sae_v.STORE_FILE)), reason="demo SAE not built")
def test_demo_store_matches_a_recomputation_from_the_committed_weights():
    from analysis.models import ModelSpec, load_model, zoo_models

    if "shapes-vlm" not in zoo_models():
        pytest.skip("shapes-vlm not built")
    folder = sorted(DEMO.glob("layer*/" + sae_v.STORE_FILE))[0].parent
    handle = load_model(ModelSpec("zoo", "shapes-vlm"))
    sae, meta = sae_v.load_sae(folder)
    store = sae_v.load_store(folder)
    assert not sae_v.is_stale(handle, meta), (
        "the demo SAE was trained on other shapes-vlm weights; rebuild it with `python -m analysis sae "
        f"--model zoo:shapes-vlm --layer {meta.layer} --out {folder}`")
    # re-run the model on the pairs behind the strongest examples of a few live features
    cards = [c for c in store.features if c.top_text and c.top_images][:4]
    wanted = sorted({c.top_text[0].pair for c in cards} | {c.top_images[0].pair for c in cards})
    subset = sae_v.PairSet(store.pairs.dataset, store.pairs.seed, store.pairs.image_size,
                           [store.pairs.pairs[i] for i in wanted])
    acts = sae_v.collect_activations(handle, subset, meta.layer)
    codes = sae_v.encode(sae, sae_v.scaled(acts, meta.scales))
    for card in cards:
        t, im = card.top_text[0], card.top_images[0]
        row = ((acts.pair == wanted.index(t.pair)) & (acts.modality == TEXT) & (acts.index == t.index)).nonzero().item()
        assert float(codes[row, card.index]) == pytest.approx(t.act, rel=1e-3, abs=1e-3)
        rows = ((acts.pair == wanted.index(im.pair)) & (acts.modality == IMAGE)).nonzero().squeeze(1)
        assert codes[rows, card.index].tolist() == pytest.approx(im.heatmap, rel=1e-3, abs=1e-3)
    fve, l0, _ = sae_v.reconstruction_metrics(sae, sae_v.scaled(acts, meta.scales))
    assert fve > meta.fve - 0.1 and l0 == pytest.approx(meta.l0, rel=0.5)

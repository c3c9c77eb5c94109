"""SAE-V analysis: statistics against brute-force references, save/load, feature store, activations."""
from __future__ import annotations

import json
import math

import pytest
import torch

from analysis import sae_v
from analysis.sae_v import IMAGE, TEXT


# ---------------------------------------------------------------------------------------------
# References written from the official SAE-V scripts (PKU-Alignment SAELens-V; file and line in
# docs/readme_sae.md), in plain float64 Python loops. They never call analysis.sae_v.


def official_omega_reference(acts, codes, modality, top_k=30, text_image_top_k=5, per_token=50, drop_zeros=False):
    """scripts/cosimilarity.py, process_activations_and_save, step by step.

    1. every token lists its `per_token` strongest features (activation_visualization.cal_top_cosimilarity:
       torch.topk(feature_act, k=50)); 2. each feature collects (activation, token, modality) from those
       lists, sorts by activation (descending) and keeps `top_k`; 3. a feature whose list is neither all
       text nor all image gets omega only with >= `text_image_top_k` text and image entries: the mean
       cosine of the first `text_image_top_k` text x image raw residuals (denominator 0 counts 0).
    Returns {feature: omega} for the features that get one.

    `drop_zeros`: leave out the zero activations that the per-token top-50 admits when a token has
    fewer than 50 active features (torch.topk ties at 0, in no defined order); only matters for a
    feature with fewer than `top_k` active tokens (docs/readme_sae.md, "Deviations")."""
    n_tok, n_feat = codes.shape
    values, indices = codes.double().topk(min(per_token, n_feat), dim=1)  # the official script's torch.topk
    values, indices = values.tolist(), indices.tolist()
    resid = acts.double().tolist()
    mods = modality.tolist()
    features_top = [[] for _ in range(n_feat)]
    for r in range(n_tok):
        for v, f in zip(values[r], indices[r]):
            if drop_zeros and v <= 0:
                continue
            features_top[f].append((v, r, "text" if mods[r] == TEXT else "image"))
    out = {}
    for f in range(n_feat):
        tokens = sorted(features_top[f], key=lambda x: -x[0])[:top_k]
        if not tokens:
            continue
        text = [r for _, r, kind in tokens if kind == "text"]
        image = [r for _, r, kind in tokens if kind == "image"]
        if len(text) == len(tokens) or len(image) == len(tokens):
            continue
        if len(text) >= text_image_top_k and len(image) >= text_image_top_k:
            cosines = []
            for a in text[:text_image_top_k]:
                for b in image[:text_image_top_k]:
                    dot = sum(x * y for x, y in zip(resid[a], resid[b]))
                    den = math.sqrt(sum(x * x for x in resid[a])) * math.sqrt(sum(y * y for y in resid[b]))
                    cosines.append(0.0 if den == 0 else dot / den)
            out[f] = sum(cosines) / len(cosines)
    return out


def official_score_reference(codes, modality, pair, n_pairs, omega, active_above=1.0):
    """s_i: activation_visualization.separate_feature (features > 1 on some text token, and on some
    image token: their intersection) and tutorials/data_filter.ipynb (sum of omega over those
    co-occurring features that are in the omega file)."""
    rows = codes.double().tolist()
    out = []
    for p in range(n_pairs):
        text_union, image_union = set(), set()
        for r in range(len(rows)):
            if int(pair[r]) != p:
                continue
            hits = {f for f, v in enumerate(rows[r]) if v > active_above}
            (text_union if int(modality[r]) == TEXT else image_union).update(hits)
        out.append(sum(omega[f] for f in text_union & image_union if f in omega))
    return out


def mann_whitney_auc(positive, negative):
    """P(positive > negative) + half the ties, by counting every pair."""
    wins = 0.0
    for a in positive:
        for b in negative:
            wins += 1.0 if a > b else 0.5 if a == b else 0.0
    return wins / (len(positive) * len(negative))


def random_sparse(seed, n_pairs=40, text=6, image=9, d=10, k=5):
    """TopK-like codes (k active features per token, fewer than the official 50-per-token cut) on
    random residuals, 28 features: 0-5 frequent on both modalities, 6-11 text only, 12-17 image only,
    18-23 on both, 24-27 strong on text and weak (just above 1) on three image tokens each, so that
    they fire in both modalities without 5 image tokens among their top 30. Every feature fires on more than 30 tokens, so no zero activation enters a top-30
    list (where the official script would count tokens the feature does not fire on; see
    docs/readme_sae.md)."""
    g = torch.Generator().manual_seed(seed)
    modality, pair = [], []
    for p in range(n_pairs):
        modality += [TEXT] * text + [IMAGE] * image
        pair += [p] * (text + image)
    modality, pair = torch.tensor(modality), torch.tensor(pair)
    n = len(modality)
    acts = torch.randn(n, d, generator=g, dtype=torch.float64).float()
    codes = torch.zeros(n, 28)
    allowed = {TEXT: list(range(0, 12)) + list(range(18, 24)), IMAGE: list(range(0, 6)) + list(range(12, 24))}
    for r in range(n):
        choices = torch.tensor(allowed[int(modality[r])])
        weights = torch.where(choices < 6, 2.0, 1.0)
        pick = choices[torch.multinomial(weights, k, replacement=False, generator=g)]
        codes[r, pick] = torch.rand(k, generator=g) * 3.0
    text_rows = (modality == TEXT).nonzero().squeeze(1)
    image_rows = (modality == IMAGE).nonzero().squeeze(1)
    for f in range(24, 28):
        codes[text_rows[torch.randperm(len(text_rows), generator=g)[:40]], f] = 2.0 + torch.rand(40, generator=g)
        codes[image_rows[torch.randperm(len(image_rows), generator=g)[:3]], f] = 1.2 + 0.2 * torch.rand(3, generator=g)
    assert int((codes > 0).sum(0).min()) > 30
    return acts, codes, modality, pair, n_pairs


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


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_official_omega_matches_the_official_script_on_random_codes(seed):
    acts, codes, modality, _, _ = random_sparse(seed)
    ref = official_omega_reference(acts, codes, modality)
    omega, has = sae_v.scores.score_rule("official").weights(acts, codes, modality)
    assert {f for f in range(codes.shape[1]) if has[f]} == set(ref)
    assert 0 < len(ref) < codes.shape[1]  # the rule includes some features and excludes others
    for f in range(codes.shape[1]):
        assert float(omega[f]) == pytest.approx(ref.get(f, 0.0), abs=1e-5)


@pytest.mark.parametrize("seed,cut", [(0, 1), (1, 1), (2, 2), (3, 1)])
def test_the_per_token_cut_matches_the_official_top_k_lists(seed, cut):
    """With fewer features per token kept than fire (the official cut is 50; here 1-2 of 5 active), omega and
    which features have one follow the official per-token lists; the official 50 leaves 5-active codes whole."""
    acts, codes, modality, _, _ = random_sparse(seed)
    ref = official_omega_reference(acts, codes, modality, per_token=cut)
    omega, has = sae_v.score_rule("official", token_top=cut).weights(acts, codes, modality)
    assert {f for f in range(codes.shape[1]) if has[f]} == set(ref)
    for f in range(codes.shape[1]):
        assert float(omega[f]) == pytest.approx(ref.get(f, 0.0), abs=1e-5)
    whole = sae_v.score_rule("official", token_top=0).weights(acts, codes, modality)
    official = sae_v.score_rule("official").weights(acts, codes, modality)  # token_top = 50 by default
    assert sae_v.score_rule("official").token_top == 50
    assert torch.equal(whole[0], official[0]) and torch.equal(whole[1], official[1])
    assert ref != official_omega_reference(acts, codes, modality)  # the cut changes something on these codes


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_official_pair_scores_match_the_official_scripts_on_random_codes(seed):
    acts, codes, modality, pair, n_pairs = random_sparse(seed)
    omega_ref = official_omega_reference(acts, codes, modality)
    ref = official_score_reference(codes, modality, pair, n_pairs, omega_ref)
    rule = sae_v.scores.score_rule("official")
    omega, has = rule.weights(acts, codes, modality)
    score, _, shared = sae_v.pair_scores(codes, modality, pair, omega, n_pairs, rule.cooccur_threshold, has)
    assert score.tolist() == pytest.approx(ref, abs=1e-5)
    # the features left out matter here: summing every shared feature's cosine would differ
    everything, _ = sae_v.scores.score_rule("all-shared").weights(acts, codes, modality)
    loose, _, _ = sae_v.pair_scores(codes, modality, pair, everything, n_pairs, 1.0)
    assert loose.tolist() != pytest.approx(ref, abs=1e-3)


def normalised_score_reference(codes, modality, pair, n_pairs, omega, active_above=1.0):
    """The labelled `normalised` variant from its definition: the official numerator (sum of omega over
    features with an omega active on a text and an image token of the pair) over the sum of |omega| of
    the features with an omega active on a text *or* an image token; 0 when nothing is active."""
    rows = codes.double().tolist()
    out = []
    for p in range(n_pairs):
        text_union, image_union = set(), set()
        for r in range(len(rows)):
            if int(pair[r]) == p:
                hits = {f for f, v in enumerate(rows[r]) if v > active_above and f in omega}
                (text_union if int(modality[r]) == TEXT else image_union).update(hits)
        top = sum(omega[f] for f in text_union & image_union)
        bottom = sum(abs(omega[f]) for f in text_union | image_union)
        out.append(top / bottom if bottom > 0 else 0.0)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_normalised_variant_divides_the_official_sum_by_the_omega_active_on_either_side(seed):
    acts, codes, modality, pair, n_pairs = random_sparse(seed)
    # a pair whose caption alone has a feature with an omega, and one with nothing active at all
    caption0 = (pair == 0) & (modality == TEXT)
    codes[caption0, 0] += torch.linspace(3.0, 3.5, int(caption0.sum()))  # distinct: no ties in the top 30
    codes[pair == n_pairs - 1] = 0.0
    # and a text-only feature (weak on every caption token, so its top 30 are all text: no omega),
    # strongly active on pair 1's caption: it must not enter the denominator
    text = modality == TEXT
    extra = torch.zeros(len(modality))
    extra[text] = torch.linspace(0.2, 0.6, int(text.sum()))
    extra[(pair == 1) & text] += 2.0
    codes = torch.cat([codes, extra[:, None]], dim=1)
    omega_ref = official_omega_reference(acts, codes, modality)
    assert codes.shape[1] - 1 not in omega_ref
    ref = normalised_score_reference(codes, modality, pair, n_pairs, omega_ref)
    rule = sae_v.scores.score_rule("normalised")
    omega, has = rule.weights(acts, codes, modality)
    assert {f for f in range(codes.shape[1]) if has[f]} == set(omega_ref)  # the official omega
    score, _, _ = rule.pair_scores(codes, modality, pair, omega, n_pairs, rule.cooccur_threshold, has)
    assert score.tolist() == pytest.approx(ref, abs=1e-5)
    assert score[-1] == 0.0 and 0 < len({round(v, 4) for v in ref}) > 2
    official = official_score_reference(codes, modality, pair, n_pairs, omega_ref)
    assert score.tolist() != pytest.approx(official, abs=1e-3)
    assert "Variant" in sae_v.SCORE_RULES.label("normalised") and sae_v.score_rule(None).name == "official"


def test_omega_needs_five_text_and_five_image_tokens_among_the_top_thirty():
    # feature 0: 25 strong text tokens and 5 weaker image tokens -> in its top 30: 25 text + 5 image
    # feature 1: 26 strong text tokens and 5 weaker image tokens -> 26 text + 4 image: no omega
    modality = torch.tensor([TEXT] * 30 + [IMAGE] * 10)
    acts = torch.randn(40, 8, generator=torch.Generator().manual_seed(5))
    codes = torch.zeros(40, 2)
    codes[:25, 0] = torch.linspace(5.0, 4.0, 25)
    codes[30:35, 0] = torch.linspace(1.0, 0.8, 5)
    codes[:26, 1] = torch.linspace(5.0, 4.0, 26)
    codes[30:35, 1] = torch.linspace(1.0, 0.8, 5)
    omega, has = sae_v.scores.score_rule("official").weights(acts, codes, modality)
    ref = official_omega_reference(acts, codes, modality)
    assert has.tolist() == [True, False] and set(ref) == {0}
    assert float(omega[0]) == pytest.approx(ref[0], abs=1e-5) and float(omega[1]) == 0.0
    # the variant gives both an omega
    _, every = sae_v.scores.score_rule("all-shared").weights(acts, codes, modality)
    assert every.tolist() == [True, True]


def test_official_scores_ignore_shared_features_without_omega_and_weak_activations():
    modality = torch.tensor([TEXT, IMAGE, TEXT, IMAGE])
    pair = torch.tensor([0, 0, 1, 1])
    codes = torch.tensor([[2.0, 3.0, 0.5], [2.0, 3.0, 0.5], [0.5, 3.0, 0.0], [2.0, 3.0, 0.0]])
    omega = torch.tensor([0.3, 0.2, 0.4])
    has = torch.tensor([True, False, True])
    score, _, shared = sae_v.pair_scores(codes, modality, pair, omega, 2, threshold=1.0, has_omega=has)
    assert score.tolist() == pytest.approx([0.3, 0.0])  # f1 has no omega; f2 and pair 1's f0 are <= 1
    assert shared.tolist() == [1, 0]
    ref = official_score_reference(codes, modality, pair, 2, {0: 0.3, 2: 0.4})
    assert score.tolist() == pytest.approx(ref)


def test_variant_all_shared_is_labelled_and_never_the_default():
    rules = sae_v.scores.SCORE_RULES
    assert rules.names()[0] == "official" and sae_v.StoreParams().score_rule == "official"
    assert sae_v.scores.score_rule(None).name == "official"
    assert "Variant" in rules.label("all-shared")
    with pytest.raises(sae_v.SettingsError, match="score rule"):
        sae_v.scores.score_rule("nope")
    with pytest.raises(sae_v.SettingsError, match="co-occurrence threshold"):
        sae_v.scores.OfficialRule(cooccur_threshold=-1)


def test_variant_omega_is_the_mean_top_five_cosine_of_every_feature_firing_in_both():
    """The labelled variant (our earlier reading): omega for any feature that fires once in each modality."""
    acts, codes, modality, _, _ = planted()
    omega, has = sae_v.scores.score_rule("all-shared").weights(acts, codes, modality)
    unit = torch.nn.functional.normalize(acts.double(), dim=1)
    for f in range(codes.shape[1]):
        text = sorted((r for r in range(len(modality)) if modality[r] == TEXT and codes[r, f] > 0),
                      key=lambda r: -float(codes[r, f]))[:5]
        image = sorted((r for r in range(len(modality)) if modality[r] == IMAGE and codes[r, f] > 0),
                       key=lambda r: -float(codes[r, f]))[:5]
        assert bool(has[f]) == bool(text and image)
        expected = (sum(float(unit[a] @ unit[b]) for a in text for b in image) / (len(text) * len(image))
                    if text and image else 0.0)
        assert float(omega[f]) == pytest.approx(expected, abs=1e-5)
    assert has.tolist() == [True, True, False, False]  # feature 1 fires weakly on 2 image tokens
    assert omega[0] > 0.8  # shared direction planted


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


def test_roc_auc_counts_pairs_and_ties():
    assert sae_v.roc_auc([3.0, 2.0], [1.0, 2.0]) == pytest.approx(0.875)
    assert sae_v.roc_auc([1.0], [2.0]) == 0.0
    assert sae_v.roc_auc([], [1.0]) is None
    g = torch.Generator().manual_seed(3)
    pos = torch.randint(0, 6, (40,), generator=g).double().tolist()
    neg = torch.randint(0, 6, (30,), generator=g).double().tolist()
    assert sae_v.roc_auc(pos, neg) == pytest.approx(mann_whitney_auc(pos, neg))


@pytest.mark.parametrize("seed", [0, 1])
def test_ranking_puts_higher_scores_first_and_measures_separation(seed):
    acts, codes, modality, pair, n_pairs = random_sparse(seed)
    corrupted = [p % 3 == 0 for p in range(n_pairs)]
    pairs = sae_v.PairSet(dataset="noise", seed=0, image_size=None,
                          pairs=[sae_v.Pair(text=f"p{i}", corrupted=c) for i, c in enumerate(corrupted)])
    a = sae_v.Activations(acts=acts, modality=modality, pair=pair, index=torch.zeros_like(pair),
                          tokens=[[]] * n_pairs, layer=0, grid=0)
    meta = sae_v.SaeMeta(model="m", layer=0, d_in=acts.shape[1], train=sae_v.TrainParams(), dataset="noise",
                         n_pairs=0, n_tokens=0, fve=0, l0=0, dead=0)
    omega, has = sae_v.scores.score_rule("official").weights(acts, codes, modality)
    ranking = sae_v.rank_pairs(meta, omega, codes, a, pairs, has_omega=has)
    # independent: scores from the official scripts, AUC by counting pairs
    ref = official_score_reference(codes, modality, pair, n_pairs, official_omega_reference(acts, codes, modality))
    assert {r.pair: r.score for r in ranking.rows} == pytest.approx(dict(enumerate(ref)), abs=1e-3)
    assert [r.score for r in ranking.rows] == pytest.approx(sorted(ref, reverse=True), abs=1e-3)
    assert [r.rank for r in ranking.rows] == list(range(1, n_pairs + 1))
    clean = [s for s, c in zip(ref, corrupted) if not c]
    bad = [s for s, c in zip(ref, corrupted) if c]
    assert ranking.roc_auc == pytest.approx(mann_whitney_auc(clean, bad), abs=1e-9)
    assert ranking.rule == "official" and ranking.threshold == 1.0


def test_by_kind_separates_each_corruption_from_the_clean_pairs():
    """AUC per kind of corruption against the clean pairs only, by counting pairs; mean ranks."""
    g = torch.Generator().manual_seed(3)
    kinds = ["clean", "other-scene", "swapped-attribute"] * 14
    scores = torch.randint(0, 8, (len(kinds),), generator=g).double().tolist()
    rows = [sae_v.PairScore(pair=i, text="", corrupted=k != "clean", kind=k, score=s, weighted=s / 10, shared=i % 5)
            for i, (k, s) in enumerate(zip(kinds, scores))]
    rows.sort(key=lambda r: (-r.score, r.pair))
    for rank, r in enumerate(rows, 1):
        r.rank = rank
    out = sae_v.by_kind(rows)
    assert list(out) == ["clean", "other-scene", "swapped-attribute"]
    clean = [s for k, s in zip(kinds, scores) if k == "clean"]
    for kind in ("other-scene", "swapped-attribute"):
        bad = [s for k, s in zip(kinds, scores) if k == kind]
        assert out[kind]["roc_auc_vs_clean"] == pytest.approx(mann_whitney_auc(clean, bad), abs=1e-12)
        assert out[kind]["pairs"] == 14
    assert "roc_auc_vs_clean" not in out["clean"]
    ranks = {r.pair: r.rank for r in rows}
    for kind in out:
        mine = [ranks[i] for i, k in enumerate(kinds) if k == kind]
        assert out[kind]["mean_rank"] == pytest.approx(sum(mine) / len(mine), abs=0.05)
        mine = [(s, i % 5) for i, (k, s) in enumerate(zip(kinds, scores)) if k == kind]
        assert out[kind]["mean_score"] == pytest.approx(sum(s for s, _ in mine) / len(mine), abs=1e-4)
        assert out[kind]["mean_weighted"] == pytest.approx(sum(s / 10 for s, _ in mine) / len(mine), abs=1e-4)
        assert out[kind]["mean_shared"] == pytest.approx(sum(c for _, c in mine) / len(mine), abs=0.005)


def test_keep_fraction_reports_precision_and_recall_of_removed_corrupted_pairs():
    rows = [sae_v.PairScore(pair=i, text="", corrupted=c, kind="", score=0.0, weighted=0.0, shared=0, rank=i + 1)
            for i, c in enumerate([False, False, True, False, True, True, False, True])]
    out = sae_v.scores.keep_top(rows, 0.5)  # keep 4, remove the last 4: 3 of them corrupted
    assert (out["kept"], out["removed"]) == (4, 4)
    assert out["precision"] == pytest.approx(3 / 4) and out["recall"] == pytest.approx(3 / 4)
    assert out["clean_share_kept"] == pytest.approx(3 / 4)
    assert sae_v.scores.keep_top(rows, 1.0)["precision"] is None
    with pytest.raises(sae_v.SettingsError):
        sae_v.scores.keep_top(rows, 1.5)


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
    prompt = sae_v.pair_prompt(tiny_llava, llava_pairs.pairs[p].text)  # the model's caption prompt, then the text
    assert prompt.startswith("<image>") and prompt.endswith(llava_pairs.pairs[p].text)
    enc = tiny_llava.processor(images=[sae_v.render_pair(llava_pairs, p)], text=[prompt], return_tensors="pt")
    with tiny_llava.session():
        hidden = tiny_llava.model(**enc, output_hidden_states=True).hidden_states[1][0]
    img_id = tiny_llava.model.config.image_token_id
    image_pos = (enc["input_ids"][0] == img_id).nonzero().squeeze(1)
    special = torch.tensor(tiny_llava.tokenizer.all_special_ids)
    text_pos = ((enc["input_ids"][0] != img_id) & ~torch.isin(enc["input_ids"][0], special)).nonzero().squeeze(1)
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


def test_a_store_from_before_score_rules_loads_as_the_variant(tiny_store, tmp_path):
    import gzip

    _, _, store = tiny_store
    data = store.to_dict()
    del data["params"]["score_rule"]
    for card in data["features"]:
        del card["has_omega"]
    with gzip.open(tmp_path / sae_v.STORE_FILE, "wt", encoding="utf-8") as fh:
        json.dump(data, fh)
    old = sae_v.load_store(tmp_path)
    assert old.params.score_rule == "all-shared"
    assert [c.has_omega for c in old.features] == [c.omega != 0 for c in old.features]


def test_rebuilt_store_under_the_variant_gives_more_features_an_omega(tiny_llava, tiny_store, tmp_path):
    sae, acts, store = tiny_store
    assert store.params.score_rule == "official"
    assert all(c.has_omega == (c.label == "cross-modal") for c in store.features)
    variant = sae_v.build_feature_store(tiny_llava, sae, store.meta, acts, store.pairs,
                                        sae_v.StoreParams(top_n=6, top_images=3, score_rule="all-shared"))
    assert sum(c.has_omega for c in variant.features) >= sum(c.has_omega for c in store.features)
    assert variant.summary()["score_rule"] == "all-shared"


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
    image = sae_v.render_pair(llava_pairs, 0)
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
    from analysis.world import shapes_world as sw

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
    from analysis.world import shapes_world as sw

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
    from analysis.framework.precompute import weights_fingerprint

    assert out["meta"]["model_fingerprint"] == weights_fingerprint(tiny_llava_dir)  # the app's one fingerprint
    assert {"roc_auc", "roc_auc_weighted", "precision", "recall"} <= set(out["ranking"])
    assert out["ranking"]["rule"] == "official" and out["summary"]["score_rule"] == "official"
    assert set(out["ranking"]["keep"]) >= {"precision", "recall", "kept", "removed"}
    assert "clean" in out["ranking"]["by_kind"]


@pytest.mark.parametrize("args", [
    ["--layer", "99"], ["--layer", "-1"], ["--d-sae", "0"], ["--k", "0"], ["--steps", "abc"], ["--rule", "nope"],
    ["--keep", "2"], ["--train-pairs", "1"], ["--arch", "nope"], ["--feature", "-3"],
])
def test_cli_out_of_range_arguments_print_one_error_line(args, tiny_llava_dir, capsys):
    from analysis.__main__ import main

    code = main(["sae", "--model", f"local:{tiny_llava_dir}", *args])
    err = capsys.readouterr().err
    assert code != 0
    assert [line for line in err.splitlines() if line.startswith("error:")] and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1


# ---------------------------------------------------------------------------------------------
# The committed demo SAE cannot drift from its model


DEMO = sae_v.SAE_ROOT / "shapes-vlm"


def _demo():
    """The committed demo SAE's folder, shapes-vlm, the SAE, its metadata and its feature store."""
    from analysis.model_access.models import ModelSpec, load_model, zoo_models

    if "shapes-vlm" not in zoo_models():
        pytest.skip("shapes-vlm not built")
    folder = sorted(DEMO.glob("layer*/" + sae_v.STORE_FILE))[0].parent
    sae, meta = sae_v.load_sae(folder)
    return folder, load_model(ModelSpec("zoo", "shapes-vlm")), sae, meta, sae_v.load_store(folder)


@pytest.mark.skipif(not list(DEMO.glob("layer*/" + sae_v.STORE_FILE)), reason="demo SAE not built")
def test_demo_store_matches_a_recomputation_from_the_committed_weights():
    folder, handle, sae, meta, store = _demo()
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


@pytest.mark.skipif(not list(DEMO.glob("layer*/" + sae_v.STORE_FILE)), reason="demo SAE not built")
def test_demo_store_omega_and_scores_match_the_official_scripts():
    """On the committed demo SAE and its 300 held-out pairs: the stored omega (official rule) and the
    ranking's s_i equal the references written from the official scripts."""
    _, handle, sae, meta, store = _demo()
    assert store.params.score_rule == "official"
    acts = sae_v.collect_activations(handle, store.pairs, meta.layer)
    codes = sae_v.encode(sae, sae_v.scaled(acts, meta.scales))
    ref = official_omega_reference(acts.acts, codes, acts.modality, drop_zeros=True)
    assert {c.index for c in store.features if c.has_omega} == set(ref)
    for c in store.features:
        assert c.omega == pytest.approx(ref.get(c.index, 0.0), abs=2e-3)
    omega, has = sae_v.store_weights(store)
    ranking = sae_v.rank_pairs(meta, omega, codes, acts, store.pairs, has_omega=has)
    scores = official_score_reference(codes, acts.modality, acts.pair, len(store.pairs.pairs), ref)
    assert {r.pair: r.score for r in ranking.rows} == pytest.approx(dict(enumerate(scores)), abs=1e-2)
    clean = [s for s, p in zip(scores, store.pairs.pairs) if not p.corrupted]
    bad = [s for s, p in zip(scores, store.pairs.pairs) if p.corrupted]
    assert ranking.roc_auc == pytest.approx(mann_whitney_auc(clean, bad), abs=0.01)



def test_a_new_dataset_is_one_registered_class_and_make_pairs_uses_it():
    calls = []

    @sae_v.DATASETS.register
    class CountingDataset(sae_v.Dataset):
        name, label = "counting-test", "Counting (test)"

        def pairs(self, handle, n, seed, corrupted=0.0):
            calls.append((n, seed))
            return sae_v.PairSet(dataset=self.name, seed=seed, image_size=None, pairs=[])

    try:
        assert sae_v.DATASETS.label("counting-test") == "Counting (test)"
        out = sae_v.make_pairs(None, "counting-test", 3, 7)
        assert out.dataset == "counting-test" and calls == [(3, 7)]
        assert type(sae_v.dataset_for("counting-test")) is CountingDataset
    finally:
        sae_v.DATASETS.unregister("counting-test")
    with pytest.raises(ValueError, match="Unknown dataset"):
        sae_v.make_pairs(None, "counting-test", 3, 7)

"""SAE-V on your own SAE and your own data (issue 33) and labels that mean something (issue 31):

- an SAE saved by sae-lens itself (not trained here) is loaded, checked against the model (one message when
  it does not fit), and gets a feature store on the chosen data;
- a data folder (captions.jsonl / .csv, Parquet, a `datasets` folder) is read with every bad row reported;
  the ranking streams in batches, resumes after a stop, and exports the ranked list and the kept subset in
  the input's own format;
- generated pairs flagged as corrupted really are; the noise pairs carry no labels, so nothing reports a
  ROC AUC on them;
- steering adds exactly strength x decoder direction at the SAE's layer.
"""
from __future__ import annotations

import csv
import io
import json
import math

import pytest
import torch
from PIL import Image

from analysis import sae_v
from sae_lens_factory import cache, save_outside_sae, write_pair_folder  # noqa: F401  (tests/sae_lens_factory.py)


# ---------------------------------------------------------------------------------------------
# Fixtures: an SAE saved by sae-lens directly, and a folder of images with a few bad rows


@pytest.fixture(scope="module")
def outside_sae(model_root):
    return save_outside_sae(model_root / "outside-sae", d_in=32, hook="blocks.1.hook_resid_post")


@pytest.fixture(scope="module")
def pair_folder(model_root):
    return write_pair_folder(model_root / "my-pairs")


# ---------------------------------------------------------------------------------------------
# Outside SAEs: loading and fit checks


def test_hook_names_map_to_decoder_layers():
    assert sae_v.hook_layer("blocks.3.hook_resid_post") == 3
    assert sae_v.hook_layer("blocks.3.hook_resid_pre") == 2
    assert sae_v.hook_layer("model.layers.5") == 5
    assert sae_v.hook_layer("model.language_model.layers.1") == 1
    assert sae_v.hook_layer(None) is None
    with pytest.raises(sae_v.SaeFitError, match="not the residual stream"):
        sae_v.hook_layer("blocks.3.hook_mlp_out")


def test_an_sae_saved_by_sae_lens_loads_and_fits(tiny_llava, outside_sae):
    source = sae_v.locate(tiny_llava, str(outside_sae))
    assert source.outside and source.label == "sae-lens folder"
    sae, meta = sae_v.open_sae(tiny_llava, sae_v.SaeChoice(sae=str(outside_sae)))
    assert meta.layer == 1 and meta.d_in == 32 and meta.scales == [1.0, 1.0] and meta.train is None
    assert meta.architecture == "standard" and meta.hook_name == "blocks.1.hook_resid_post"


@pytest.mark.parametrize("d_in,hook,layer,message", [
    (48, "blocks.1.hook_resid_post", -1, "48-wide vectors .* 32-wide"),
    (32, "blocks.9.hook_resid_post", -1, "layers 0 to 1"),
    (32, "blocks.1.hook_attn_out", -1, "not the residual stream"),
    (32, "blocks.0.hook_resid_pre", -1, "embeddings"),
    (32, None, -1, "names no hook"),
    (32, "blocks.1.hook_resid_post", 0, "reads layer 1 .*not layer 0"),
])
def test_an_sae_that_does_not_fit_gets_one_clear_message(tiny_llava, model_root, d_in, hook, layer, message):
    folder = save_outside_sae(model_root / f"misfit-{d_in}-{hook}-{layer}", d_in=d_in, hook=hook)
    with pytest.raises(sae_v.SaeFitError, match=message):
        sae_v.open_sae(tiny_llava, sae_v.SaeChoice(sae=str(folder), layer=layer))


def test_an_sae_without_a_hook_reads_the_layer_chosen(tiny_llava, model_root):
    folder = save_outside_sae(model_root / "no-hook", d_in=32, hook=None)
    _, meta = sae_v.open_sae(tiny_llava, sae_v.SaeChoice(sae=str(folder), layer=0))
    assert meta.layer == 0


def test_a_folder_without_an_sae_or_outside_the_roots_is_refused(tiny_llava, model_root, tmp_path):
    (model_root / "empty-sae").mkdir(exist_ok=True)
    with pytest.raises(sae_v.SaeFitError, match="No sae-lens SAE"):
        sae_v.open_sae(tiny_llava, sae_v.SaeChoice(sae=str(model_root / "empty-sae")))
    with pytest.raises(sae_v.SettingsError, match="is not an SAE folder this server can read") as refused:
        sae_v.locate(tiny_llava, str(tmp_path))
    assert str(model_root) not in str(refused.value)  # never the list of allowed folders


def test_a_pretrained_release_offline_is_one_line(tiny_llava, monkeypatch):
    import sae_lens

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nmore lines")

    monkeypatch.setattr(sae_lens.SAE, "from_pretrained", offline)
    sae_v.sources._outside_sae.cache_clear()
    with pytest.raises(sae_v.SaeFitError, match=r"could not fetch sae-lens:gpt2-small-res-jb/blocks.1.hook_resid_pre: "
                                                r"We couldn't connect .*online") as caught:
        sae_v.open_sae(tiny_llava, sae_v.SaeChoice(sae="sae-lens:gpt2-small-res-jb/blocks.1.hook_resid_pre"))
    assert "\n" not in str(caught.value)


def test_the_outside_sae_store_is_built_on_the_data_and_cached(tiny_llava, outside_sae, pair_folder, cache):
    choice = sae_v.choose(tiny_llava, str(outside_sae), str(pair_folder), store_pairs=5, batch_pairs=3)
    store = sae_v.store_for(tiny_llava, choice)
    # rows 3 (missing image) and 5 (empty caption) never reach the model; row 7 does not decode
    assert [p.row for p in store.pairs.pairs] == [0, 1, 2, 4, 6]
    assert len(store.features) == 24 and store.meta.source == "sae-lens folder"
    x = sae_v.collect_activations(tiny_llava, store.pairs, 1)
    codes = sae_v.encode(sae_v.open_sae(tiny_llava, choice)[0], x.acts)
    assert store.features[0].density == pytest.approx(float((codes[:, 0] > 0).float().mean()), abs=1e-6)
    assert sae_v.sources.store_folder(tiny_llava, choice).joinpath(sae_v.STORE_FILE).is_file()
    again = sae_v.store_for(tiny_llava, choice)  # read back, not rebuilt
    assert again.to_dict() == json.loads(json.dumps(store.to_dict()))


# ---------------------------------------------------------------------------------------------
# Your data: rows, bad rows, formats


def test_every_bad_row_is_reported_with_its_reason(pair_folder):
    data = sae_v.userdata.load(str(pair_folder), "vlm")
    assert data.rows_read == 10 and data.pairs.labelled
    reasons = {s.row: s.reason for s in data.skipped}
    assert reasons == {3: "image 'gone.png' is missing", 5: "empty caption"}
    assert [p.row for p in data.pairs.pairs] == [0, 1, 2, 4, 6, 7, 8, 9]
    assert [p.corrupted for p in data.pairs.pairs] == [i % 3 == 1 for i in (0, 1, 2, 4, 6, 7, 8, 9)]


def test_csv_parquet_and_datasets_folders_give_the_same_pairs(pair_folder, model_root):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (pair_folder / "captions.jsonl").read_text().splitlines()]
    csv_dir = model_root / "as-csv"
    csv_dir.mkdir(exist_ok=True)
    for f in pair_folder.glob("*.png"):
        (csv_dir / f.name).write_bytes(f.read_bytes())
    with open(csv_dir / "captions.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["image", "caption", "corrupted"])
        writer.writeheader()
        writer.writerows(rows)
    blobs = [{"bytes": (pair_folder / r["image"]).read_bytes() if (pair_folder / r["image"]).is_file() else None,
              "path": r["image"]} for r in rows]
    table = pa.table({"image": blobs, "caption": [r["caption"] for r in rows],
                      "corrupted": [r["corrupted"] for r in rows]})
    pq.write_table(table, model_root / "pairs.parquet")
    features = datasets.Features({"image": datasets.Image(), "caption": datasets.Value("string"),
                                  "corrupted": datasets.Value("bool")})
    ds = datasets.Dataset.from_dict({"image": [b if b["bytes"] else None for b in blobs],
                                     "caption": [r["caption"] for r in rows],
                                     "corrupted": [r["corrupted"] for r in rows]}, features=features)
    ds.save_to_disk(str(model_root / "as-datasets"))
    base = sae_v.userdata.load(str(pair_folder), "vlm")
    for locator, layout in ((csv_dir, "csv"), (model_root / "pairs.parquet", "parquet"),
                            (model_root / "as-datasets", "arrow")):
        data = sae_v.userdata.load(str(locator), "vlm")
        assert data.layout == layout and data.rows_read == 10
        assert [p.text for p in data.pairs.pairs][:3] == [p.text for p in base.pairs.pairs][:3]
        assert {s.row for s in data.skipped} >= {6 if layout == "csv" else 5}  # the empty caption (a CSV: its line)
        if layout != "csv":  # images stored in the table: read when asked for, the missing one fails then
            image = sae_v.pair_image(data.pairs, 0)
            assert image.size == (32, 32) and image.getpixel((0, 0)) == (0, 255, 90)
            missing = next(i for i, p in enumerate(data.pairs.pairs) if p.row == 3)
            with pytest.raises(sae_v.SettingsError, match="gone.png. is missing|row 3 has no image"):
                sae_v.pair_image(data.pairs, missing)


def test_a_folder_without_captions_or_outside_the_roots_is_one_message(model_root, tmp_path):
    (model_root / "nothing-here").mkdir(exist_ok=True)
    with pytest.raises(sae_v.DataError, match="has no captions.jsonl"):
        sae_v.userdata.load(str(model_root / "nothing-here"))
    with pytest.raises(sae_v.SettingsError, match="is not data this server can read"):
        sae_v.userdata.load(str(tmp_path))
    texts = model_root / "only-texts"
    texts.mkdir(exist_ok=True)
    (texts / "texts.txt").write_text("w1 w2 w3\n\nw4 w5\n")
    with pytest.raises(sae_v.DataError, match="no image column"):
        sae_v.userdata.load(str(texts), "vlm")
    assert [p.text for p in sae_v.userdata.load(str(texts), "causal_lm").pairs.pairs] == ["w1 w2 w3", "w4 w5"]


def test_a_zip_upload_is_extracted_safely(cache, pair_folder):
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for f in sorted(pair_folder.iterdir()):
            zf.write(f, f"mine/{f.name}")
    locator = sae_v.save_zip(buf.getvalue(), "'mine.zip'")
    assert locator.startswith("upload:") and len(sae_v.userdata.load(locator).pairs.pairs) == 8
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../../escape.txt", "x")
    with pytest.raises(sae_v.DataError, match="unsafe entry"):
        sae_v.save_zip(evil.getvalue(), "'evil.zip'")
    with pytest.raises(sae_v.DataError, match="not a zip"):
        sae_v.save_zip(b"PK nonsense", "'broken.zip'")


# ---------------------------------------------------------------------------------------------
# Ranking your data: streamed, resumable, exported


def test_ranking_your_data_reports_bad_rows_measures_labels_and_resumes(tiny_llava, outside_sae, pair_folder, cache):
    params = sae_v.choose(tiny_llava, str(outside_sae), str(pair_folder), sae_v.RankParams, store_pairs=4,
                          batch_pairs=2, rules=sae_v.rule_settings(cooccur_threshold=0.0))
    calls = []

    def stop_after_two_batches(fraction, message):
        calls.append(message)
        if sum(m.startswith("pairs") for m in calls) == 3:  # reported as the third batch starts
            raise KeyboardInterrupt  # what a Stop does: the run ends at a progress update

    with pytest.raises(KeyboardInterrupt):
        sae_v.rank(tiny_llava, params, progress=stop_after_two_batches)
    resumed = sae_v.rank(tiny_llava, params)
    assert resumed.resumed == 4  # two batches of two pairs were kept on disk
    sae_v.filtering._checkpoint(tiny_llava, params).unlink()
    fresh = sae_v.rank(tiny_llava, params)
    assert fresh.resumed == 0 and [r.to_dict() for r in resumed.rows] == [r.to_dict() for r in fresh.rows]
    assert resumed.rows_read == 10 and len(resumed.rows) == 7
    assert {s.row: s.reason.split(" (")[0] for s in resumed.skipped} == {
        3: "image 'gone.png' is missing", 5: "empty caption", 7: "'img7.png' is not an image that can be read"}
    clean = [r.score for r in fresh.rows if not r.corrupted]
    bad = [r.score for r in fresh.rows if r.corrupted]
    wins = sum((a > b) + 0.5 * (a == b) for a in clean for b in bad)
    assert fresh.labelled and fresh.roc_auc == pytest.approx(wins / (len(clean) * len(bad)))


def test_exports_write_the_ranked_list_and_the_kept_rows_of_the_input(tiny_llava, outside_sae, pair_folder, cache,
                                                                       tmp_path):
    params = sae_v.choose(tiny_llava, str(outside_sae), str(pair_folder), sae_v.RankParams, store_pairs=4)
    ranking = sae_v.rank(tiny_llava, params)
    written = sae_v.write_exports(ranking, 0.5, tmp_path / "out.csv", tmp_path, str(pair_folder))
    rows = list(csv.DictReader(open(written[0])))
    assert len(rows) == 7 and [int(r["rank"]) for r in rows] == list(range(1, 8))
    assert [r["kept"] for r in rows] == ["True"] * 4 + ["False"] * 3  # round(0.5 * 7) = 4
    assert {r["image"] for r in rows} == {f"img{i}.png" for i in (0, 1, 2, 4, 6, 8, 9)}
    assert [float(r["s_i"]) for r in rows] == [r.score for r in ranking.rows]
    kept_lines = written[1].read_text().splitlines()
    kept_images = {json.loads(line)["image"] for line in kept_lines}
    assert kept_images == {r["image"] for r in rows if r["kept"] == "True"}
    original = (pair_folder / "captions.jsonl").read_text().splitlines()
    assert all(line in original for line in kept_lines)  # the input's own lines, unchanged
    jsonl = sae_v.ranked_text(ranking, 0.5, "jsonl").splitlines()
    assert json.loads(jsonl[0])["rank"] == 1 and "corrupted" in json.loads(jsonl[0])


# ---------------------------------------------------------------------------------------------
# Generated pairs: labels that mean something


def test_scene_pairs_flagged_corrupted_are_really_corrupted(tiny_llava):
    from analysis.world import shapes_world as sw

    pairs = sae_v.make_pairs(tiny_llava, "scenes", 30, seed=4, corrupted=0.5)
    kinds = [p.kind for p in pairs.pairs]
    assert kinds.count("clean") == 10 and kinds.count("other_scene") == 10 and kinds.count("colour_word") == 10
    for p in pairs.pairs:
        scene = sw.generate_scene(p.image_seed)
        truth = sae_v.english_caption(scene)
        assert p.corrupted == (p.text != truth), p
        if p.kind == "colour_word":  # one colour word differs, and that object does not have it
            diff = [(a, b) for a, b in zip(truth.split(), p.text.split()) if a != b]
            assert len(diff) == 1 and diff[0][0] in sw.COLOURS and diff[0][1] in sw.COLOURS
    assert all(p.text.startswith("A picture of ") for p in pairs.pairs)


def test_the_default_pairs_of_a_model_that_is_not_the_demos_have_real_labels(tiny_llava):
    assert sae_v.default_dataset(tiny_llava) == "scenes" and sae_v.DATASETS.get("scenes").has_labels
    noise = sae_v.make_pairs(tiny_llava, "noise", 12, seed=1, corrupted=0.5)
    assert not noise.labelled and not any(p.corrupted for p in noise.pairs)


def test_no_roc_auc_precision_or_recall_without_labels():
    rows = [sae_v.PairScore(pair=i, text="", corrupted=False, kind="unlabelled", score=float(i), weighted=0.0, shared=0)
            for i in range(6)]
    meta = sae_v.SaeMeta(model="m", layer=0, d_in=1, train=None, dataset="noise", n_pairs=0, n_tokens=0, fve=0,
                         l0=0, dead=0)
    ranking = sae_v.finish_ranking(meta, rows, "sum", 1.0, sae_v.score_rule(), labelled=False)
    assert (ranking.roc_auc, ranking.roc_auc_weighted, ranking.precision, ranking.recall) == (None,) * 4
    assert [r.score for r in ranking.rows] == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]


def test_cli_on_a_model_that_is_not_the_demos_reports_roc_only_with_real_corruption(tiny_llava_dir, cache, capsys):
    """Issue 31: the noise pairs have no corrupted pair, so no ROC AUC; the scene pairs have real ones."""
    from analysis.__main__ import main

    common = ["sae", "--model", f"local:{tiny_llava_dir}", "--layer", "1", "--d-sae", "16", "--k", "2", "--steps",
              "20", "--train-pairs", "8", "--eval-pairs", "9", "--rank", "--json"]
    assert main(common + ["--dataset", "noise", "--out", str(cache / "noise-sae")]) == 0
    out = json.loads(capsys.readouterr().out)["ranking"]
    assert out["roc_auc"] is None and out["precision"] is None and out["recall"] is None and not out["labelled"]
    assert "precision" not in out["keep"]
    assert main(common + ["--dataset", "scenes", "--out", str(cache / "scenes-sae")]) == 0
    out = json.loads(capsys.readouterr().out)["ranking"]
    assert out["labelled"] and isinstance(out["roc_auc"], float)
    assert set(out["by_kind"]) == {"clean", "other_scene", "colour_word"}


# ---------------------------------------------------------------------------------------------
# Steering


def test_steering_adds_strength_times_the_decoder_direction():
    """The hook against a float64 reference: x + S * W_dec[k] / scale(modality) at every position (and for an
    sae-lens TopK SAE that divides activations by the decoder row's norm, S * W_dec[k] / |W_dec[k]|)."""
    from analysis.sae_v.steering import _Steer

    from sae_lens import StandardSAE, StandardSAEConfig

    torch.manual_seed(0)

    class FakeSae:  # decode(a) = a @ W_dec + b_dec, as a plain SAE's: sae-lens's StandardSAE with these weights
        W_dec = torch.randn(6, 5)
        b_dec = torch.randn(5)

    plain = StandardSAE(StandardSAEConfig(d_in=5, d_sae=6))
    with torch.no_grad():
        plain.W_dec.copy_(FakeSae.W_dec)
        plain.b_dec.copy_(FakeSae.b_dec)
    meta = sae_v.SaeMeta(model="m", layer=0, d_in=5, train=None, dataset="", n_pairs=0, n_tokens=0, fve=0, l0=0,
                         dead=0, scales=[0.5, 4.0])
    mask = torch.tensor([False, True, True, False])
    hook = _Steer(plain, meta, {2: 3.0, 4: -1.5}, "add", mask)
    hidden = torch.randn(1, 4, 5)
    out = hook(None, None, (hidden, "cache"))
    assert out[1] == "cache"
    for t in range(4):
        scale = 4.0 if mask[t] else 0.5
        expected = [float(hidden[0, t, j]) + (3.0 * float(FakeSae.W_dec[2, j]) - 1.5 * float(FakeSae.W_dec[4, j]))
                    / scale for j in range(5)]
        assert out[0][0, t].tolist() == pytest.approx(expected, abs=1e-5)
    text_only = _Steer(plain, meta, {2: 3.0}, "add", mask, positions="text")(None, None, hidden)
    assert torch.equal(text_only[0, 1], hidden[0, 1]) and not torch.equal(text_only[0, 0], hidden[0, 0])
    one_step = hook(None, None, hidden[:, :1])  # a decode step: one new (text) token
    assert one_step[0, 0, 0] == pytest.approx(float(hidden[0, 0, 0]) + (3.0 * float(FakeSae.W_dec[2, 0])
                                                                      - 1.5 * float(FakeSae.W_dec[4, 0])) / 0.5)
    from sae_lens import TopKSAE, TopKSAEConfig

    topk = TopKSAE(TopKSAEConfig(d_in=5, d_sae=6, k=2, rescale_acts_by_decoder_norm=True))
    with torch.no_grad():
        topk.W_dec.mul_(0.1)
    real = _Steer(topk, meta, {1: 2.0}, "add", None)(None, None, hidden)
    row = [float(v) for v in topk.W_dec[1]]
    norm = math.sqrt(sum(v * v for v in row))
    assert real[0, 3].tolist() == pytest.approx([float(h) + 2.0 * v / norm / 0.5 for h, v in zip(hidden[0, 3], row)],
                                                abs=1e-5)


def test_steering_a_language_model_changes_its_continuation(tiny_llama, model_root, cache):
    folder = save_outside_sae(model_root / "llama-sae", d_in=32, hook="blocks.0.hook_resid_post")
    params = sae_v.choose(tiny_llama, str(folder), "dataset:noise", sae_v.SteerParams, features={3: 0.0},
                          prompt="w1 w2 w3 w4", max_new_tokens=8)
    same = sae_v.steer(tiny_llama, params)
    assert not same.changed and same.unsteered.tokens == same.steered.tokens  # strength 0: nothing changes
    assert not any(same.steered.changed)
    strong = sae_v.steer(tiny_llama, sae_v.SteerParams(**{**params.to_dict(), "features": {3: 400.0}}))
    assert strong.changed and any(strong.steered.changed)
    with pytest.raises(sae_v.SettingsError, match="does not exist"):
        sae_v.steer(tiny_llama, sae_v.SteerParams(**{**params.to_dict(), "features": {99: 1.0}}))
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="PNG")
    with pytest.raises(sae_v.SettingsError, match="text-only model"):
        sae_v.steer(tiny_llama, sae_v.SteerParams(**{**params.to_dict(), "image": sae_v.save_image(buf.getvalue())}))


def test_text_only_sae_on_a_language_model_browses_text_features(tiny_llama, model_root, cache):
    folder = save_outside_sae(model_root / "llama-sae-text", d_in=32, hook="blocks.1.hook_resid_post", seed=2)
    texts = model_root / "llama-texts"
    texts.mkdir(exist_ok=True)
    (texts / "texts.jsonl").write_text("".join(json.dumps({"text": f"w{i} w{i + 1} w{i + 2} w5"}) + "\n"
                                               for i in range(12)))
    choice = sae_v.choose(tiny_llama, str(folder), str(texts), store_pairs=12)
    store = sae_v.store_for(tiny_llama, choice)
    assert store.grid == 0 and {f.label for f in store.features} <= {"text-only", "dead"}
    assert all(f.density_image == 0 for f in store.features) and any(f.top_text for f in store.features)
    result = sae_v.explain(tiny_llama, sae_v.choose(tiny_llama, str(folder), str(texts), sae_v.ExplainParams,
                                                    text="w1 w2 w3"))
    assert result.tokens == ["w1", "w2", "w3"] and all(p.modality == sae_v.TEXT for p in result.positions)


def test_settings_are_the_methods_own_and_old_flat_layouts_still_read():
    old = {"architecture": "standard", "d_sae": 64, "k": 8, "l1_coefficient": 2.5, "l0_coefficient": 0.3,
           "steps": 10, "batch_size": 32, "lr": 0.001, "seed": 0, "balance_modalities": True}
    params = sae_v.TrainParams.from_dict(old)
    assert params.architectures == {"standard": {"l1_coefficient": 2.5}}  # defaults are not copied
    assert params.sae_type() == sae_v.Standard(l1_coefficient=2.5) and params.k == 8
    assert sae_v.TrainParams(k=4).architectures == {"topk": {"k": 4}}
    with pytest.raises(sae_v.SettingsError, match="k \\(active features per token\\) must be at most the number"):
        sae_v.TrainParams(d_sae=4, k=8).validate()
    with pytest.raises(sae_v.SettingsError, match="L1 coefficient must be at least 0.0"):
        sae_v.TrainParams(architecture="standard", l1_coefficient=-1).validate()
    store = sae_v.StoreParams.from_dict({"score_rule": "official", "omega_top": 3, "modality_top": 30})
    assert store.rule().omega_top == 3 and store.rules == {"official": {"omega_top": 3}}
    assert sae_v.RankParams(rule="all-shared", rules=sae_v.rule_settings(cooccur_threshold=0.0)).score_rule() \
        .cooccur_threshold == 0.0
    with pytest.raises(sae_v.SettingsError, match="No SAE-V score rule has the setting"):
        sae_v.rule_settings(nope=1)
    assert math.isclose(sae_v.score_rule("all-shared").cooccur_threshold, 0.0)


# ---------------------------------------------------------------------------------------------
# The command line on the demo VLM (issue 33's must-show)


def _demo_ready() -> bool:
    from analysis.model_access.models import zoo_models

    return "shapes-vlm" in zoo_models() and (sae_v.SAE_ROOT / "shapes-vlm" / "layer1" / sae_v.STORE_FILE).is_file()


def _scene_folder(folder, n: int = 9):
    """Shapes World scenes as PNG files with their captions in captions.jsonl; row 4's image is missing."""
    from analysis.world import shapes_world as sw

    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        scene = sw.generate_scene(20_950_000 + i)
        sw.render(scene, 64).save(folder / f"scene{i}.png")
        lines.append({"image": f"scene{i}.png", "caption": sw.caption(scene)})
    lines[4]["image"] = "scene404.png"
    (folder / "captions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


@pytest.mark.skipif(not _demo_ready(), reason="the demo VLM and its SAE are not built")
def test_cli_ranks_your_folder_with_an_sae_saved_by_sae_lens_and_exports_it(tmp_path, cache, capsys):
    from analysis.__main__ import main

    sae = save_outside_sae(tmp_path / "their-sae", d_in=128, hook="blocks.1.hook_resid_post", d_sae=64)
    data = _scene_folder(tmp_path / "scenes")
    out = tmp_path / "OUT.csv"
    code = main(["sae", "--model", "zoo:shapes-vlm", "--sae", str(sae), "--data", str(data), "--rank", "--export",
                 str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "skipped row 5: image 'scene404.png' is missing" in printed.out  # reported, 1-based
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 8 and {r["image"] for r in rows} == {f"scene{i}.png" for i in range(9) if i != 4}
    assert [float(r["s_i"]) for r in rows] == sorted((float(r["s_i"]) for r in rows), reverse=True)
    assert [r["kept"] for r in rows] == ["True"] * 4 + ["False"] * 4
    assert "corrupted" not in rows[0]  # no label column: no labels invented
    wrong = save_outside_sae(tmp_path / "wrong-sae", d_in=96, hook="blocks.1.hook_resid_post")
    code = main(["sae", "--model", "zoo:shapes-vlm", "--sae", str(wrong), "--data", str(data), "--rank",
                 "--export", str(tmp_path / "never.csv")])
    err = capsys.readouterr().err
    assert code == 1 and not (tmp_path / "never.csv").exists()
    assert "Traceback" not in err and [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: This SAE reads 96-wide vectors (cfg.json d_in), but layer 1 of zoo:shapes-vlm is 128-wide: it was "
        "made for another model."]


@pytest.mark.skipif(not _demo_ready(), reason="the demo VLM and its SAE are not built")
def test_cli_steering_prints_both_captions_as_json(tmp_path, cache, capsys):
    from analysis.__main__ import main
    from analysis.world import shapes_world as sw

    image = tmp_path / "scene.png"
    sw.render(sw.generate_scene(20_900_001), 64).save(image)
    code = main(["sae", "--model", "zoo:shapes-vlm", "--steer", "194=0", "--image", str(image), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["unsteered"] == out["steered"] and out["unsteered"].startswith("there is a")
    code = main(["sae", "--model", "zoo:shapes-vlm", "--steer", "194=60", "--steer", "810=20", "--image", str(image),
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["unsteered"] != out["steered"] and out["features"] == {"194": 60.0, "810": 20.0}
    for bad in (["--steer", "x=1"], ["--steer", "5000=1"], ["--steer", "3=1", "--image", str(tmp_path / "no.png")]):
        code = main(["sae", "--model", "zoo:shapes-vlm", *bad, "--image", str(image)][: 4 + len(bad)])
        err = capsys.readouterr().err
        assert code == 1 and len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1, err

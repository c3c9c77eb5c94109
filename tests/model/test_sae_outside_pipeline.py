"""SAE-V end to end with SAEs sae-lens saves with an input normalisation (issue 40, item 1): the feature store,
the ranking and steering run on a real (tiny) LLaVA, their numbers equal sae-lens's own forward, and
`python -m analysis sae` refuses every SAE it cannot use with one `error:` line and no traceback."""
from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from analysis import sae_v
from sae_lens_factory import Reference, cache, save_sae_lens  # noqa: F401  (cache: a fixture)

D_MODEL = 32  # tiny_llava's hidden size


@pytest.mark.parametrize("case,norm", [("jumprelu", "layer_norm"), ("topk", "constant_norm_rescale"),
                                       ("standard", "expected_average_only_in")])
def test_store_ranking_and_steering_run_with_a_normalising_sae(case, norm, tiny_llava, model_root, cache):
    folder = save_sae_lens(model_root / f"sae-{case}-{norm}", case, norm, d_in=D_MODEL)
    choice = sae_v.choose(tiny_llava, str(folder), "dataset:noise", sae_v.RankParams, store_pairs=8, batch_pairs=4)
    store = sae_v.store_for(tiny_llava, choice)  # crashed with layer_norm before (decode of another batch)
    pairs, _, _ = sae_v.data_pairs(tiny_llava, choice)
    acts = sae_v.collect_activations(tiny_llava, sae_v.PairSet(**{**pairs.to_dict(), "pairs": pairs.pairs[:8]}), 1)
    ref = Reference(folder, norm)
    recon = ref.reconstruct(acts.acts)
    fve = float(1 - ((acts.acts - recon) ** 2).sum() / ((acts.acts - acts.acts.mean(0)) ** 2).sum())
    assert store.meta.fve == pytest.approx(fve, abs=1e-3)  # variance explained by sae-lens's own reconstruction
    assert store.meta.l0 == pytest.approx(float((ref.encode(acts.acts) > 0).sum(1).float().mean()), abs=1e-3)
    ranking = sae_v.rank(tiny_llava, choice)
    assert len(ranking.rows) == len(pairs.pairs)
    steer = sae_v.choose(tiny_llava, str(folder), "dataset:noise", sae_v.SteerParams, store_pairs=8,
                         features={1: 0.0}, image="pair:0", max_new_tokens=4)
    same = sae_v.steer(tiny_llava, steer)
    assert not same.changed  # strength 0 changes nothing
    moved = sae_v.steer(tiny_llava, sae_v.SteerParams(**{**steer.to_dict(), "features": {1: 500.0}}))
    assert moved.steered.tokens != same.steered.tokens or moved.changed


def _main(argv: list[str], capsys) -> tuple[int, str]:
    from analysis.__main__ import main

    code = main(argv)
    return code, capsys.readouterr().err


def _bad_saes(root):
    """(name, locator, words the message must have) of SAEs the CLI must refuse."""
    from sae_lens.registry import SAE_CLASS_REGISTRY

    wide = save_sae_lens(root / "bad-wide", "standard", "none", d_in=48)
    unfolded = save_sae_lens(root / "bad-unfolded", "jumprelu", "expected_average_only_in", scaler=False,
                             d_in=D_MODEL)
    attention = save_sae_lens(root / "bad-hook", "standard", "none", d_in=D_MODEL, hook="blocks.1.attn.hook_z")
    cls, cfg_cls = SAE_CLASS_REGISTRY["abstopk"]
    cls(cfg_cls(d_in=D_MODEL, d_sae=16, k=2)).save_model(root / "bad-abstopk")
    (root / "bad-empty").mkdir(exist_ok=True)
    (root / "bad-cfg").mkdir(exist_ok=True)
    (root / "bad-cfg" / "cfg.json").write_text("{not json")
    (root / "bad-cfg" / "sae_weights.safetensors").write_bytes(b"\0" * 16)
    return [
        ("too wide", str(wide), "48-wide"),
        ("unfolded scale", str(unfolded), "activation_scaler.json"),
        ("attention hook", str(attention), "not the residual stream"),
        ("abstopk", str(root / "bad-abstopk"), "architecture 'abstopk'"),
        ("empty folder", str(root / "bad-empty"), "No sae-lens SAE"),
        ("broken cfg", str(root / "bad-cfg"), "could not load"),
        ("release offline", "sae-lens:gpt2-small-res-jb/blocks.1.hook_resid_pre", "sae-lens"),
    ]


def test_cli_refuses_each_bad_sae_in_one_error_line(tiny_llava_dir, model_root, cache, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, locator, words in _bad_saes(model_root):
        for extra in ([], ["--rank"], ["--steer", "1=2"]):
            code, err = _main(["sae", "--model", f"local:{tiny_llava_dir}", "--sae", locator, *extra], capsys)
            lines = [line for line in err.splitlines() if line.startswith("error:")]  # beside transformers' bars
            assert code == 1, (name, extra, err)
            assert len(lines) == 1 and "Traceback" not in err, (name, err)
            assert words in lines[0], (name, lines[0])


def test_a_user_folder_of_pairs_with_a_normalising_sae_ranks(tiny_llava, model_root, cache):
    folder = save_sae_lens(model_root / "sae-ln-data", "jumprelu", "layer_norm", d_in=D_MODEL, seed=3)
    data = model_root / "pairs-for-ln"
    data.mkdir(exist_ok=True)
    rows = []
    for i in range(6):
        Image.new("RGB", (16, 16), (30 * i, 100, 200 - 20 * i)).save(data / f"{i}.png")
        rows.append({"image": f"{i}.png", "caption": f"w{i} w{i + 1} w{i + 2}"})
    (data / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    choice = sae_v.choose(tiny_llava, str(folder), str(data), sae_v.RankParams, store_pairs=6)
    ranking = sae_v.rank(tiny_llava, choice)
    assert [r.row for r in sorted(ranking.rows, key=lambda r: r.row)] == list(range(6))
    assert all(torch.isfinite(torch.tensor(r.score)) for r in ranking.rows)

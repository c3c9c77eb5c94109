"""docs/readme_sae.md quotes SAE-V numbers from the benchmark result files (issue 40, item 5): each number
below is read from benchmarks/results/ and must appear in the docs as written, so a re-run benchmark that
changes it fails here until the docs follow."""
from __future__ import annotations

import json

from analysis.framework import paths

DOC = (paths.DOCS / "readme_sae.md").read_text(encoding="utf-8")
FLAT = " ".join(DOC.split())  # sentences wrap anywhere


def _result(name: str) -> dict:
    return json.loads(paths.result_file(name).read_text())


def _has(*texts: str) -> None:
    for text in texts:
        assert " ".join(text.split()) in FLAT, f"docs/readme_sae.md does not say {text!r}"


def test_steering_numbers_come_from_the_steering_benchmark():
    result = _result("sae_v_steering.json")
    first, second = result["features"][:2]
    n = result["scenes_without_middle_right"]
    assert first["moved"] + first["changed_otherwise"] + first["unchanged"] == n == first["scenes"]
    _has("benchmarks/results/sae_v_steering.json",
         f"({first['feature']}, concept in both modalities at precision {first['concept_precision']:.1f})",
         f"On {n} held-out test scenes without an object there",
         f"**{first['moved']} of {n} ({100 * first['moved'] / n:.0f} %)**",
         f"otherwise in {first['changed_otherwise']} and leaves {first['unchanged']} unchanged",
         f"{second['feature']}, moves it in {second['moved']} of {n} ({100 * second['moved'] / n:.0f} %)",
         f"({100 * first['moved'] / n:.0f} % and {100 * second['moved'] / n:.0f} % of held-out scenes")


def test_residual_norms_and_scales_come_from_the_pairs_benchmark():
    norms = _result("sae_v_pairs.json")["residual_norms"]
    _has(f"mean norm {norms['mean_norm_text']:.1f} at text tokens and {norms['mean_norm_image']:.1f} at image tokens",
         f"(image / text {norms['image_over_text']:.2f})",
         f"the stored scales are {norms['stored_scales_text_image'][0]:.3f} (text) and "
         f"{norms['stored_scales_text_image'][1]:.3f} (image), ratio {norms['stored_scale_ratio_text_over_image']:.2f}")
    assert "about 3.5× longer than text" not in FLAT


def test_user_pairs_numbers_come_from_the_pairs_benchmark():
    pairs = _result("sae_v_pairs.json")["user_vs_built_in"]
    assert pairs["same_tokens"] and pairs["same_order"]
    _has(f"the first {pairs['pairs']} built-in `shapes` evaluation pairs",
         f"mean s_i {pairs['mean_s_i_built_in']:.2f} and {pairs['mean_s_i_user']:.2f}, Spearman "
         f"{pairs['spearman_s_i']:.2f}")


def test_top_50_cut_numbers_come_from_its_benchmark():
    result = _result("sae_v_token_top.json")
    demo, wide = result["demo_sae"], result["topk64_sae"]
    cuts, wide_cuts = demo["cuts"], wide["cuts"]
    _has(f"has at most {demo['active_per_token_max']} active features per token",
         f"({cuts['50']['features_with_omega']} features with ω either way, {cuts['50']['pairs_with_other_s_i']} "
         f"pairs with another s_i, ROC AUC {cuts['50']['roc_auc']:.3f})",
         f"4 per token leaves {cuts['4']['features_with_omega']} features with ω",
         f"Spearman {cuts['4']['spearman_s_i_vs_uncut']:.3f} with the uncut ranking",
         f"2 per token {cuts['2']['features_with_omega']} (Spearman {cuts['2']['spearman_s_i_vs_uncut']:.3f}",
         f"{wide_cuts['0']['features_with_omega']} features have an ω without the cut, "
         f"{wide_cuts['50']['features_with_omega']} with it ({wide_cuts['50']['gained']} gained, "
         f"{wide_cuts['50']['lost']} lost; largest |Δω| {wide_cuts['50']['max_abs_delta_omega']:.2f})",
         f"({wide_cuts['50']['pairs_with_other_s_i']} of 300;")

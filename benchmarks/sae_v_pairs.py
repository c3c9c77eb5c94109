"""SAE-V on the demo: your pairs against the built-in ones, and the residual norms behind the SAE's scales.

1. The first 24 built-in `shapes` evaluation pairs are written out as a user's folder (PNG images,
   captions.jsonl with the corruption labels) and both are ranked with the committed demo SAE: with one
   encoding path (analysis/sae_v/prompts.py) the residuals, s_i and the ranking must agree.
2. The mean norm of the layer-1 residuals at text and at image tokens on the 300 held-out pairs, and the
   per-modality scales stored with the demo SAE (`SaeMeta.scales`: √d / mean norm of its training
   tokens), which docs/readme_sae.md quotes.

    python benchmarks/sae_v_pairs.py        # writes benchmarks/results/sae_v_pairs.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402  (every project path comes from analysis/framework/paths.py)
from benchmarks.sae_v_demo import MODEL, SAE, demo, spearman, write  # noqa: E402

RESULT_FILE = RESULTS / "sae_v_pairs.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=24)
    ap.add_argument("--out", default=str(RESULT_FILE))
    args = ap.parse_args(argv)
    import os

    from analysis import sae_v

    start = time.perf_counter()
    handle, folder, sae, meta = demo()
    out = {"model": MODEL, "sae": SAE, "layer": meta.layer}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["MODEL_INSPECTOR_ROOTS"] = str(tmp)
        sae_v.types.CACHE_ROOT = tmp / "cache"
        built_in = sae_v.choose(handle, folder.name, "dataset:shapes", sae_v.RankParams, store_pairs=args.pairs)
        pairs, _, _ = sae_v.data_pairs(handle, built_in)
        data = tmp / "pairs"
        data.mkdir()
        lines = []
        for i, pair in enumerate(pairs.pairs):
            sae_v.render_pair(pairs, i).save(data / f"{i}.png")
            lines.append(json.dumps({"image": f"{i}.png", "caption": pair.text, "corrupted": pair.corrupted}))
        (data / "captions.jsonl").write_text("\n".join(lines) + "\n")
        user = sae_v.choose(handle, folder.name, str(data), sae_v.RankParams, store_pairs=args.pairs)
        mine, _, _ = sae_v.data_pairs(handle, user)
        a = sae_v.collect_activations(handle, pairs, meta.layer)
        b = sae_v.collect_activations(handle, mine, meta.layer)
        rank_a, rank_b = sae_v.rank(handle, built_in), sae_v.rank(handle, user)
    score_a = {r.pair: r.score for r in rank_a.rows}
    score_b = {r.row: r.score for r in rank_b.rows}
    keys = sorted(score_a)
    diff = {}
    for name, mod in (("text", sae_v.TEXT), ("image", sae_v.IMAGE)):
        x, y = a.acts[a.modality == mod], b.acts[b.modality == mod]
        diff[name] = round(float((x - y).norm(dim=1).max() / x.norm(dim=1).mean()), 6) if x.shape == y.shape else None
    out["user_vs_built_in"] = {
        "pairs": len(keys), "same_tokens": a.tokens == b.tokens,
        "max_residual_difference_relative": diff,
        "mean_s_i_built_in": round(sum(score_a.values()) / len(keys), 4),
        "mean_s_i_user": round(sum(score_b[k] for k in keys) / len(keys), 4),
        "max_abs_s_i_difference": round(max(abs(score_a[k] - score_b[k]) for k in keys), 6),
        "spearman_s_i": round(spearman([score_a[k] for k in keys], [score_b[k] for k in keys]), 4),
        "same_order": [r.pair for r in rank_a.rows] == [r.row for r in rank_b.rows],
        "roc_auc_built_in": rank_a.roc_auc, "roc_auc_user": rank_b.roc_auc,
    }
    store = sae_v.load_store(folder)
    held_out = sae_v.collect_activations(handle, store.pairs, meta.layer)
    norms = {name: round(float(held_out.acts[held_out.modality == mod].norm(dim=1).mean()), 4)
             for name, mod in (("text", sae_v.TEXT), ("image", sae_v.IMAGE))}
    out["residual_norms"] = {"pairs": len(store.pairs.pairs), "mean_norm_text": norms["text"],
                             "mean_norm_image": norms["image"],
                             "image_over_text": round(norms["image"] / norms["text"], 3),
                             "stored_scales_text_image": [round(s, 3) for s in meta.scales],
                             "stored_scale_ratio_text_over_image": round(meta.scales[0] / meta.scales[1], 3)}
    return write(out, args.out, start)


if __name__ == "__main__":
    sys.exit(main())

"""How much does the SAE-V code's per-token top-50 cut change ω and the ranking on the demo?

SAELens-V lists only each token's 50 strongest features before ω is computed (`token_top`, official 50;
0 reads every feature). On the committed demo SAE (TopK, k = 8) no token has more than 8 active features,
so the official cut cannot change anything; smaller cuts show how sensitive ω and s_i are to it. A
TopK SAE with k = 64 trained here for the purpose (same layer, same 600 training pairs, 1,024 features)
has more active features per token than the cut keeps, so there the official value itself matters.

For each SAE and cut, on the 300 held-out pairs the ranking view scores: features with an ω, features
gaining or losing one against no cut, the largest and mean |Δω| over features that have one both ways,
the ROC AUC of the official s_i, and the Spearman correlation of s_i with the uncut ranking.

    python benchmarks/sae_v_token_top.py        # writes benchmarks/results/sae_v_token_top.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402  (every project path comes from analysis/framework/paths.py)
from benchmarks.sae_v_demo import MODEL, demo, spearman, write  # noqa: E402

RESULT_FILE = RESULTS / "sae_v_token_top.json"


def compare(acts, codes, pairs, cuts: list[int]) -> dict:
    from analysis import sae_v

    active = (codes > 0).sum(1).float()
    out = {"active_per_token_mean": round(float(active.mean()), 2), "active_per_token_max": int(active.max()),
           "cuts": {}}
    base = None
    for cut in [0] + cuts:
        rule = sae_v.score_rule("official", token_top=cut)
        omega, has = rule.weights(acts.acts, codes, acts.modality)
        ranking = sae_v.rank_pairs(sae_v.SaeMeta(model="", layer=acts.layer, d_in=0, train=None, dataset="",
                                                 n_pairs=0, n_tokens=0, fve=0, l0=0, dead=0),
                                   omega, codes, acts, pairs, has_omega=has, rule=rule)
        scores = {r.pair: r.score for r in ranking.rows}
        entry = {"features_with_omega": int(has.sum()), "roc_auc": ranking.roc_auc}
        if base is None:
            base = (omega, has, scores)
        else:
            both = has & base[1]
            delta = (omega - base[0]).abs()[both]
            entry.update(gained=int((has & ~base[1]).sum()), lost=int((~has & base[1]).sum()),
                         max_abs_delta_omega=round(float(delta.max()), 4) if delta.numel() else 0.0,
                         mean_abs_delta_omega=round(float(delta.mean()), 4) if delta.numel() else 0.0,
                         spearman_s_i_vs_uncut=round(spearman([scores[i] for i in sorted(scores)],
                                                              [base[2][i] for i in sorted(scores)]), 4),
                         pairs_with_other_s_i=sum(abs(scores[i] - base[2][i]) > 1e-6 for i in scores))
        out["cuts"][str(cut)] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500, help="training steps of the k = 64 SAE")
    ap.add_argument("--out", default=str(RESULT_FILE))
    args = ap.parse_args(argv)
    from analysis import sae_v

    start = time.perf_counter()
    handle, folder, sae, meta = demo()
    store = sae_v.load_store(folder)
    acts = sae_v.collect_activations(handle, store.pairs, meta.layer)
    out = {"model": MODEL, "layer": meta.layer, "pairs": len(store.pairs.pairs),
           "demo_sae": {"architecture": "topk", "k": 8, "d_sae": int(sae.d_sae),
                        **compare(acts, sae_v.encode(sae, sae_v.scaled(acts, meta.scales)), store.pairs, [50, 8, 4, 2])}}
    train = sae_v.make_pairs(handle, "shapes", 600, 1, corrupted=0.0)  # the demo build's training pairs (seed 0)
    train_acts = sae_v.collect_activations(handle, train, meta.layer)
    scales = sae_v.modality_scales(train_acts)
    wide = sae_v.train_sae(sae_v.scaled(train_acts, scales),
                           sae_v.TrainParams(d_sae=1024, k=64, steps=args.steps, batch_size=256))
    x = sae_v.scaled(acts, scales)
    fve, l0, dead = sae_v.reconstruction_metrics(wide, x)
    out["topk64_sae"] = {"architecture": "topk", "k": 64, "d_sae": 1024, "steps": args.steps,
                         "fve": round(fve, 4), "l0": round(l0, 2), "dead": dead,
                         **compare(acts, sae_v.encode(wide, x), store.pairs, [50])}
    return write(out, args.out, start)


if __name__ == "__main__":
    sys.exit(main())

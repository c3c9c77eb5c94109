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
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.paths import RESULTS, SAE_STORES  # noqa: E402  (every project path comes from analysis/paths.py)

RESULT_FILE = RESULTS / "sae_v_token_top.json"


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(xs):
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        r = [0.0] * len(xs)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / den if den else 1.0


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
    torch.set_num_threads(1)
    from analysis import sae_v
    from analysis.models import ModelSpec, load_model

    start = time.perf_counter()
    handle = load_model(ModelSpec("zoo", "shapes-vlm"))
    folder = SAE_STORES / "shapes-vlm" / "layer1"
    sae, meta = sae_v.load_sae(folder)
    store = sae_v.load_store(folder)
    acts = sae_v.collect_activations(handle, store.pairs, meta.layer)
    out = {"model": "zoo:shapes-vlm", "layer": meta.layer, "pairs": len(store.pairs.pairs),
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
    out["seconds"] = round(time.perf_counter() - start, 1)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How well *could* SAE-V's s_i separate corrupted image-caption pairs on Shapes World? A ceiling from
ground-truth codes, next to the demo SAE.

    python benchmarks/sae_v_ceiling.py [--seeds 2,0,1] [--pairs 300] [--no-sae] [--out FILE]

s_i sums a feature's cross-modal weight omega over the features active on both the caption and the
image of a pair. Replace the SAE by a perfect dictionary whose features are Shapes World's own
concepts (`analysis.world.concepts`, the ground truth the SAE-V panel labels features with), each with
omega = 1 (its text and image tokens point the same way), and s_i becomes a count of what both sides
share. Two such dictionaries:

- per attribute: one feature per colour, shape, size and position (what the demo SAE learns);
- per object (binding): one feature per whole object (size + colour + shape + position).

Each is scored with the official sum and with the labelled `normalised` variant (shared / either
side, a Jaccard index), on the evaluation pools `python -m analysis sae --rank` uses (a third clean, a
third another scene's caption, a third swapped attributes; an SAE built with `--seed S` is ranked on
pool 2 S + 2, so pool 2 is the demo SAE's own). For
the per-attribute sum it also searches weights per attribute kind (colour, shape, size, position;
each in 0-4, tuned on the pool it is scored on, so an optimistic bound). With the demo SAE
(`analysis/zoo/sae/shapes-vlm/layer1`) it adds the measured AUCs of both rules on its own pool,
and asks the model why its SAE has no per-object features: how much of the residual after each
layer (the SAE's layer 1 among them) at the tokens that hold a whole object (the caption word before
each "." and the image token of each object's cell) a *sum* of one vector per attribute value
explains, and whether pairwise attribute interactions or one mean vector per whole object explain
more (R² on held-out tokens: a least-squares fit on the first half of 600 clean validation-split
pairs, scored on the second half). Last, it replaces the SAE by the most binding-friendly code the
residuals allow, a clustering: spherical k-means (1,024 centroids, fitted on the demo SAE's training
residuals, k-means++ seeding) gives each token one feature, its nearest centroid, with its projection as activation;
scored by the official rule on the demo SAE's pool, once with the training mean removed and once with
each modality's own mean removed. If the model put an object's caption word and its image token in one
cluster, this code would find it.

Prints a markdown table and writes benchmarks/results/sae_v_ceiling.json.
"""
from __future__ import annotations

import argparse
import itertools
import math
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS, ROOT  # noqa: E402  (every project path comes from analysis/framework/paths.py)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from analysis.sae_v.datasets import ShapesDataset  # noqa: E402
from analysis.sae_v.scores import roc_auc  # noqa: E402
from analysis.world import concepts  # noqa: E402
from analysis.world import shapes_world as sw  # noqa: E402

OUT = RESULTS / "sae_v_ceiling.json"
KINDS = ("other_scene", "swapped")
ATTRIBUTE_KINDS = ("colour", "shape", "size", "position")
WEIGHT_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


def shared_sets(pairs, binding: bool) -> list[tuple[str, set, set]]:
    """(kind, concepts on both sides, concepts on either side) per pair, for one ground-truth code."""
    out = []
    for p in pairs:
        text, image = concepts.caption_code(p.caption, binding), concepts.scene_code(p.scene, binding)
        out.append((p.kind, text & image, text | image))
    return out


def aucs(scores: list[float], kinds: list[str]) -> dict:
    """ROC AUC of clean pairs over all corrupted ones, and over each corrupted kind alone."""
    clean = [s for s, k in zip(scores, kinds) if k == "clean"]
    out = {"all": roc_auc(clean, [s for s, k in zip(scores, kinds) if k != "clean"])}
    for kind in KINDS:
        out[kind] = roc_auc(clean, [s for s, k in zip(scores, kinds) if k == kind])
    return {k: None if v is None else round(v, 4) for k, v in out.items()}


def ceiling(pairs) -> dict:
    kinds = [p.kind for p in pairs]
    rows = {}
    for code, binding in (("per attribute", False), ("per object (binding)", True)):
        sets = shared_sets(pairs, binding)
        rows[f"{code}, official sum"] = aucs([len(both) for _, both, _ in sets], kinds)
        rows[f"{code}, normalised"] = aucs([len(both) / len(either) if either else 0.0 for _, both, either in sets],
                                           kinds)
    sets = shared_sets(pairs, False)
    best, best_weights = None, None
    for weights in itertools.product(WEIGHT_GRID, repeat=len(ATTRIBUTE_KINDS)):
        w = dict(zip(ATTRIBUTE_KINDS, weights))
        scores = [sum(w[c.split(":")[0]] for c in both) for _, both, _ in sets]
        result = aucs(scores, kinds)
        if best is None or result["all"] > best["all"]:
            best, best_weights = result, w
    rows["per attribute, official sum, best kind weights"] = {**best, "weights": best_weights}
    return rows


ATTRIBUTE_VALUES = ([f"size:{v}" for v in sw.SIZES] + [f"colour:{v}" for v in sw.COLOURS]
                    + [f"shape:{v}" for v in sw.SHAPES] + [f"position:{v}" for v in sw.POSITIONS])


def design(objects: list[frozenset], interactions: bool) -> list[list[float]]:
    """Rows of a least-squares design: intercept, one indicator per attribute value, and with
    `interactions` one indicator per pair of values of two different attribute kinds."""
    pairs = [(a, b) for a, b in itertools.combinations(ATTRIBUTE_VALUES, 2) if a.split(":")[0] != b.split(":")[0]]
    rows = []
    for obj in objects:
        row = [1.0] + [float(v in obj) for v in ATTRIBUTE_VALUES]
        if interactions:
            row += [float(a in obj and b in obj) for a, b in pairs]
        rows.append(row)
    return rows


def held_out_r2(vectors, objects: list[frozenset]) -> dict:
    """R² on the second half of `vectors` (N, d) of three codes fitted on the first half: a sum of
    attribute vectors, the same plus pairwise interactions (both ridge 1e-3 least squares), and one mean
    vector per whole object (only held-out objects seen in the first half count)."""
    import torch

    y = torch.as_tensor(vectors, dtype=torch.float64)
    half = len(objects) // 2
    total = lambda rows, centre: float(((y[rows] - centre) ** 2).sum())  # noqa: E731
    centre = y[:half].mean(0)
    out = {}
    for name, interactions in (("sum_of_attributes", False), ("with_pairwise_interactions", True)):
        x = torch.tensor(design(objects, interactions), dtype=torch.float64)
        fit = torch.linalg.solve(x[:half].T @ x[:half] + 1e-3 * torch.eye(x.shape[1], dtype=torch.float64),
                                 x[:half].T @ y[:half])
        residual = float(((y[half:] - x[half:] @ fit) ** 2).sum())
        out[name] = round(1 - residual / total(slice(half, None), centre), 4)
    groups: dict[frozenset, list[int]] = {}
    for i in range(half):
        groups.setdefault(objects[i], []).append(i)
    means = {obj: y[rows].mean(0) for obj, rows in groups.items()}
    seen = [i for i in range(half, len(objects)) if objects[i] in means]
    residual = sum(float(((y[i] - means[objects[i]]) ** 2).sum()) for i in seen)
    out["one_mean_per_object"] = round(1 - residual / total(seen, centre), 4) if seen else math.nan
    out["tokens_fit_scored"] = [half, len(objects) - half]
    return out


def object_token_code(handle, layer: int, n_pairs: int = 600) -> dict:
    """Layer-`layer` residuals at the tokens that hold one whole object, per modality: held_out_r2."""
    from analysis.sae_v import IMAGE, TEXT, collect_activations, make_pairs

    pairs = make_pairs(handle, "shapes", n_pairs, seed=1)  # clean validation-split pairs
    acts = collect_activations(handle, pairs, layer)
    words = [concepts.text_concepts(t) for t in acts.tokens]
    patches = [concepts.patch_concepts(p.image_seed, acts.grid) for p in pairs.pairs]
    found = {TEXT: ([], []), IMAGE: ([], [])}
    for row, (p, i, mod) in enumerate(zip(acts.pair.tolist(), acts.index.tolist(), acts.modality.tolist())):
        if mod == TEXT:
            tokens = acts.tokens[p]
            whole = i + 1 < len(tokens) and tokens[i + 1] == "." and len(words[p][i]) == 4
            obj = frozenset(words[p][i])
        else:
            obj = frozenset(patches[p][i])
            whole = len(obj) == 4
        if whole:
            found[mod][0].append(row)
            found[mod][1].append(obj)
    return {name: held_out_r2(acts.acts[rows], objects)
            for name, (rows, objects) in (("caption word before '.'", found[TEXT]),
                                          ("object's image token", found[IMAGE]))}


def kmeans_code(train, train_modality, evaluate, eval_modality, k: int = 1024, per_modality: bool = False,
                iterations: int = 30, seed: int = 0):
    """One-hot cluster codes (N_eval, k): spherical k-means on the (centred) training vectors; each
    evaluation token fires only its nearest centroid, with its projection (clamped at 0) as activation.
    Centred by the training mean, or with `per_modality` by each modality's own training mean."""
    import torch

    modalities = sorted(set(train_modality.tolist()))
    means = {m: train[train_modality == m].mean(0) if per_modality else train.mean(0) for m in modalities}

    def centred(x, modality):
        out = x.clone()
        for m in modalities:
            out[modality == m] -= means[m]
        return out

    g = torch.Generator().manual_seed(seed)
    unit = torch.nn.functional.normalize(centred(train, train_modality), dim=1)
    # k-means++ seeding on angles: each next centroid drawn in proportion to its squared distance
    # (1 - cosine) from the nearest centroid so far
    centroids = unit.new_empty(k, unit.shape[1])
    centroids[0] = unit[torch.randint(len(unit), (1,), generator=g)].squeeze(0)
    closest = 1 - unit @ centroids[0]
    for c in range(1, k):
        weights = closest.clamp_min(0) ** 2
        pick = (torch.multinomial(weights, 1, generator=g) if weights.sum() > 0
                else torch.randint(len(unit), (1,), generator=g))
        centroids[c] = unit[pick].squeeze(0)
        closest = torch.minimum(closest, 1 - unit @ centroids[c])
    for _ in range(iterations):
        nearest = (unit @ centroids.T).argmax(1)
        # each centroid: the direction of its members' sum (= of their mean); an empty one is re-drawn
        sums = torch.zeros_like(centroids).index_add_(0, nearest, unit)
        centroids = torch.nn.functional.normalize(sums, dim=1)
        for c in (torch.bincount(nearest, minlength=k) == 0).nonzero().squeeze(1).tolist():
            centroids[c] = unit[torch.randint(len(unit), (1,), generator=g)].squeeze(0)
    projection = centred(evaluate, eval_modality) @ centroids.T
    best = projection.max(1)
    codes = torch.zeros_like(projection)
    codes[torch.arange(len(codes)), best.indices] = best.values.clamp_min(0)
    return codes


def clustering_rows(handle, meta, store) -> dict:
    """The official rule's AUCs with k-means cluster codes in place of the SAE (demo SAE's pool)."""
    from analysis.sae_v import collect_activations, make_pairs
    from analysis.sae_v.activations import scaled
    from analysis.sae_v.scores import SCORE_RULES

    train_pairs = make_pairs(handle, store.pairs.dataset, meta.n_pairs, store.pairs.seed - 1, corrupted=0.0)
    train = collect_activations(handle, train_pairs, meta.layer)
    evaluate = collect_activations(handle, store.pairs, meta.layer)
    rule = SCORE_RULES.create("official")
    kinds = [p.kind for p in store.pairs.pairs]
    out = {}
    for name, per_modality in (("k-means clusters (1,024), training mean removed", False),
                               ("k-means clusters (1,024), each modality's mean removed", True)):
        codes = kmeans_code(scaled(train, meta.scales), train.modality, scaled(evaluate, meta.scales),
                            evaluate.modality, per_modality=per_modality)
        omega, has = rule.weights(evaluate.acts, codes, evaluate.modality)
        score, _, _ = rule.pair_scores(codes, evaluate.modality, evaluate.pair, omega, len(kinds),
                                       rule.cooccur_threshold, has)
        out[name] = {**aucs(score.tolist(), kinds), "with_omega": int(has.sum()),
                     "live": int((codes > 0).any(0).sum())}
    return out


def demo_sae() -> dict:
    """The demo SAE's AUCs on its own evaluation pool, under the official and normalised rules."""
    from analysis.model_access import anatomy
    from analysis.model_access.models import ModelSpec, load_model
    from analysis.sae_v import by_kind, load_sae, load_store, rank_dataset

    folder = ROOT / "analysis" / "zoo" / "sae" / "shapes-vlm" / "layer1"
    handle = load_model(ModelSpec.parse("zoo:shapes-vlm"))
    store = load_store(folder)
    sae, meta = load_sae(folder)
    out = {"rules": {}, "pool_seed": store.pairs.seed}
    for rule in ("official", "normalised"):
        ranking = rank_dataset(handle, sae, meta, store, store.pairs, rule=rule)
        per_kind = by_kind(ranking.rows)
        out["rules"][f"demo SAE, {rule}"] = {"all": round(ranking.roc_auc, 4),
                                             **{k: round(per_kind[k]["roc_auc_vs_clean"], 4) for k in KINDS}}
    out["sae_layer"] = meta.layer
    out["clustering"] = clustering_rows(handle, meta, store)
    out["object_tokens_r2"] = {str(layer): object_token_code(handle, layer)
                               for layer in range(anatomy.n_layers(handle.model))}
    return out


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise ValueError(f"--seeds takes non-negative integers separated by commas, got '{text}'")
    return seeds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="2,0,1", help="evaluation pools (2: the demo SAE's own)")
    ap.add_argument("--pairs", type=int, default=300, help="pairs per pool (a third of each kind)")
    ap.add_argument("--no-sae", action="store_true", help="ground-truth codes only (no model)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    try:
        seeds = _seeds(args.seeds)
        if args.pairs < 6:
            raise ValueError(f"--pairs must be at least 6, got {args.pairs}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    pools = {seed: ceiling(sw.corrupted_pairs(ShapesDataset.EVAL_BASE + seed, args.pairs)) for seed in seeds}
    record = {"benchmark": "SAE-V s_i ceiling from ground-truth codes", "pairs_per_pool": args.pairs,
              "pools": {str(seed): rows for seed, rows in pools.items()}}
    if not args.no_sae:
        record["demo_sae"] = demo_sae()
    record["seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")

    print(f"| code and s_i | {' | '.join(f'pool {s}: all / other scene / swapped' for s in seeds)} |")
    print("|---|" + "---|" * len(seeds))
    for name in pools[seeds[0]]:
        cells = [" / ".join(f"{pools[s][name][k]:.2f}" for k in ("all",) + KINDS) for s in seeds]
        print(f"| {name} | {' | '.join(cells)} |")
    demo = record.get("demo_sae", {})
    for name, row in demo.get("rules", {}).items():
        cells = [" / ".join(f"{row[k]:.2f}" for k in ("all",) + KINDS) if s == demo["pool_seed"] else "–"
                 for s in seeds]
        print(f"| {name} (its own pool, {demo['pool_seed']}) | {' | '.join(cells)} |")
    for name, row in demo.get("clustering", {}).items():
        cells = [" / ".join(f"{row[k]:.2f}" for k in ("all",) + KINDS) if s == demo["pool_seed"] else "–"
                 for s in seeds]
        print(f"| {name}: {row['with_omega']} with an omega of {row['live']} live, official (pool "
              f"{demo['pool_seed']}) | {' | '.join(cells)} |")
    if "object_tokens_r2" in demo:
        print("\n| residual after layer | at | tokens (fit / scored) | R², sum of attribute vectors | + pairwise "
              "interactions | one mean per whole object |\n|---|---|---|---|---|---|")
        for layer, rows in demo["object_tokens_r2"].items():
            for where, r2 in rows.items():
                print(f"| {layer} | {where} | {r2['tokens_fit_scored'][0]} / {r2['tokens_fit_scored'][1]} | "
                      f"{r2['sum_of_attributes']:.3f} | {r2['with_pairwise_interactions']:.3f} | "
                      f"{r2['one_mean_per_object']:.3f} |")
    print(f"({record['seconds']} s; written to {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

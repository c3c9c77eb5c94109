"""SAE-V data filtering at demo scale: does training on the pairs with the highest cross-modal score
give a better model than training on a random half, or on everything?

The experiment of the SAE-V paper (rank image-text pairs by s_i, keep the top share, fine-tune), on
Shapes World, where we know which pairs are corrupted:

1. A training pool of image-caption pairs from validation-split scenes (the zoo VLM never trained
   on them); a known share (default 40 %) is corrupted: half of those carry another scene's caption,
   half a caption with swapped attributes (`shapes_world.swap_attributes`).
2. Rank the pool by s_i with the model's demo SAE (ω from the pool's own activations, with the
   official rule `analysis.sae_v.score_rule("official")`: ω only for features with >= 5 text and
   >= 5 image tokens among their top 30, s_i summing ω over those features active (> 1) on both a
   text and an image token of the pair). No corruption label is used for the ranking.
3. Fine-tune the same starting checkpoint on (a) the whole pool, (b) the top 50 % by s_i, (c) a
   random 50 %, (d) the clean pairs only (oracle), and (e) the top 50 % by the labelled `normalised`
   variant of s_i (the same ω; s_i divided by the |ω| active on either side; not the paper's rule).
   Every condition trains for the same number of epochs over its own subset (so (a) takes twice
   the steps of (b)/(c), as in the paper: less data, less compute). A pair yields two training rows: its caption (the caption prompt), and one
   yes/no question answered as the *caption* says (half true, half false claims about the scene the
   caption describes): instruction data generated from captions, so a wrong caption teaches wrong
   answers.
4. Measure each fine-tuned model on held-out test-split scenes: balanced yes/no claim accuracy and
   greedy captions' factuality / coverage. Repeat for several seeds (the seed changes the random
   half and the training order; the pool and the ranking stay fixed).

    python benchmarks/sae_v_filtering.py                 # default scale (see --help), writes the JSON
    python benchmarks/sae_v_filtering.py --smoke         # seconds: checks that everything runs

Runs on CPU with one thread (`torch.set_num_threads(1)`); the JSON records the wall time. The
committed `benchmarks/results/sae_v_filtering.json` adds a hand-written `note` on what was measured.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS, ROOT  # noqa: E402  (every project path comes from analysis/framework/paths.py)

from analysis.zoo import cards  # noqa: E402
from analysis.world import shapes_world as sw  # noqa: E402

RESULT_FILE = RESULTS / "sae_v_filtering.json"
CONDITIONS = ("whole_pool", "top_half_by_s_i", "random_half", "clean_only_oracle", "top_half_by_normalised_s_i")
POOL_BASE = 10_500_000  # validation-split scenes, disjoint from the SAE's own train/eval pairs
OTHER_BASE = 10_700_000  # scenes whose captions are given to other-scene pairs


# ---------------------------------------------------------------------------------------------
# 1. The pool


def make_pool(n: int, corrupted: float, seed: int = 0) -> list[dict]:
    """n pairs; round(n * corrupted) of them corrupted, split between other-scene and swapped captions.

    Each pair: image scene seed, caption, the scene the caption describes (`text_scene`), kind."""
    rng = random.Random(f"filtering-pool-{seed}")
    n_bad = round(n * corrupted)
    kinds = ["other_scene"] * (n_bad // 2) + ["swapped"] * (n_bad - n_bad // 2) + ["clean"] * (n - n_bad)
    rng.shuffle(kinds)
    pool = []
    for i, kind in enumerate(kinds):
        image_seed = POOL_BASE + seed * 10_000 + i
        scene = sw.generate_scene(image_seed)
        text_scene = scene
        if kind == "other_scene":
            j = 0
            while True:
                text_scene = sw.generate_scene(OTHER_BASE + seed * 10_000 + i * 13 + j)
                if sw.caption(text_scene) != sw.caption(scene):
                    break
                j += 1
        elif kind == "swapped":
            k = 0
            text_scene = sw.swap_attributes(scene, rng)
            while text_scene is None and k < 10:  # no swap changes the scene: another scene's caption
                text_scene = sw.generate_scene(OTHER_BASE + 5_000 + seed * 10_000 + i * 13 + k)
                k += 1
        pool.append({"image_seed": image_seed, "text_seed": text_scene.seed, "kind": kind,
                     "corrupted": kind != "clean", "caption": sw.caption(text_scene), "_text_scene": text_scene})
    return pool


# ---------------------------------------------------------------------------------------------
# 2. The SAE-V score


def score_pool(model_name: str, layer: int, pool: list[dict]) -> dict:
    """s_i for every pair with the committed demo SAE of `model_name` at `layer`."""
    from analysis import sae_v
    from analysis.model_access.models import ModelSpec, load_model

    handle = load_model(ModelSpec("zoo", model_name))
    folder = sae_v.demo_folder(handle, layer)
    if folder is None:
        raise SystemExit(f"error: no committed demo SAE for {model_name} at layer {layer}")
    sae, meta = sae_v.load_sae(folder)
    pairs = sae_v.PairSet(dataset="shapes", seed=0, image_size=handle.info.image_size,
                          pairs=[sae_v.Pair(text=p["caption"], image_seed=p["image_seed"], corrupted=p["corrupted"],
                                            kind=p["kind"]) for p in pool])
    acts = sae_v.collect_activations(handle, pairs, layer)
    codes = sae_v.encode(sae, sae_v.scaled(acts, meta.scales))
    rule = sae_v.score_rule("official")
    omega, defined = rule.weights(acts.acts, codes, acts.modality)
    score, _, shared = sae_v.pair_scores(codes, acts.modality, acts.pair, omega, len(pool),
                                         threshold=rule.cooccur_threshold, has_omega=defined)
    variant = sae_v.score_rule("normalised")  # same omega; s_i as a share (labelled variant)
    share, _, _ = variant.pair_scores(codes, acts.modality, acts.pair, omega, len(pool), variant.cooccur_threshold,
                                      defined)

    def auc(values):
        return sae_v.roc_auc([float(s) for s, p in zip(values, pool) if not p["corrupted"]],
                             [float(s) for s, p in zip(values, pool) if p["corrupted"]])

    return {"scores": [float(s) for s in score], "roc_auc": auc(score),
            "normalised_scores": [float(s) for s in share], "normalised_roc_auc": auc(share),
            "cross_modal_features": int(defined.sum()), "rule": rule.label,
            "cooccur_threshold": rule.cooccur_threshold, "stale": sae_v.is_stale(handle, meta),
            "sae": str(folder.relative_to(ROOT)), "path": handle.path}


# ---------------------------------------------------------------------------------------------
# 3. Fine-tuning


def pair_rows(pair: dict, rng: random.Random) -> list[tuple[str, str]]:
    """The caption row and one yes/no row answered as the caption says."""
    claim = sw.question_set(pair["_text_scene"], rng, 1)[0]
    return [(sw.VLM_CAPTION_PROMPT, pair["caption"]),
            (sw.vlm_question_prompt(claim.text), sw.vlm_answer(claim.truth))]


def fine_tune(path: str, subset: list[dict], epochs: int, batch: int, lr: float, seed: int):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from analysis.zoo import train

    model = LlavaForConditionalGeneration.from_pretrained(path)
    processor = AutoProcessor.from_pretrained(path)
    tok = processor.tokenizer
    n_img = (model.config.vision_config.image_size // model.config.vision_config.patch_size) ** 2
    size = model.config.vision_config.image_size
    train.set_attention(model, "sdpa")
    model.train()
    tower = {id(p) for p in model.model.vision_tower.parameters()}
    params = [p for p in model.parameters() if id(p) not in tower]  # the tower stays as it is (LLaVA stage 2)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    rng = random.Random(f"filtering-train-{seed}")
    torch.manual_seed(seed)
    order = []
    for _ in range(epochs):
        ep = list(subset)
        rng.shuffle(ep)
        order += ep
    steps = math.ceil(len(order) / batch)
    for step in range(steps):
        chunk = order[step * batch:(step + 1) * batch]
        examples, images = [], []
        for p in chunk:
            img = sw.render(sw.generate_scene(p["image_seed"]), size)
            for row in pair_rows(p, rng):
                examples.append(row)
                images.append(img)
        ids, mask, labels = train.vlm_collate(tok, n_img, examples)
        pixels = train.pixel_tensor(images, processor)
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 5)
        logits = model(input_ids=ids, attention_mask=mask, pixel_values=pixels).logits
        loss, _ = train.shifted_loss(logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    train.set_attention(model, "eager")
    model.eval()
    return model, processor, steps


# ---------------------------------------------------------------------------------------------
# 4. Held-out evaluation


def evaluate(model, processor, yes_no_scenes: int, caption_scenes: int) -> dict:
    from analysis.zoo import train

    tok = processor.tokenizer
    size = model.config.vision_config.image_size
    n_img = (size // model.config.vision_config.patch_size) ** 2
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    rng = random.Random("filtering-eval-yesno")
    right = total = 0
    scenes = [sw.generate_scene(s) for s in sw.split_seeds("test", yes_no_scenes)]
    with torch.no_grad():
        for start in range(0, len(scenes), 25):
            chunk = scenes[start:start + 25]
            rows, images, truth = [], [], []
            for scene in chunk:
                for claim in sw.question_set(scene, rng, 2):
                    rows.append(train.vlm_ids(tok, sw.vlm_question_prompt(claim.text), n_img))
                    images.append(sw.render(scene, size))
                    truth.append(claim.truth)
            width = max(map(len, rows))
            lengths = torch.tensor([len(r) for r in rows])
            ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
            mask = (torch.arange(width)[None] < lengths[:, None]).long()
            logits = model(input_ids=ids, attention_mask=mask, pixel_values=train.pixel_tensor(images, processor)).logits
            last = logits[torch.arange(len(rows)), lengths - 1]
            pred = (last[:, yes] > last[:, no]).tolist()
            right += sum(p == t for p, t in zip(pred, truth))
            total += len(rows)
        cap_scenes = [sw.generate_scene(s) for s in sw.split_seeds("test", yes_no_scenes + caption_scenes)[yes_no_scenes:]]
        prompt = train.vlm_ids(tok, sw.VLM_CAPTION_PROMPT, n_img)
        texts = []
        for start in range(0, len(cap_scenes), 25):
            chunk = cap_scenes[start:start + 25]
            ids = torch.tensor([prompt] * len(chunk))
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 pixel_values=train.pixel_tensor([sw.render(s, size) for s in chunk], processor),
                                 max_new_tokens=64, do_sample=False, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
            texts += [sw.normalize(t) for t in tok.batch_decode(gen[:, ids.shape[1]:], skip_special_tokens=True)]
    scores = cards.caption_scores(cap_scenes, texts)
    return {"yes_no": right / total, "factuality": scores["factuality"], "coverage": scores["coverage"]}


# ---------------------------------------------------------------------------------------------
# The experiment


def subsets(pool: list[dict], scores: list[float], keep: float, seed: int,
            normalised: list[float] | None = None) -> dict[str, list[dict]]:
    n_keep = round(len(pool) * keep)

    def top(values):
        return [pool[i] for i in sorted(sorted(range(len(pool)), key=lambda i: (-values[i], i))[:n_keep])]

    rng = random.Random(f"filtering-random-{seed}")
    out = {
        "whole_pool": list(pool),
        "top_half_by_s_i": top(scores),
        "random_half": [pool[i] for i in sorted(rng.sample(range(len(pool)), n_keep))],
        "clean_only_oracle": [p for p in pool if not p["corrupted"]],
    }
    if normalised is not None:
        out["top_half_by_normalised_s_i"] = top(normalised)
    return out


def _spread(xs: list[float]) -> dict:
    return {"mean": round(statistics.fmean(xs), 4), "std": round(statistics.stdev(xs), 4) if len(xs) > 1 else 0.0}


def ranking_stats(scores: list[float], flags: list[bool], kinds: list[str], keep: float) -> dict:
    """What keeping the top `keep` share by s_i does to the pool (ties broken by pool order)."""
    n_keep = round(len(scores) * keep)
    top = set(sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:n_keep])
    n_bad = sum(flags)
    removed_bad = sum(f for i, f in enumerate(flags) if i not in top)
    return {
        "top_half_precision_clean": round(sum(not flags[i] for i in top) / max(1, n_keep), 4),
        "corrupted_removed_recall": round(removed_bad / max(1, n_bad), 4),
        "top_half_kinds": {k: sum(kinds[i] == k for i in top) for k in ("clean", "other_scene", "swapped")},
        "s_i_distinct_values": len(set(scores)),
        "s_i_zero_share": round(sum(s == 0 for s in scores) / max(1, len(scores)), 4),
    }


def verdict(conditions: dict, n_questions: int) -> dict:
    """The issue's two comparisons on mean yes/no accuracy, each with its noise: the standard error
    of a difference of two means over seeds, and the binomial standard error of one measurement."""
    yn = {name: conditions[name]["summary"]["yes_no"]["mean"] for name in CONDITIONS}

    def compare(a: str, b: str) -> dict:
        xa, xb = conditions[a]["yes_no"], conditions[b]["yes_no"]
        se = math.sqrt(statistics.variance(xa) / len(xa) + statistics.variance(xb) / len(xb)) \
            if min(len(xa), len(xb)) > 1 else float("nan")
        diff = statistics.fmean(xa) - statistics.fmean(xb)
        return {"difference": round(diff, 4), "standard_error": round(se, 4),
                "beyond_two_standard_errors": bool(abs(diff) > 2 * se)}

    return {
        "top_half_beats_random_half_yes_no": yn["top_half_by_s_i"] > yn["random_half"],
        "top_half_at_least_whole_pool_yes_no": yn["top_half_by_s_i"] >= yn["whole_pool"],
        "top_half_minus_random_half": compare("top_half_by_s_i", "random_half"),
        "top_half_minus_whole_pool": compare("top_half_by_s_i", "whole_pool"),
        "yes_no_means": yn,
        "binomial_standard_error_one_run": round(math.sqrt(0.9 * 0.1 / n_questions), 4),
    }


def run(args) -> dict:
    torch.set_num_threads(1)
    start = time.time()
    pool = make_pool(args.pool, args.corrupted)
    ranked = score_pool(args.model, args.layer, pool)
    scores = ranked["scores"]
    base_model = None
    conditions: dict[str, dict] = {}
    timings = {}
    for seed in range(args.seeds):
        subs = subsets(pool, scores, args.keep, seed, ranked["normalised_scores"])
        for name in CONDITIONS:
            t = time.time()
            model, processor, steps = fine_tune(ranked["path"], subs[name], args.epochs, args.batch, args.lr, seed)
            metrics = evaluate(model, processor, args.yes_no_scenes, args.caption_scenes)
            entry = conditions.setdefault(name, {"yes_no": [], "factuality": [], "coverage": [], "kept": 0,
                                                 "kept_corrupted": [], "steps": steps})
            for key in ("yes_no", "factuality", "coverage"):
                entry[key].append(round(metrics[key], 4))
            entry["kept"] = len(subs[name])
            entry["kept_corrupted"].append(sum(p["corrupted"] for p in subs[name]))
            timings.setdefault(name, []).append(round(time.time() - t, 1))
            print(f"seed {seed} {name}: kept {len(subs[name])} ({entry['kept_corrupted'][-1]} corrupted) "
                  f"steps {steps} {metrics} {time.time() - t:.0f}s", flush=True)
        if seed == 0:
            from transformers import AutoProcessor, LlavaForConditionalGeneration

            base = LlavaForConditionalGeneration.from_pretrained(ranked["path"]).eval()
            base_model = {k: round(v, 4) for k, v in
                          evaluate(base, AutoProcessor.from_pretrained(ranked["path"]), args.yes_no_scenes,
                                   args.caption_scenes).items()}
    for entry in conditions.values():
        entry["summary"] = {key: _spread(entry[key]) for key in ("yes_no", "factuality", "coverage")}
    flags = [p["corrupted"] for p in pool]
    return {
        "benchmark": "SAE-V data filtering (paper's experiment at demo scale)",
        "scale": "smoke" if args.smoke else args.scale_note,
        "model": args.model,
        "sae": {"folder": ranked["sae"], "layer": args.layer, "cross_modal_features": ranked["cross_modal_features"],
                "stale": ranked["stale"], "score_rule": ranked["rule"],
                "cooccur_threshold": ranked["cooccur_threshold"]},
        "pool": {"pairs": len(pool), "corrupted": sum(flags),
                 "kinds": {k: sum(p["kind"] == k for p in pool) for k in ("clean", "other_scene", "swapped")},
                 "scenes": f"validation split from {POOL_BASE}", "s_i_roc_auc_clean_vs_corrupted": ranked["roc_auc"],
                 "keep_fraction": args.keep, **ranking_stats(scores, flags, [p["kind"] for p in pool], args.keep),
                 "s_i": [round(s, 4) for s in scores], "corrupted_flags": flags,
                 "normalised_s_i": {"roc_auc_clean_vs_corrupted": ranked["normalised_roc_auc"],
                                    **ranking_stats(ranked["normalised_scores"], flags, [p["kind"] for p in pool],
                                                    args.keep)}},
        "training": {"epochs": args.epochs, "batch_pairs": args.batch, "rows_per_pair": 2, "lr": args.lr,
                     "trained": "language model + projector (vision tower frozen)", "seeds": args.seeds,
                     "budget": "same epochs per condition (whole pool: twice the steps of a half)"},
        "eval": {"yes_no_scenes": args.yes_no_scenes, "yes_no_questions": 2 * args.yes_no_scenes,
                 "caption_scenes": args.caption_scenes, "split": "test"},
        "starting_checkpoint": base_model,
        "conditions": conditions,
        "verdict": verdict(conditions, 2 * args.yes_no_scenes),
        "seconds_per_run": timings,
        "seconds": round(time.time() - start, 1),
        "threads": torch.get_num_threads(),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="shapes-vlm", help="zoo model with a committed demo SAE")
    parser.add_argument("--layer", type=int, default=1)
    parser.add_argument("--pool", type=int, default=200)
    parser.add_argument("--corrupted", type=float, default=0.4)
    parser.add_argument("--keep", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="pairs per step (two rows each)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--yes-no-scenes", type=int, default=200)
    parser.add_argument("--caption-scenes", type=int, default=50)
    parser.add_argument("--scale-note", default="demo (reduced for a 2-core CPU)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that everything runs")
    parser.add_argument("--out", type=Path, default=RESULT_FILE)
    args = parser.parse_args(argv)
    if args.smoke:
        args.pool, args.epochs, args.seeds, args.yes_no_scenes, args.caption_scenes = 20, 1, 2, 10, 4
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("verdict", "seconds")}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m analysis sae ...`: train or load an SAE, print its summary, rank its evaluation pairs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from analysis.sae_v.build import build, demo_folder
from analysis.sae_v.scores import rank_dataset
from analysis.sae_v.store import load_store
from analysis.sae_v.training import load_sae
from analysis.sae_v.types import ARCHITECTURES, BuildParams, FeatureCard, TrainParams


def cli(argv: list[str]) -> int:
    import argparse

    from analysis.models import ModelSpec, load_model

    parser = argparse.ArgumentParser(prog="python -m analysis sae",
                                     description="SAE-V: train an SAE over image+text tokens, summarise its features, "
                                                 "rank image-caption pairs by cross-modal score.")
    parser.add_argument("--model", default="zoo:shapes-vlm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    parser.add_argument("--layer", type=int, default=None, help="decoder layer (default: the middle one)")
    parser.add_argument("--sae", default=None, help="folder of a saved SAE + feature store (skips training)")
    parser.add_argument("--out", default=None, help="where to write a newly trained SAE + store")
    parser.add_argument("--arch", default="topk", choices=ARCHITECTURES)
    parser.add_argument("--d-sae", type=int, default=512)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--train-pairs", type=int, default=600)
    parser.add_argument("--eval-pairs", type=int, default=300)
    parser.add_argument("--dataset", default="", help="shapes | noise (default: shapes on the demo VLM)")
    parser.add_argument("--feature", type=int, default=None, help="print this feature's card")
    parser.add_argument("--rank", action="store_true", help="also rank the evaluation pairs by s_i")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)

    handle = load_model(ModelSpec.parse(args.model))
    layer = args.layer if args.layer is not None else handle.info.layers // 2
    if args.sae:
        folder = Path(args.sae)
    else:
        folder = demo_folder(handle, layer) if args.out is None else None
        if folder is None:
            params = BuildParams(layer=layer, dataset=args.dataset, train_pairs=args.train_pairs,
                                 eval_pairs=args.eval_pairs,
                                 train=TrainParams(architecture=args.arch, d_sae=args.d_sae, k=args.k, steps=args.steps))
            folder = build(handle, params, args.out)
    store = load_store(folder)
    if args.feature is not None:
        if not 0 <= args.feature < len(store.features):
            print(f"error: feature {args.feature} out of range (0..{len(store.features) - 1})", file=__import__("sys").stderr)
            return 2
        card = store.features[args.feature]
        print(card.to_json(indent=1) if args.json else _card_text(card))
        return 0
    out: dict[str, Any] = {"folder": str(folder), "meta": store.meta.to_dict(), "summary": store.summary()}
    if args.rank:
        sae, meta = load_sae(folder)
        ranking = rank_dataset(handle, sae, meta, store, store.pairs)
        out["ranking"] = {"roc_auc": ranking.roc_auc, "roc_auc_weighted": ranking.roc_auc_weighted,
                          "precision": ranking.precision, "recall": ranking.recall}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"SAE in {folder}")
        for key, value in {**store.meta.to_dict(), **out["summary"], **out.get("ranking", {})}.items():
            if key != "train":
                print(f"  {key:22s} {value}")
    return 0


def _card_text(card: FeatureCard) -> str:
    lines = [f"feature {card.index}: {card.label}, omega={card.omega:.3f}, density={card.density:.4f}"]
    if card.concept_both:
        lines.append(f"  concept (both): {card.concept_both.name} p={card.concept_both.precision:.2f}")
    lines.append("  logit lens: " + ", ".join(s.key for s in card.logit_tokens))
    return "\n".join(lines)


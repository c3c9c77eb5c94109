"""`python -m analysis sae ...`: train or load an SAE, print its summary, rank its evaluation pairs."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from analysis import anatomy
from analysis.registry import SettingsError, check_range
from analysis.sae_v.build import build, demo_folder, rebuild_store
from analysis.sae_v.scores import SCORE_RULES, by_kind, keep_top, rank_dataset, score_rule
from analysis.sae_v.store import load_store
from analysis.sae_v.training import load_sae
from analysis.sae_v.types import (
    ARCHITECTURES, STORE_FILE, BuildParams, FeatureCard, StoreParams, TrainParams,
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as SettingsError (one `error:` line), not usage + exit 2."""

    def error(self, message: str):
        raise SettingsError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m analysis sae",
                     description="SAE-V: train an SAE over image+text tokens, summarise its features, "
                                 "rank image-caption pairs by cross-modal score.")
    parser.add_argument("--model", default="zoo:shapes-vlm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    parser.add_argument("--layer", type=int, default=None, help="decoder layer (default: the middle one)")
    parser.add_argument("--sae", default=None, help="folder of a saved SAE + feature store (skips training)")
    parser.add_argument("--out", default=None, help="where to write a newly trained SAE + store")
    parser.add_argument("--arch", default="topk", help=f"SAE architecture: {' | '.join(ARCHITECTURES)}")
    parser.add_argument("--d-sae", type=int, default=512)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--train-pairs", type=int, default=600)
    parser.add_argument("--eval-pairs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dataset", default="", help="shapes | noise (default: shapes on the demo VLM)")
    parser.add_argument("--rule", default=None,
                        help=f"score rule for omega and s_i: {' | '.join(SCORE_RULES.names())} "
                             "(default: official; with a stored SAE, --rank recomputes omega under this rule)")
    parser.add_argument("--rebuild-store", action="store_true",
                        help="recompute the feature store of the chosen SAE (same weights and pairs; with --rule)")
    parser.add_argument("--feature", type=int, default=None, help="print this feature's card")
    parser.add_argument("--rank", action="store_true", help="also rank the evaluation pairs by s_i")
    parser.add_argument("--keep", type=float, default=0.5,
                        help="with --rank: share of pairs kept, for precision/recall of the corrupted ones removed")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def cli(argv: list[str]) -> int:
    from analysis.models import ModelSpec, load_model

    args = _parser().parse_args(argv)
    rule = score_rule(args.rule) if args.rule else None  # unknown names: SettingsError
    check_range("--keep", args.keep, low=0.0, high=1.0)
    train = TrainParams(architecture=args.arch, d_sae=args.d_sae, k=args.k, steps=args.steps)
    store_params = StoreParams(score_rule=rule.name if rule else StoreParams.score_rule)
    params = BuildParams(layer=0 if args.layer is None else args.layer, dataset=args.dataset,
                         train_pairs=args.train_pairs, eval_pairs=args.eval_pairs, seed=args.seed, train=train,
                         store=store_params)
    params.validate()  # everything but the layer's upper bound, before the model loads
    if args.feature is not None:
        check_range("--feature", args.feature, low=0, integer=True)
    handle = load_model(ModelSpec.parse(args.model))
    layer = args.layer if args.layer is not None else handle.info.layers // 2
    anatomy.check_layer(handle.model, layer)
    if args.sae:
        folder = Path(args.sae)
        if not (folder / STORE_FILE).is_file():
            raise SettingsError(f"no SAE feature store in '{folder}'.")
    else:
        folder = demo_folder(handle, layer) if args.out is None else None
        if folder is None:
            params.layer = layer
            folder = build(handle, params, args.out)
    if args.rebuild_store:
        rebuild_store(handle, folder, rule.name if rule else None)
    store = load_store(folder)
    if args.feature is not None:
        if args.feature >= len(store.features):
            raise SettingsError(f"--feature must be between 0 and {len(store.features) - 1}, got {args.feature}.")
        card = store.features[args.feature]
        print(card.to_json(indent=1) if args.json else _card_text(card))
        return 0
    out: dict[str, Any] = {"folder": str(folder), "meta": store.meta.to_dict(), "summary": store.summary()}
    if args.rank:
        sae, meta = load_sae(folder)
        ranking = rank_dataset(handle, sae, meta, store, store.pairs, rule=rule)
        out["ranking"] = {"roc_auc": ranking.roc_auc, "roc_auc_weighted": ranking.roc_auc_weighted,
                          "precision": ranking.precision, "recall": ranking.recall, "rule": ranking.rule,
                          "threshold": ranking.threshold, "scored_pairs": sum(r.score != 0 for r in ranking.rows),
                          "keep": keep_top(ranking.rows, args.keep), "by_kind": by_kind(ranking.rows)}
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


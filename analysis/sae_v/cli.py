"""`python -m analysis sae ...`: train or load an SAE (ours, or one saved by sae-lens), summarise its
features, rank pairs by s_i (the SAE's own evaluation pairs, or your data) and export them, or steer.

Flags come from the settings' fields (analysis/framework/settings.py) where one exists, so ranges and help are the
page's; errors are one `error:` line (exit 1).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from analysis.model_access import anatomy
from analysis.framework.errors import SettingsError
from analysis.sae_v.architectures import ARCHITECTURES
from analysis.sae_v.build import available_saes, build, demo_folder, rebuild_store
from analysis.sae_v.filtering import rank, rank_refusal, write_exports
from analysis.sae_v.params import (
    BuildParams, Keep, RankParams, SaeChoice, SteerParams, StoreParams, TrainParams, parse_steer,
)
from analysis.sae_v.rules import SCORE_RULES, rule_settings
from analysis.sae_v.scores import by_kind, keep_top
from analysis.sae_v.access import shown
from analysis.sae_v.sources import Source, choose, locate, store_for
from analysis.sae_v.types import FeatureCard, Ranking
from analysis.framework.settings import ArgumentParser, add_arguments, check_settings, labelled, read_arguments

TRAIN = [(f, TrainParams) for f in labelled(TrainParams)]
BUILD = [(f, BuildParams) for f in labelled(BuildParams) if f.name != "layer"]
CHOICE = [(f, SaeChoice) for f in labelled(SaeChoice)]
RANK = [(f, RankParams) for f in labelled(RankParams) if f.name in ("rule", "by")]
STEER = [(f, SteerParams) for f in labelled(SteerParams) if f.name in ("mode", "prompt", "max_new_tokens", "positions")]
KEEP = [(f, Keep) for f in labelled(Keep)]


def parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m analysis sae",
                        description="SAE-V: train or load an SAE over image+text tokens, summarise its features, rank "
                                    "image-caption pairs by cross-modal score (and export them), or steer a feature.")
    ap.add_argument("--model", default="zoo:shapes-vlm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    ap.add_argument("--layer", type=int, default=None, help="decoder layer (default: the middle one, or the "
                                                            "outside SAE's own)")
    ap.add_argument("--sae", default=None, help="an SAE: a folder this panel trained, a folder saved by sae-lens "
                                                "(cfg.json + sae_weights.safetensors), or sae-lens:RELEASE/SAE_ID")
    ap.add_argument("--out", default=None, help="where to write a newly trained SAE + store")
    add_arguments(ap, TRAIN + ARCHITECTURES.settings() + BUILD + CHOICE + RANK + SCORE_RULES.settings() + KEEP + STEER)
    ap.add_argument("--dataset", default="", help="generated pairs: shapes | scenes | noise (default: the model's)")
    ap.add_argument("--data", default=None, help="your data: a folder with captions.jsonl / captions.csv, a Parquet "
                                                 "file, a datasets folder (save_to_disk), or texts.txt / texts.jsonl")
    ap.add_argument("--rebuild-store", action="store_true",
                    help="recompute the feature store of the chosen SAE (same weights and pairs; with --rule)")
    ap.add_argument("--feature", type=int, default=None, help="print this feature's card")
    ap.add_argument("--rank", action="store_true", help="also rank the pairs by s_i")
    ap.add_argument("--export", default=None, help="with --rank: write the ranked list (OUT.csv or OUT.jsonl)")
    ap.add_argument("--export-kept", default=None, help="with --rank and --data: write the kept pairs in the "
                                                        "data's own format (a file, or into a folder)")
    ap.add_argument("--steer", action="append", default=[], metavar="K=STRENGTH",
                    help="generate with feature K added at this strength (repeatable)")
    ap.add_argument("--image", default=None, help="with --steer on a vision-language model: the image")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


def cli(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    with _also_allowed(args.sae, args.out, args.data):
        return _run(args)


@contextlib.contextmanager
def _also_allowed(*paths: str | None):
    """The folders named on the command line may be read, for this command only (the app reads only those
    under MODEL_INSPECTOR_ROOTS)."""
    from analysis.model_access.models import allowed_roots

    old = os.environ.get("MODEL_INSPECTOR_ROOTS")
    named = [str(Path(p).expanduser().resolve()) for p in paths if p and not str(p).startswith("sae-lens:")]
    os.environ["MODEL_INSPECTOR_ROOTS"] = os.pathsep.join([str(r) for r in allowed_roots()] + named)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MODEL_INSPECTOR_ROOTS", None)
        else:
            os.environ["MODEL_INSPECTOR_ROOTS"] = old


def _run(args) -> int:
    from analysis.model_access.models import ModelSpec, load_model

    values = read_arguments(args, TRAIN + BUILD + CHOICE + RANK + KEEP + STEER)
    rules = rule_settings(**read_arguments(args, SCORE_RULES.settings()))
    train = TrainParams(**_pick(values, TrainParams), architectures=_architectures(args))
    params = BuildParams(layer=0 if args.layer is None else args.layer, dataset=args.dataset, train=train,
                         store=StoreParams(score_rule=values.get("rule", StoreParams.score_rule)),
                         **_pick(values, BuildParams))
    params.validate()  # everything but the layer's upper bound, before the model loads
    keep = Keep(**_pick(values, Keep))
    check_settings(keep)
    keep = keep.keep
    ranked = RankParams(rules=rules, **_pick(values, RankParams, skip=("sae", "data")))
    ranked.validate()
    steer = parse_steer(args.steer)
    if args.feature is not None and args.feature < 0:
        raise SettingsError(f"--feature must be at least 0, got {args.feature}.")
    handle = load_model(ModelSpec.parse(args.model))
    refusal = rank_refusal(handle) if args.rank else None
    if refusal:  # the page refuses the same request
        raise SettingsError(refusal)
    source = locate(handle, args.sae) if args.sae else None  # resolved once (a bad SAE: one error line)
    if steer:
        return _steer(handle, args, steer, _pick(values, SteerParams, skip=("sae", "data")), source)
    if args.data is not None or (source is not None and source.outside):
        return _on_data(handle, args, ranked, keep, source)
    return _ours(handle, args, params, ranked, keep, source)


def _pick(values: dict, cls, skip: tuple = ()) -> dict:
    return {k: v for k, v in values.items() if k in cls.__dataclass_fields__ and k not in skip}


def _architectures(args) -> dict[str, dict]:
    from analysis.sae_v.architectures import architecture_settings

    return architecture_settings(**read_arguments(args, ARCHITECTURES.settings()))


def _sae_source(handle, args, params: BuildParams, source: Source | None) -> Source:
    """--sae as resolved, else the demo SAE of the layer, else a newly trained one (--out or the cache)."""
    if source is not None:
        return source
    layer = args.layer if args.layer is not None else handle.info.layers // 2
    anatomy.check_layer(handle.model, layer)
    folder = demo_folder(handle, layer) if args.out is None else None
    if folder is None:
        params.layer = layer
        folder = build(handle, params, args.out, progress=_progress())
    known = {f.name: f for f in available_saes(handle)}
    return locate(handle, folder.name if known.get(folder.name) == folder else str(folder))


def _ours(handle, args, params: BuildParams, ranked: RankParams, keep: float, source: Source | None) -> int:
    """Our own SAE on its own evaluation pairs (the committed demo one, or trained now)."""
    from analysis.sae_v.store import load_store
    from analysis.sae_v.types import STORE_FILE

    if source is not None and not (source.folder / STORE_FILE).is_file():
        raise SettingsError(f"no SAE feature store in '{shown(source.locator)}'.")
    if args.layer is not None:
        anatomy.check_layer(handle.model, args.layer)
    source = _sae_source(handle, args, params, source)
    folder = source.folder
    if args.rebuild_store:
        rebuild_store(handle, folder, ranked.rule if "rule" in read_arguments(args, RANK) else None)
        source = locate(handle, source.locator)  # its files changed: a new fingerprint
    store = load_store(folder)
    if args.feature is not None:
        return _print_card(store, args)
    out: dict[str, Any] = {"folder": str(folder), "meta": store.meta.to_dict(), "summary": store.summary()}
    if args.rank:
        choice = choose(handle, source, "", RankParams, rule=ranked.rule, rules=ranked.rules, by=ranked.by)
        ranking = rank(handle, choice, progress=_progress())
        out["ranking"] = _ranking_summary(ranking, keep)
        if args.export:
            out["exported"] = [str(p) for p in write_exports(ranking, keep, args.export)]
    return _print(out, args, store.meta.to_dict())


def _on_data(handle, args, ranked: RankParams, keep: float, source: Source | None) -> int:
    """Any SAE (an outside one included) on any data: the feature store of a sample, then the ranking."""
    params = BuildParams(layer=args.layer if args.layer is not None else 0)
    source = _sae_source(handle, args, params, source)
    data = args.data if args.data is not None else (f"dataset:{args.dataset}" if args.dataset else "")
    extra = {"layer": args.layer} if args.layer is not None and source.outside else {}
    choice = choose(handle, source, data, RankParams, rule=ranked.rule, rules=ranked.rules, by=ranked.by,
                    store_pairs=ranked.store_pairs, batch_pairs=ranked.batch_pairs, **extra)
    store = store_for(handle, choice, progress=_progress(), source=source)
    if args.feature is not None:
        return _print_card(store, args)
    out: dict[str, Any] = {"sae": source.locator, "data": choice.data, "meta": store.meta.to_dict(),
                           "summary": store.summary()}
    if args.rank:
        ranking = rank(handle, choice, progress=_progress())
        out["ranking"] = _ranking_summary(ranking, keep)
        written = write_exports(ranking, keep, args.export, args.export_kept, choice.data, handle.kind)
        out["exported"] = [str(p) for p in written]
    return _print(out, args, store.meta.to_dict())


def _steer(handle, args, features: dict[int, float], values: dict, source: Source | None) -> int:
    from analysis.sae_v.steering import steer
    from analysis.sae_v.userdata import save_image

    params = BuildParams(layer=args.layer if args.layer is not None else 0)
    source = _sae_source(handle, args, params, source)
    image = ""
    if args.image:
        path = Path(args.image)
        if not path.is_file():
            raise SettingsError(f"No such image file: '{args.image}'.")
        image = save_image(path.read_bytes(), name=f"'{path.name}'")
    extra = {"layer": args.layer} if args.layer is not None and source.outside else {}
    choice = choose(handle, source, "", SteerParams, features=features, image=image, **values, **extra)
    result = steer(handle, choice)
    if args.json:
        print(json.dumps({"unsteered": result.unsteered.text, "steered": result.steered.text,
                          "features": {str(k): v for k, v in result.features.items()}, "mode": result.mode,
                          "layer": result.layer, "prompt": result.prompt,
                          "changed_tokens": sum(result.steered.changed)}, indent=1))
    else:
        print(f"unsteered: {result.unsteered.text}")
        print(f"steered:   {result.steered.text}")
    return 0


def _ranking_summary(ranking: Ranking, keep: float) -> dict:
    out = {"roc_auc": ranking.roc_auc, "roc_auc_weighted": ranking.roc_auc_weighted,
           "precision": ranking.precision, "recall": ranking.recall, "rule": ranking.rule,
           "threshold": ranking.threshold, "labelled": ranking.labelled, "pairs": len(ranking.rows),
           "scored_pairs": sum(r.score != 0 for r in ranking.rows), "keep": keep_top(ranking.rows, keep),
           "by_kind": by_kind(ranking.rows)}
    if ranking.source:
        out.update(rows_read=ranking.rows_read, used=len(ranking.rows), resumed=ranking.resumed,
                   skipped=[{**s.to_dict(), "row": s.row + 1} for s in ranking.skipped])  # from 1, as the reasons
    if not ranking.labelled:  # nothing is known to be corrupted: no separation to measure
        out["keep"] = {k: v for k, v in out["keep"].items() if k in ("keep", "kept", "removed")}
    return out


def _print(out: dict, args, meta: dict) -> int:
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"SAE in {out.get('folder') or out.get('sae')}")
    for key, value in {**meta, **out["summary"], **out.get("ranking", {})}.items():
        if key in ("train", "skipped"):
            continue
        print(f"  {key:22s} {value}")
    for s in out.get("ranking", {}).get("skipped", []):
        print(f"  skipped row {s['row']}: {s['reason']}")
    for path in out.get("exported", []):
        print(f"  wrote {path}")
    return 0


def _print_card(store, args) -> int:
    if args.feature >= len(store.features):
        raise SettingsError(f"--feature must be between 0 and {len(store.features) - 1}, got {args.feature}.")
    card = store.features[args.feature]
    print(card.to_json(indent=1) if args.json else _card_text(card))
    return 0


def _card_text(card: FeatureCard) -> str:
    lines = [f"feature {card.index}: {card.label}, omega={card.omega:.3f}, density={card.density:.4f}"]
    if card.concept_both:
        lines.append(f"  concept (both): {card.concept_both.name} p={card.concept_both.precision:.2f}")
    lines.append("  logit lens: " + ", ".join(s.key for s in card.logit_tokens))
    return "\n".join(lines)


def _progress():
    """Progress with the time left on stderr (a terminal only; analysis itself never prints)."""
    if not sys.stderr.isatty():
        return None
    start = time.perf_counter()

    def report(fraction: float, message: str = "") -> None:
        elapsed = time.perf_counter() - start
        left = elapsed * (1 - fraction) / fraction if fraction > 0.02 else None
        tail = f", about {left:.0f} s left" if left is not None else ""
        print(f"\r  {message[:50]:50s} {fraction:4.0%} · {elapsed:.0f} s{tail}   ", end="", file=sys.stderr, flush=True)
    return report

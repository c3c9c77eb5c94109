"""`python -m analysis captions ...`: verify and correct one caption claim by claim. The flags are made from the
settings of CorrectionParams and of every agent (analysis/framework/settings.py), so ranges and help are the page's."""
from __future__ import annotations

import argparse

from analysis.captions.agents import DECOMPOSERS, REWRITERS
from analysis.captions.generation import caption_image, speaks_shapes_world
from analysis.captions.params import CorrectionParams, agent_settings
from analysis.captions.pipeline import correct_caption
from analysis.captions.records import CorrectionResult
from analysis.captions.score import LOW_MASS, PROBABILITY_FORMS
from analysis.captions.verifiers import VERIFIERS
from analysis.captions.world import CaptionError, scene_image
from analysis.model_access.models import ModelHandle, ModelSpec, load_model
from analysis.framework.registry import check_range
from analysis.framework.settings import ArgumentParser, add_arguments, labelled, read_arguments

PARAM_FIELDS = [(f, CorrectionParams) for f in labelled(CorrectionParams)]
AGENT_FIELDS = {"decomposer": DECOMPOSERS.settings(), "verifier": VERIFIERS.settings(),
                "rewriter": REWRITERS.settings(), "probabilities": PROBABILITY_FORMS.settings()}


def parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m analysis captions",
                        description="Verify and correct an image caption claim by claim.")
    ap.add_argument("--model", default="zoo:shapes-vlm", help="the VLM (verifier): zoo:NAME, hub:ID or local:PATH")
    ap.add_argument("--lm", default=None, help="LM for the decomposer/rewriter (default: zoo:shapes-lm for a demo "
                                               "VLM, else the VLM's own language model)")
    ap.add_argument("--seed", type=int, default=None, help="Shapes World scene seed (default 0 without --image)")
    ap.add_argument("--image", default=None, help="an image file instead of a scene")
    add_arguments(ap, PARAM_FIELDS)
    seen: set[str] = set()
    for fields in AGENT_FIELDS.values():
        add_arguments(ap, fields, seen)
    ap.add_argument("--no-ground", action="store_true", help="skip the Captum heatmaps")
    ap.add_argument("--json", action="store_true", help="print the result as JSON (metrics without ground truth: null)")
    return ap


def params_from(args: argparse.Namespace) -> CorrectionParams:
    seed = None if args.image else (0 if args.seed is None else args.seed)
    if args.seed is not None:
        check_range("The scene seed", args.seed, low=0, integer=True)
    values = read_arguments(args, PARAM_FIELDS)
    nested = {role: agent_settings(role, **read_arguments(args, fields)) for role, fields in AGENT_FIELDS.items()}
    return CorrectionParams(**values, ground=not args.no_ground, scene_seed=seed,
                            decomposers=nested["decomposer"], verifiers=nested["verifier"],
                            rewriters=nested["rewriter"], forms=nested["probabilities"])


def load_agent_lm(text: str | None, vlm: ModelHandle) -> ModelHandle | None:
    """The decomposer/rewriter LM: the given spec, else zoo shapes-lm for a demo VLM (whose captions are
    Shapes World's), else the VLM's own language model."""
    if text:
        return load_model(ModelSpec.parse(text))
    from analysis.model_access.models import zoo_models

    if speaks_shapes_world(vlm) and "shapes-lm" in zoo_models():
        return load_model(ModelSpec("zoo", "shapes-lm"))
    return vlm


def cli(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    params = params_from(args)
    params.validate()  # before any model loads: SettingsError -> one "error: ..." line (analysis/__main__.py)
    image = read_image(args.image) if args.image else scene_image(params.scene_seed)
    vlm = load_model(ModelSpec.parse(args.model))
    lm = load_agent_lm(args.lm, vlm)
    if "caption" not in read_arguments(args, PARAM_FIELDS):
        params.caption = caption_image(vlm, image)
    result = correct_caption(vlm, image, params, lm)
    print(result.to_json() if args.json else report(result))
    return 0


def read_image(path: str):
    from analysis.framework.images import open_image

    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise CaptionError(f"Cannot read the image {path}: {exc.strerror or exc}.") from None
    return open_image(data, name=path)


def metric_line(result: CorrectionResult) -> str:
    """Factuality, coverage and CHAIR before -> after, or why they are not measurable."""
    b, a = result.before, result.after
    if b is None:
        return f"factuality, coverage, CHAIR_i: not measurable. {result.ground_truth}"
    if a is None:
        return (f"factuality {b.factuality:.3f} -> not measurable, coverage {b.coverage:.3f} -> not measurable, "
                f"CHAIR_i {b.chair_i:.3f} -> not measurable. {result.ground_truth}")
    return (f"factuality {b.factuality:.3f} -> {a.factuality:.3f}, coverage {b.coverage:.3f} -> {a.coverage:.3f}, "
            f"CHAIR_i {b.chair_i:.3f} -> {a.chair_i:.3f}")


def report(result: CorrectionResult) -> str:
    lines = [f"caption:   {result.caption}"]
    for c in result.claims:
        truth = "" if c.truth is None else f"  truth={'T' if c.truth else 'F'}"
        low = "  LOW yes+no MASS" if c.low_mass else ""
        asked = "" if c.asked else "  NOT ASKED (the verifier's question format cannot express it)"
        lines.append(f"  {'DROP' if c.flagged else 'keep'}  H={c.score:6.3f}  pT={c.p_true:.3f} pF={c.p_false:.3f}  "
                     f"{c.claim}{truth}{low}{asked}")
    low = [c for c in result.claims if c.low_mass]
    if low:
        lines.append(f"note: for {len(low)} of {len(result.claims)} claims p_T + p_F < {LOW_MASS:g} "
                     f"(lowest {min(c.mass for c in low):.3f}): the verifier is mostly not answering yes or no, "
                     "so its p_True and p_False say little about the claim.")
    lines += [f"note: {n}" for n in (result.decompose_note, result.rewrite_note) if n]
    lines.append(f"corrected: {result.corrected or '(none: no claim was kept)'}")
    lines.append(metric_line(result))
    return "\n".join(lines)

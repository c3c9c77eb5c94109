"""The pipeline: decompose the caption, verify (and ground) every claim alone, flag H(u) > pi, rewrite without
the flagged claims; and the run functions the page hands to the shared runner (components/runs.py), each
declared with its work estimate in the package's ANALYSIS (`cost.py`).

Verification does not depend on pi or the probability form, so moving either only re-scores it
(`apply_threshold` on a kept `Verification`): `correct_scene` / `correct_upload`, the page's one run,
keep the last verifications (`kept_verification`) and verify again only when what it reads changed.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from analysis.captions.agents import make_agent, resolve_agent
from analysis.captions.generation import caption_image
from analysis.captions.grounding import ground_claims
from analysis.captions.metrics import claim_truth, measure_caption, pi_sweep, word_diff
from analysis.captions.params import (CaptionParams, CorrectionParams, SceneCaptionParams, Upload,
                                      verification_params)
from analysis.captions.records import (CaptionMetrics, ClaimVerdict, CorrectionResult, GeneratedCaption,
                                       Verification)
from analysis.captions.score import hallucination_score, probability_form
from analysis.captions.verifiers import YesNoVerifier, make_verifier, resolve_verifier
from analysis.captions.world import CaptionError, scene_image, shapes_world
from analysis.model_access.models import ModelHandle
from analysis.framework.progress import Progress, silent

NO_SCENE = ("The image is not a Shapes World scene: there is no ground truth, so factuality, coverage and "
            "CHAIR cannot be measured.")
NOT_READ = ("The Shapes World grammar does not read this caption, so it has no ground truth (factuality, "
            "coverage and CHAIR would count only the part the grammar parses).")
AFTER_NOT_READ = ("The corrected caption is not in the Shapes World grammar, so its factuality, coverage and "
                  "CHAIR are not measurable (the original caption's are shown).")


def agent_of(params: CorrectionParams, role: str, lm: ModelHandle | None):
    """The params' decomposer or rewriter on `lm`, with its settings."""
    name = resolve_agent(role, getattr(params, role), lm)
    return make_agent(role, name, lm, params.agent(role, name))


def verifier_of(params: CorrectionParams, vlm: ModelHandle) -> YesNoVerifier:
    name = resolve_verifier(params.verifier, vlm)
    return make_verifier(name, vlm, params.agent("verifier", name))


def form_of(params: CorrectionParams):
    return probability_form(params.probabilities, **params.agent("probabilities", params.probabilities))


def verify_caption(vlm: ModelHandle, image, params: CorrectionParams, lm: ModelHandle | None = None,
                   progress: Progress | None = None, verifier: YesNoVerifier | None = None) -> Verification:
    """Decompose the caption and verify (and ground) every claim alone. Independent of pi.

    `verifier` overrides `params.verifier` (e.g. a ground-truth oracle in an evaluation).
    """
    report = progress or silent
    params.validate()
    caption = " ".join(params.caption.split())
    if not caption:
        raise CaptionError("The caption is empty: generate one with the VLM or paste one.")
    decomposer = agent_of(params, "decomposer", lm)
    rewriter = agent_of(params, "rewriter", lm)  # fail early on a bad name
    verifier = verifier or verifier_of(params, vlm)

    report(0.05, "decomposing the caption")
    claims = decomposer.decompose(caption)
    if not claims:
        raise CaptionError(f"The {decomposer.name} decomposer found no claims in this caption, so "
                           "there is nothing to verify. Describe objects in the image (for a demo "
                           "scene, e.g. 'there is a large red circle at the top left .')."
                           + (f" {decomposer.note}" if decomposer.note else ""))
    report(0.15, f"verifying {len(claims)} claims")
    verdicts = _verdicts(verifier, image, claims, params)
    grid = _ground(verifier, image, verdicts, params, lambda f, m: report(0.3 + 0.7 * f, m))
    if params.scene_seed is not None:
        scene = shapes_world().generate_scene(params.scene_seed)
        for v in verdicts:
            v.truth = claim_truth(scene, v.claim)
    report(1.0, "verified")
    return Verification(caption=caption, claims=verdicts, grid=grid, scene_seed=params.scene_seed,
                        agents={"decomposer": decomposer.name, "verifier": verifier.name,
                                "rewriter": rewriter.name}, decompose_note=decomposer.note)


def _verdicts(verifier, image, claims: list[str], params: CorrectionParams) -> list[ClaimVerdict]:
    """Each claim's (p_T, p_F) from the verifier and its score (flags are set by `flag_claims`)."""
    probs = verifier.verify(image, claims)
    can_ask = getattr(verifier, "can_ask", lambda claim: True)
    form = form_of(params)
    return [ClaimVerdict(c, pt, pf, hallucination_score(pt, pf, params.eps, form), False, asked=can_ask(c))
            for c, (pt, pf) in zip(claims, probs)]


def _ground(verifier, image, verdicts: list[ClaimVerdict], params: CorrectionParams, report: Progress) -> int:
    """Heatmaps of every askable claim when `params.ground`; the grid size (0 when not grounded)."""
    if not params.ground:
        return 0
    askable = [i for i, v in enumerate(verdicts) if verifier.can_ask(v.claim)]
    maps = ground_claims(verifier, image, [verdicts[i].claim for i in askable], params.ig_steps, report)
    for i, m in zip(askable, maps):
        verdicts[i].heatmap = m
    return verifier.grid


def flag_claims(verification: Verification, params: CorrectionParams) -> list[ClaimVerdict]:
    """The verified claims scored with the params' probability form, flagged when H(u) > pi."""
    form = form_of(params)
    verdicts = []
    for v in verification.claims:
        score = hallucination_score(v.p_true, v.p_false, params.eps, form)
        verdicts.append(ClaimVerdict(**{**vars(v), "score": score, "flagged": score > params.pi}))
    return verdicts


def apply_threshold(verification: Verification, params: CorrectionParams,
                    lm: ModelHandle | None = None) -> CorrectionResult:
    """Score each claim with the params' probability form, flag H(u) > pi and rewrite the caption
    without the flagged claims (no rewrite when nothing is flagged); metrics where there is ground truth.
    Verification (p_T, p_F) is reused as is."""
    params.validate()
    verdicts = flag_claims(verification, params)
    true_claims = [v.claim for v in verdicts if not v.flagged]
    false_claims = [v.claim for v in verdicts if v.flagged]
    caption = verification.caption
    rewriter = agent_of(params, "rewriter", lm)
    corrected = " ".join(rewriter.rewrite(caption, true_claims, false_claims).split()) if false_claims else caption
    result = CorrectionResult(
        params=params, caption=caption, corrected=corrected, claims=verdicts,
        diff=word_diff(caption, corrected), grid=verification.grid, agents=dict(verification.agents),
        rewrite_note=rewriter.note if false_claims else "", decompose_note=verification.decompose_note,
    )
    if verification.scene_seed is None:
        result.sweep, result.ground_truth = pi_sweep(verdicts), NO_SCENE
        return result
    scene = shapes_world().generate_scene(verification.scene_seed)
    result.before = measure_caption(scene, caption)
    result.after = measure_caption(scene, corrected) if result.before is not None else None
    result.sweep = pi_sweep(verdicts, scene)
    result.ground_truth = _ground_truth_note(result.before, result.after)
    return result


def _ground_truth_note(before: CaptionMetrics | None, after: CaptionMetrics | None) -> str:
    if before is None:
        return NOT_READ
    return AFTER_NOT_READ if after is None else ""


def correct_caption(vlm: ModelHandle, image, params: CorrectionParams, lm: ModelHandle | None = None,
                    progress: Progress | None = None) -> CorrectionResult:
    """The whole pipeline: decompose, verify every claim alone, flag H > pi, rewrite."""
    return apply_threshold(verify_caption(vlm, image, params, lm, progress), params, lm)


# --- the steps the page runs (components/runs.py): fn(handle, params, progress=..., **kwargs) ------------
# A scene step is fully determined by its settings and models (the app shares it between users and ships
# the default view's results); an upload step is keyed by the image's bytes (`Upload`), a rewrite by the
# verification it re-scores.


def _scene_of(params) -> object:
    if params.scene_seed is None:
        raise CaptionError("This step needs a Shapes World scene seed.")
    return scene_image(params.scene_seed)


def caption_scene(handle: ModelHandle, params: SceneCaptionParams,
                  progress: Progress | None = None) -> GeneratedCaption:
    """The VLM's greedy caption of scene `params.scene_seed`."""
    params.validate()
    text = caption_image(handle, _scene_of(params), max_new_tokens=params.max_new_tokens)
    return GeneratedCaption(text=text, scene_seed=params.scene_seed)


def caption_upload(handle: ModelHandle, params: CaptionParams, progress: Progress | None = None, *,
                   upload: Upload) -> GeneratedCaption:
    """The VLM's greedy caption of an uploaded image."""
    params.validate()
    return GeneratedCaption(text=caption_image(handle, upload.image, max_new_tokens=params.max_new_tokens))


def verify_scene(vlm: ModelHandle, params: CorrectionParams, progress: Progress | None = None,
                 lm: ModelHandle | None = None) -> Verification:
    """`verify_caption` on scene `params.scene_seed`."""
    return verify_caption(vlm, _scene_of(params), params, lm, progress)


def verify_upload(vlm: ModelHandle, params: CorrectionParams, progress: Progress | None = None,
                  lm: ModelHandle | None = None, *, upload: Upload) -> Verification:
    """`verify_caption` on an uploaded image."""
    return verify_caption(vlm, upload.image, params, lm, progress)


def rewrite_verified(lm: ModelHandle, params: CorrectionParams, progress: Progress | None = None, *,
                     verification: Verification) -> CorrectionResult:
    """`apply_threshold` as a step on the rewriter's model `lm`: flag, rewrite and measure a verification."""
    return apply_threshold(verification, params, lm)


KEPT_VERIFICATIONS = 16  # verifications kept per server (each a few claims, and heatmaps when grounded)
_KEPT: OrderedDict = OrderedDict()
_KEPT_LOCK = threading.Lock()


def _kept_key(vlm: ModelHandle, image_key: str, params: CorrectionParams, lm: ModelHandle | None) -> tuple:
    def who(handle):
        return None if handle is None else (handle.spec.label, str(getattr(handle, "path", "")))
    return who(vlm), who(lm), image_key, verification_params(params).to_json()


def kept_verification(vlm: ModelHandle, image_key: str, params: CorrectionParams,
                      lm: ModelHandle | None = None) -> Verification | None:
    """The verification of this caption on this image under these settings, if one is kept."""
    key = _kept_key(vlm, image_key, params, lm)
    with _KEPT_LOCK:
        if key in _KEPT:
            _KEPT.move_to_end(key)
            return _KEPT[key]
    return None


def _verified(vlm: ModelHandle, image_key: str, image_of, params: CorrectionParams, lm: ModelHandle | None,
              progress: Progress | None) -> Verification:
    kept = kept_verification(vlm, image_key, params, lm)
    if kept is not None:
        return kept
    verification = verify_caption(vlm, image_of(), verification_params(params), lm, progress)
    with _KEPT_LOCK:
        _KEPT[_kept_key(vlm, image_key, params, lm)] = verification
        while len(_KEPT) > KEPT_VERIFICATIONS:
            _KEPT.popitem(last=False)
    return verification


def scene_key(params: CorrectionParams) -> str:
    return f"scene:{params.scene_seed}"


def upload_key(upload: Upload) -> str:
    return f"upload:{upload.sha256}"


def correct_scene(vlm: ModelHandle, params: CorrectionParams, progress: Progress | None = None,
                  lm: ModelHandle | None = None) -> CorrectionResult:
    """The page's one run on scene `params.scene_seed`: verify (with `verification_params(params)`: pi and
    the probability form do not change p_T, p_F; a kept verification is reused), then flag, rewrite, measure."""
    verification = _verified(vlm, scene_key(params), lambda: _scene_of(params), params, lm, progress)
    return apply_threshold(verification, params, lm)


def correct_upload(vlm: ModelHandle, params: CorrectionParams, progress: Progress | None = None,
                   lm: ModelHandle | None = None, *, upload: Upload) -> CorrectionResult:
    """`correct_scene` on an uploaded image (no ground truth)."""
    verification = _verified(vlm, upload_key(upload), lambda: upload.image, params, lm, progress)
    return apply_threshold(verification, params, lm)

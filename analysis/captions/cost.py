"""How much work each caption step is, counted from its settings before it runs (analysis/framework/cost.py prices it).

Work on the decomposer/rewriter's own model is priced with that model's calibration and carried as seconds.
"""
from __future__ import annotations

from analysis.model_access import anatomy
from analysis.captions.agents import GrammarDecomposer
from analysis.captions.generation import CAPTION_TOKENS, caption_prompt, vlm_inputs
from analysis.captions.params import CorrectionParams
from analysis.captions.params import verification_params
from analysis.captions.pipeline import agent_of, flag_claims, kept_verification, scene_key, upload_key, verifier_of
from analysis.captions.world import has_shapes_world, scene_image
from analysis.framework.cost import INPUT_GRADIENT, Work, calibrate, sequence
from analysis.model_access.models import ModelHandle

CLAIM_WORDS = 2  # a caption the Shapes World grammar cannot parse: one claim per two words (assumed)


def prompt_lengths(handle: ModelHandle, image, prompts: list[str]) -> tuple[list[int], int]:
    """Tokens of each one-image prompt as the VLM's processor makes it (image tokens expanded), and the
    patches its vision tower reads for the image. The processor runs once, on the first prompt; the
    others differ from it only in their text."""
    if not prompts:
        return [], 0
    inputs = vlm_inputs(handle, [image], prompts[:1])
    first = int(inputs["input_ids"].shape[1])
    text = [len(handle.tokenizer(p)["input_ids"]) for p in prompts]
    return [first + n - text[0] for n in text], anatomy.vision_patches(handle, inputs)


def generation(handle: ModelHandle, prompt: str, new_tokens: int) -> Work:
    """`generate_text`: a prefill of the prompt, then one call per further token. `new_tokens` is the
    agent's bound (or the demo LM's trained answer length): greedy generation may stop sooner."""
    n = len(handle.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    room = (handle.info.max_positions or 1 << 30) - n
    return sequence(n, n, generate=max(1, min(new_tokens, room)))


def agent_seconds(lm: ModelHandle, calls: list[tuple[str, int]]) -> float:
    """Seconds of an agent's generations on its own model (its calibration)."""
    if not calls:
        return 0.0
    throughput = calibrate(lm)
    return sum(generation(lm, prompt, tokens).seconds(throughput) for prompt, tokens in calls)


def caption_work(handle: ModelHandle, image, prompt: str | None, new_tokens: int) -> Work:
    """`caption_image`: the image through the vision tower, a prefill of the prompt with its image tokens,
    then one call per further token. `new_tokens` is an upper bound: a captioner that ends its caption
    sooner (the demo VLMs: about a third of it) takes less."""
    [n], patches = prompt_lengths(handle, image, [prompt if prompt is not None else caption_prompt(handle)])
    return sequence(n, n, generate=new_tokens).add(patches=patches)


def expected_claims(caption: str) -> list[str]:
    """The claims a decomposer is expected to find: the Shapes World grammar's when it parses the caption
    (the demo LM decomposes exactly so), else one claim per CLAIM_WORDS words of the caption, each a
    five-word stretch of it (an assumption: an instruct model's decomposition is not known before it runs)."""
    if has_shapes_world():
        claims = GrammarDecomposer().decompose(caption)
        if claims:
            return claims
    words = caption.split()
    return [" ".join(words[i:i + 5]) for i in range(0, len(words), CLAIM_WORDS)]


def verification_work(handle: ModelHandle, params: CorrectionParams, image, lm: ModelHandle | None) -> Work:
    """`verify_caption`: the decomposer's generations on its own model (priced with that model's
    calibration), one forward per batch of askable claims (each row the image and one question,
    left-padded to the batch's longest; every position's logits are computed), and with `ground` an
    Integrated-Gradients forward and input-gradient backward of `ig_steps` rows per askable claim."""
    params.validate()
    caption = " ".join(params.caption.split())
    decomposer = agent_of(params, "decomposer", lm)
    verifier = verifier_of(params, handle)
    work = Work(seconds_elsewhere=agent_seconds(decomposer.lm, decomposer.calls(caption)))
    questions = [verifier.question(c) for c in expected_claims(caption) if verifier.can_ask(c)]
    lengths, patches = prompt_lengths(handle, image, questions)
    for start in range(0, len(lengths), verifier.batch_size):
        batch = lengths[start:start + verifier.batch_size]
        rows, width = len(batch), max(batch)
        work.add(calls=1, tokens=rows * width, attended=rows * width * (width + 1) / 2, logits=rows * (width - 1),
                 patches=rows * patches)
    if params.ground:
        steps = params.ig_steps
        for n in lengths:
            work.add(calls=1, tokens=steps * n, attended=steps * n * (n + 1) / 2, logits=steps * (n - 1),
                     patches=steps * patches, times=INPUT_GRADIENT)
    return work


def rewrite_work(lm: ModelHandle, params: CorrectionParams, kwargs: dict) -> Work:
    """`handle` is the rewriter's model, the verification comes as `verification=`: nothing to run when no
    claim is flagged, none is kept, or the rewriter runs no model; else its prompt and answer."""
    _, calls = rewrite_calls(params, kwargs["verification"], lm)
    work = Work()
    for prompt, tokens in calls:
        work.add(**vars(generation(lm, prompt, tokens)))
    return work


# --- one estimator per declared run (ANALYSIS.runs): estimate(handle, params, kwargs) -> Work ----------


def scene_caption_work(handle, params, kwargs) -> Work:
    params.validate()
    return caption_work(handle, scene_image(params.scene_seed), None, params.max_new_tokens)


def upload_caption_work(handle, params, kwargs) -> Work:
    params.validate()
    return caption_work(handle, kwargs["upload"].image, None, params.max_new_tokens)


def image_caption_work(handle, params, kwargs) -> Work:
    """`caption_image(handle, image, prompt, max_new_tokens)`: `params` is unused, the rest comes as kwargs."""
    return caption_work(handle, kwargs["image"], kwargs.get("prompt"), kwargs.get("max_new_tokens", CAPTION_TOKENS))


def rewrite_calls(params: CorrectionParams, verification, lm) -> tuple:
    """(the rewriter, its generations (prompt, tokens)) for a verification: none when no claim is flagged."""
    verdicts = flag_claims(verification, params)
    true_claims = [v.claim for v in verdicts if not v.flagged]
    false_claims = [v.claim for v in verdicts if v.flagged]
    if not false_claims:
        return None, []
    rewriter = agent_of(params, "rewriter", lm)
    return rewriter, rewriter.calls(verification.caption, true_claims, false_claims)


def correction_rewrite_work(params: CorrectionParams, verification, lm) -> Work:
    """The rewrite of a known verification, on the rewriter's own model."""
    rewriter, calls = rewrite_calls(params, verification, lm)
    return Work(seconds_elsewhere=agent_seconds(rewriter.lm, calls)) if calls else Work()


def _correction_work(handle, params, lm, image_key: str, image_of) -> Work:
    """`correct_scene` / `correct_upload`: the verification, or, when it is kept (π or the probability form
    moved), only the rewrite of its flagged claims."""
    params.validate()
    kept = kept_verification(handle, image_key, params, lm)
    if kept is not None:
        return correction_rewrite_work(params, kept, lm)
    return verification_work(handle, verification_params(params), image_of(), lm)


def scene_correction_work(handle, params, kwargs) -> Work:
    return _correction_work(handle, params, kwargs.get("lm"), scene_key(params), lambda: scene_image(params.scene_seed))


def upload_correction_work(handle, params, kwargs) -> Work:
    upload = kwargs["upload"]
    return _correction_work(handle, params, kwargs.get("lm"), upload_key(upload), lambda: upload.image)


def scene_verification_work(handle, params, kwargs) -> Work:
    return verification_work(handle, params, scene_image(params.scene_seed), kwargs.get("lm"))


def upload_verification_work(handle, params, kwargs) -> Work:
    return verification_work(handle, params, kwargs["upload"].image, kwargs.get("lm"))


def image_verification_work(handle, params, kwargs) -> Work:
    return verification_work(handle, params, kwargs["image"], kwargs.get("lm"))

"""Caption hallucination correction: decompose, verify each claim alone, rewrite (CapMAS, ICML 2025).

Three agents, each a small object behind one method and looked up by a stable name:

- a decomposer turns a caption into atomic claims;
- a verifier asks the vision-language model a yes/no question about one claim at a time and reads
  p_True and p_False off its next-token distribution;
- a rewriter turns (caption, true claims, false claims) into a caption without the false content.

A claim u is flagged when H(u) = -log max(p_T - p_F, eps) exceeds the threshold pi (CapMAS's
hallucination score). By default p_T and p_F are the raw next-token probabilities, as the paper
writes H; the labelled option "renormalised" reads p_T / (p_T + p_F) instead. The yes+no mass
p_T + p_F is kept per claim: when it is small the verifier is not answering the question.
Grounding attributes each verification answer to image patches with Captum's Integrated Gradients.
On Shapes World the ground truth is known, so factuality, coverage, CHAIR and POPE-style verifier
scores are exact; on a caption the grammar does not read they are not measurable (None), never 1.0.

Read in this order:
- `world.py`: the panel's error and Shapes World (optional; the only ground truth);
- `score.py`: H(u) and the probability forms (`PROBABILITY_FORMS`);
- `generation.py`: captioning, greedy text, chat prompts and the verifier's inputs on a shared model;
- `agents.py`: decomposers and rewriters (`DECOMPOSERS`, `REWRITERS`); `verifiers.py`: `VERIFIERS`;
- `params.py`: `CorrectionParams` (the pipeline's settings and `{agent name: its settings}` per role);
- `records.py`: the typed results; `grounding.py`: Integrated Gradients per claim;
- `pipeline.py`: `verify_caption`, `apply_threshold` and the steps the page runs;
- `metrics.py`: factuality, coverage, CHAIR, POPE, the pi sweep; `cost.py`: work counts; `cli.py`.
"""
from __future__ import annotations

from analysis.captions import agents, generation, pipeline
from analysis.captions.agents import (
    DECOMPOSE_EXAMPLES, DECOMPOSE_SYSTEM, DECOMPOSERS, REWRITE_EXAMPLES, REWRITE_SYSTEM, REWRITERS, Agent,
    ChatDecomposer, ChatRewriter, Decomposer, GrammarDecomposer, GrammarRewriter, Rewriter, ShapesLMDecomposer,
    ShapesLMRewriter, about_caption, claims_about, default_agent, is_sentence, make_agent, parse_claim_lines,
    resolve_agent, sentences,
)
from analysis.captions.cli import cli, load_agent_lm
from analysis.captions.cost import (
    image_caption_work, image_verification_work, rewrite_work, scene_caption_work, scene_correction_work,
    scene_verification_work, upload_caption_work, upload_correction_work, upload_verification_work,
)
from analysis.captions.generation import (
    CAPTION_TOKENS, GENERIC_CAPTION_PROMPT, answer_token_ids, caption_image, caption_prompt, chat_prompt,
    generate_text, speaks_shapes_world, vlm_inputs, vlm_prompt,
)
from analysis.captions.grounding import ground_claims
from analysis.captions.metrics import (
    chair, claim_truth, coverage, factuality, measure_caption, pi_sweep, pope, score_caption, score_claims,
    word_diff,
)
from analysis.captions.params import (
    OWN_LM, SHAPES_LM, CaptionParams, CaptionState, CorrectionParams, SceneCaptionParams, Upload, agent_settings,
    verification_params,
)
from analysis.captions.pipeline import (
    apply_threshold, caption_scene, caption_upload, correct_caption, correct_scene, correct_upload, flag_claims,
    kept_verification, rewrite_verified, verify_caption, verify_scene, verify_upload,
)
from analysis.captions.presets import PRESETS
from analysis.captions.records import (
    CaptionMetrics, ClaimVerdict, CorrectionResult, DiffSpan, GeneratedCaption, PopeMetrics, SweepPoint,
    Verification,
)
from analysis.captions.score import (
    DEFAULT_EPS, DEFAULT_PI, DEFAULT_PROBABILITIES, LOW_MASS, PROBABILITY_FORMS, ProbabilityForm,
    RawProbabilities, RenormalisedProbabilities, hallucination_score, probability_form,
)
from analysis.captions.verifiers import (
    GENERIC_QUESTION, VERIFIERS, ChatYesNoVerifier, ShapesVLMVerifier, YesNoVerifier, make_verifier,
    resolve_verifier,
)
from analysis.captions.world import (
    CaptionError, grammar_covers, has_shapes_world, scene_image, shapes_text, shapes_world,
)
from analysis.framework.panels import Analysis, Run

ANALYSIS = Analysis(
    name="captions", title="Caption correction", icon=":material/fact_check:", page="caption_correction.py",
    summary="Split a detailed caption into claims, verify each against the image, rewrite without "
            "the hallucinated ones.",
    paper="CapMAS (ICML 2025)", kinds=("vlm",),
    runs=(Run(caption_scene, scene_caption_work), Run(caption_upload, upload_caption_work),
          Run(caption_image, image_caption_work),
          Run(verify_scene, scene_verification_work), Run(verify_upload, upload_verification_work),
          Run(verify_caption, image_verification_work),
          Run(rewrite_verified, rewrite_work), Run(apply_threshold, rewrite_work),
          Run(correct_scene, scene_correction_work), Run(correct_upload, upload_correction_work)),
    cli=cli, params=CorrectionParams, view_state=CaptionState, presets=PRESETS)

__all__ = [
    "ANALYSIS", "agents", "generation", "pipeline",
    "DECOMPOSE_EXAMPLES", "DECOMPOSE_SYSTEM", "DECOMPOSERS", "REWRITE_EXAMPLES", "REWRITE_SYSTEM", "REWRITERS",
    "Agent", "ChatDecomposer", "ChatRewriter", "Decomposer", "GrammarDecomposer", "GrammarRewriter", "Rewriter",
    "ShapesLMDecomposer", "ShapesLMRewriter", "about_caption", "claims_about", "default_agent", "is_sentence",
    "make_agent", "parse_claim_lines", "resolve_agent", "sentences", "cli", "load_agent_lm",
    "image_caption_work", "image_verification_work", "rewrite_work", "scene_caption_work",
    "scene_verification_work", "upload_caption_work", "upload_verification_work",
    "CAPTION_TOKENS", "GENERIC_CAPTION_PROMPT", "answer_token_ids", "caption_image", "caption_prompt",
    "chat_prompt", "generate_text", "speaks_shapes_world", "vlm_inputs", "vlm_prompt", "ground_claims",
    "chair", "claim_truth", "coverage", "factuality", "measure_caption", "pi_sweep", "pope", "score_caption",
    "score_claims", "word_diff", "CaptionParams", "CorrectionParams", "SceneCaptionParams", "Upload",
    "agent_settings", "verification_params", "apply_threshold", "caption_scene", "caption_upload",
    "correct_caption", "correct_scene", "correct_upload", "kept_verification", "CaptionState", "OWN_LM",
    "SHAPES_LM", "scene_correction_work", "upload_correction_work", "flag_claims", "rewrite_verified", "verify_caption", "verify_scene",
    "verify_upload", "CaptionMetrics", "ClaimVerdict", "CorrectionResult", "DiffSpan", "GeneratedCaption",
    "PopeMetrics", "SweepPoint", "Verification", "DEFAULT_EPS", "DEFAULT_PI", "DEFAULT_PROBABILITIES", "LOW_MASS",
    "PROBABILITY_FORMS", "ProbabilityForm", "RawProbabilities", "RenormalisedProbabilities",
    "hallucination_score", "probability_form", "GENERIC_QUESTION", "VERIFIERS", "ChatYesNoVerifier",
    "ShapesVLMVerifier", "YesNoVerifier", "make_verifier", "resolve_verifier", "CaptionError", "grammar_covers",
    "has_shapes_world",
    "scene_image", "shapes_text", "shapes_world",
]

"""Attention sharpness: dispersion as inputs grow, temperature sweeps, adaptive temperature.

Reproduces "Softmax is not enough (for sharp size generalisation)" (Veličković et al., ICML 2025) on a
loaded model. Read in this order:
- `rules.py`: the temperature rules (softmax, fixed θ, the paper's adaptive θ), each a small class owning
  its settings, registered in `RULES`; `Temperature`, the choice of a rule that travels in params/results;
- `attention.py`: the attention function that applies a rule and records the answer row, sent as the
  attention rule of a backend request (`analysis/backends`: hooks or nnsight, here or on NDIF);
- `lemma.py`: the lemma without a model;
- `heads.py`: per layer/head statistics of the recorded row;
- `prompt.py`: one prompt of the user's own;
- `params.py` (SweepParams; SharpnessState, the page's own controls), `presets.py`, `scoring.py`, `sweep.py`, `records.py`: the size sweep on the model's retrieval prompts
  (analysis/tasks/retrieval.py: max retrieval for the demo LM, key-value recall for a real LM) and its
  results;
- `cost.py`: their work counts; `cli.py`: `python -m analysis sharpness`.
"""
from __future__ import annotations

from analysis.framework.panels import Analysis, Run
from analysis.sharpness.attention import (
    Recorder, attention_rule, temperature_patch, tempered_attention, tempered_logits,
)
from analysis.sharpness.cli import cli
from analysis.sharpness.cost import TEMPERATURE_OVERHEAD, prompt_work, sweep_work
from analysis.sharpness.errors import SharpnessError
from analysis.sharpness.heads import HeadStats, head_stats, mean_stats, row_stats
from analysis.sharpness.lemma import LemmaCurve, LemmaParams, LemmaResult, lemma_demo
from analysis.sharpness.params import (
    DEFAULT_NS, DEFAULT_THETAS, LARGE_MODEL_NS, LARGE_MODEL_SAMPLES, LARGE_MODEL_THETAS, N_CHOICES, THETA_CHOICES,
    SharpnessState, SweepParams, default_params, validate_params,
)
from analysis.sharpness.presets import PRESETS
from analysis.sharpness.prompt import PromptParams, PromptResult, analyse_prompt, find_span, prompt_ids
from analysis.sharpness.records import RunStats, SizePoint, SweepResult
from analysis.sharpness.rules import (
    ADAPTIVE_MIN_ENTROPY, ADAPTIVE_POLY, RULES, SOFTMAX, AdaptiveTheta, FixedTheta, Rule, Softmax, Temperature,
    adaptive_beta, beta_curve, entropy_nats, row_entropy, rule_beta, rule_settings, sharpening_interval,
    softmax_entropy, tempered_softmax,
)
from analysis.sharpness.scoring import Outcome, Packed, pack, score_chunk, tree_nodes
from analysis.sharpness.sweep import build_prompt, chunks, evaluate, prompt_builder, prompts_for, size_sweep
from analysis.tasks.retrieval import MAX_RETRIEVAL, RECALL, ItemFormat, RetrievalPrompt, item_format

ANALYSIS = Analysis(
    name="sharpness", title="Attention sharpness", icon=":material/blur_on:", page="attention_sharpness.py",
    summary="Entropy and max weight of every head as inputs grow; temperature sweeps and the "
            "adaptive-temperature rule.",
    paper="Softmax is not enough (ICML 2025)", kinds=("causal_lm", "vlm"),
    runs=(Run(size_sweep, sweep_work), Run(analyse_prompt, prompt_work)),
    cli=cli, params=SweepParams, view_state=SharpnessState, presets=PRESETS,
)

__all__ = [
    "ANALYSIS", "Recorder", "attention_rule", "tempered_attention", "temperature_patch",
    "tempered_logits", "cli", "TEMPERATURE_OVERHEAD", "prompt_work", "sweep_work", "SharpnessError", "HeadStats",
    "head_stats", "mean_stats", "row_stats", "LemmaCurve", "LemmaParams", "LemmaResult", "lemma_demo", "DEFAULT_NS",
    "DEFAULT_THETAS", "LARGE_MODEL_NS", "LARGE_MODEL_SAMPLES", "LARGE_MODEL_THETAS", "N_CHOICES", "THETA_CHOICES", "SharpnessState", "SweepParams",
    "default_params", "validate_params", "PromptParams", "PromptResult", "analyse_prompt", "find_span",
    "prompt_ids", "RunStats", "SizePoint", "SweepResult", "ADAPTIVE_MIN_ENTROPY", "ADAPTIVE_POLY", "RULES",
    "SOFTMAX", "AdaptiveTheta", "FixedTheta", "Rule", "Softmax", "Temperature", "adaptive_beta", "beta_curve",
    "entropy_nats", "row_entropy", "rule_beta", "rule_settings", "sharpening_interval", "softmax_entropy",
    "tempered_softmax", "Outcome", "Packed", "pack", "score_chunk", "tree_nodes", "build_prompt", "chunks",
    "evaluate", "prompt_builder", "prompts_for", "size_sweep", "MAX_RETRIEVAL", "RECALL", "ItemFormat",
    "RetrievalPrompt", "item_format",
]

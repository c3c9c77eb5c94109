"""Prompt reconstruction from hidden states ("Hidden No More", ICML 2025), the defences against it, and
Cascade's sequence sharding, simulated.

Threat model: the weights are public and an attacker sees the layer-L hidden states of a prompt. Read in
this order:
- `defences.py`: one small class per defence (shuffled positions / dimensions, Gaussian noise,
  quantisation), each owning its settings, registered in `DEFENCES`;
- `orders.py`: the proposal orders (model, embedding, gradient inversion, hybrid, vocabulary), registered
  in `ORDERS`, and `Vocabulary`, the embedding table they rank;
- `params.py`: `AttackParams` (the attack's settings and `{method name: its settings}`), `CascadeParams`,
  `method_settings`, `validate_params`;
- `probe.py`: running the first L layers (the victim's states, candidates' states, gradient inversion);
- `attack.py`: `reconstruct`, position by position; `sweeps.py`: by layer, by noise, vs exhaustive search;
- `shardings.py`, `cascade.py`: `simulate_cascade`;
- `records.py`: the typed results; `cost.py`: their work counts; `cli.py`: `python -m analysis invert`.
"""
from __future__ import annotations

from analysis.inversion.attack import calibrate, candidate_batches, reconstruct
from analysis.inversion.cascade import cascade_verdict, party_view, simulate_cascade
from analysis.inversion.cli import cli
from analysis.inversion.cost import attack_work, cascade_work, layers_work, noise_work, speed_work
from analysis.inversion.defences import (
    DEFENCES, NO_DEFENCE, NO_DEFENCE_LABEL, Defence, GaussianNoise, Quantise, ShuffleBoth, ShuffleDims,
    ShufflePositions, defence_label, defence_names,
)
from analysis.inversion.orders import (
    ORDERS, Context, EmbeddingOrder, GradientOrder, HybridOrder, ModelOrder, Order, VocabOrder, Vocabulary,
)
from analysis.inversion.presets import PRESETS
from analysis.inversion.params import (
    MAX_TOKENS, AttackParams, CascadeParams, InversionError, InversionState, build_defences, make_defence, make_order,
    method_fields, method_settings, users_of, validate_params,
)
from analysis.inversion.probe import Probe, check_layer, observed_states, token_text, tokenize, vocab_size
from analysis.inversion.records import (
    AttackResult, CascadeResult, LayerPoint, LayerSweep, NoisePoint, NoiseSweep, PartyView, SpeedComparison,
    TokenRecovery,
)
from analysis.inversion.shardings import SHARDINGS, Blocks, RoundRobin, Sharding
from analysis.inversion.sweeps import compare_exhaustive, sweep_layers, sweep_noise, with_changes, with_noise
from analysis.framework.panels import Analysis, Run

ANALYSIS = Analysis(
    name="invert", title="Prompt reconstruction", icon=":material/lock_open:", page="prompt_reconstruction.py",
    summary="Recover a prompt from hidden states, with and without defences, and see why sequence "
            "sharding (Cascade) resists it.",
    paper="Hidden No More / Cascade (ICML 2025)", kinds=("causal_lm", "vlm"),
    runs=(Run(reconstruct, attack_work), Run(sweep_layers, layers_work), Run(sweep_noise, noise_work),
          Run(compare_exhaustive, speed_work), Run(simulate_cascade, cascade_work)),
    cli=cli, params=AttackParams, view_state=InversionState, presets=PRESETS,
)

__all__ = [
    "ANALYSIS", "calibrate", "candidate_batches", "reconstruct", "cascade_verdict", "party_view",
    "simulate_cascade", "cli", "attack_work", "cascade_work", "layers_work", "noise_work", "speed_work",
    "DEFENCES", "NO_DEFENCE", "NO_DEFENCE_LABEL", "Defence", "GaussianNoise", "Quantise", "ShuffleBoth",
    "ShuffleDims", "ShufflePositions", "defence_label", "defence_names", "ORDERS", "Context", "EmbeddingOrder",
    "GradientOrder", "HybridOrder", "ModelOrder", "Order", "VocabOrder", "Vocabulary", "MAX_TOKENS",
    "AttackParams", "CascadeParams", "InversionError", "InversionState", "build_defences", "make_defence", "make_order",
    "method_fields", "method_settings", "users_of", "validate_params", "Probe", "check_layer", "observed_states",
    "token_text", "tokenize", "vocab_size", "AttackResult", "CascadeResult", "LayerPoint", "LayerSweep",
    "NoisePoint", "NoiseSweep", "PartyView", "SpeedComparison", "TokenRecovery", "SHARDINGS", "Blocks",
    "RoundRobin", "Sharding", "compare_exhaustive", "sweep_layers", "sweep_noise", "with_changes", "with_noise",
]

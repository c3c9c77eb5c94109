"""SAE-V: sparse-autoencoder features over the image and text tokens of a multimodal model.

Pipeline, one module per step:
1. `activations`: residual stream after one decoder layer, at every image-token and text-token
   position of a set of image-caption pairs (text positions only for a causal LM), with modality,
   pair and patch index recorded (`collect_activations`).
2. `training`: an ordinary sae-lens SAE (TopK by default; Standard / JumpReLU selectable) trained
   with `SAETrainer` on those activations; `save_sae` / `load_sae` use sae-lens's own disk format.
3. `store`: everything the browser shows, computed once per (model, layer, SAE, dataset): top
   examples, quantile samples, histograms, densities, neighbours, co-activation, logit-lens tokens,
   modality label, cross-modal weight omega_k and (Shapes World) concept labels.
4. `scores`: SAE-V data filtering. Under the official score rule (the default; `SCORE_RULES`), a
   feature has a cross-modal weight omega_k only when at least 5 of its 30 strongest tokens are text
   and 5 are image, and s_i sums omega_k over the features with one that are active (> 1) on both a
   text and an image token of pair i; ROC AUC against known corrupted pairs (`rank_pairs`).
5. `explain`: the active features of one user-supplied image and text.
`types` holds the settings and result records, `datasets` the image-caption pair generators,
`build` the end-to-end train-and-store step and `cli` the `python -m analysis sae` command.
"""
from __future__ import annotations

from analysis.anatomy import decoder_layers
from analysis.sae_v.activations import collect_activations, modality_scales, scaled
from analysis.sae_v.build import (
    available_saes, build, build_folder, demo_folder, is_stale, model_fingerprint, rebuild_store,
)
from analysis.sae_v.cli import cli
from analysis.sae_v.datasets import (
    DATASETS, Dataset, NoiseDataset, dataset_for, ShapesDataset, default_dataset, image_token, make_pairs, register_dataset,
)
from analysis.sae_v.explain import explain_input
from analysis.registry import SettingsError
from analysis.sae_v.scores import (
    SCORE_RULES, AllSharedRule, NormalisedRule, OfficialRule, ScoreRule, by_kind, cross_modal_weights, keep_top,
    modality_labels, pair_scores, per_pair_max, rank_dataset, rank_pairs, roc_auc, score_label, score_rule,
    store_weights,
)
from analysis.sae_v.store import (
    build_feature_store, concept_in_both, concept_precision, load_store, read_store_json, save_store,
)
from analysis.sae_v.training import encode, load_sae, reconstruction_metrics, save_sae, train_sae
from analysis.sae_v.types import (
    ARCHITECTURES, CACHE_ROOT, IMAGE, LABELS, META_FILE, MODALITY_NAMES, SAE_ROOT, STORE_FILE, TEXT,
    Activations, BuildParams, Concept, Example, FeatureCard, FeatureStore, ImageExample, InputExplanation, Pair,
    PairScore, PairSet, PositionFeatures, QuantileBin, Ranking, SaeMeta, Scored, StoreParams, TextExample,
    TrainParams,
)

__all__ = [
    "collect_activations", "decoder_layers", "modality_scales", "scaled",
    "available_saes", "build", "build_folder", "demo_folder", "is_stale", "model_fingerprint", "rebuild_store", "cli",
    "DATASETS", "Dataset", "dataset_for", "NoiseDataset", "ShapesDataset", "default_dataset", "image_token", "make_pairs",
    "register_dataset", "explain_input",
    "SettingsError", "SCORE_RULES", "AllSharedRule", "NormalisedRule", "OfficialRule", "ScoreRule", "by_kind",
    "cross_modal_weights",
    "keep_top",
    "modality_labels", "pair_scores", "per_pair_max", "rank_dataset", "rank_pairs", "roc_auc", "score_label",
    "score_rule",
    "store_weights",
    "build_feature_store", "concept_in_both", "concept_precision", "load_store", "read_store_json", "save_store",
    "encode", "load_sae", "reconstruction_metrics", "save_sae", "train_sae",
    "ARCHITECTURES", "CACHE_ROOT", "IMAGE", "LABELS", "META_FILE", "MODALITY_NAMES", "SAE_ROOT", "STORE_FILE", "TEXT",
    "Activations", "BuildParams", "Concept", "Example", "FeatureCard", "FeatureStore", "ImageExample",
    "InputExplanation", "Pair", "PairScore", "PairSet", "PositionFeatures", "QuantileBin", "Ranking", "SaeMeta",
    "Scored", "StoreParams", "TextExample", "TrainParams",
]


def _declare():
    from analysis.panels import Analysis

    return Analysis(
        name="sae", title="SAE-V features", icon=":material/scatter_plot:", page="sae_features.py",
        summary="Sparse-autoencoder features of a multimodal model: which modality they fire on, "
                "cross-modal scores, and data filtering by those scores.",
        paper="SAE-V (ICML 2025)", kinds=("vlm",), cli=cli)


ANALYSIS = _declare()

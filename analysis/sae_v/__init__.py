"""SAE-V: sparse-autoencoder features over the image and text tokens of a multimodal model (or the text
tokens of a language model), data filtering by cross-modal score, and steering.

Read in this order:
- `modality.py`, `params.py` (training, store and run settings; SAE types and score rules own theirs),
  `types.py` (the records);
- `architectures.py`: the sae-lens SAE types we train (TopK, Standard, JumpReLU), each with its setting;
- `datasets.py`: generated image-caption pairs (Shapes World, English scene captions, random noise);
  `userdata.py`: your own folder / file / zip, bad rows reported one by one;
- `prompts.py`: how every pair (generated, yours, an explained input) is put in front of the model: one
  path, the model's own captioning prompt; `activations.py`: the residual stream after one decoder layer
  at every image and text token;
- `codec.py`: the one way any SAE is run (encode, reconstruct, steer, its input normalisation applied as
  sae-lens applies it; what SAE-V cannot run refused at load); `training.py`: training, saving and
  loading our SAEs; `outside.py`: SAEs saved by sae-lens or its pretrained releases, checked against the
  model;
- `rules.py` (which features get an omega_k, what s_i sums) and `scores.py` (labels, ROC, keep, ranking);
- `store.py`: everything the browser shows per feature; `build.py`: train + store end to end;
- `sources.py`: which SAE on which data, and the feature store of any such pair;
- `filtering.py`: rank any data by s_i (streamed, resumable) and export; `explain.py`: one input's
  features; `steering.py`: add or clamp features while the model generates;
- `cost.py`: each run's work estimate; `cli.py`: `python -m analysis sae`.
"""
from __future__ import annotations

from analysis.model_access.anatomy import decoder_layers
from analysis.framework.errors import SettingsError
from analysis.framework.panels import Analysis, Run
from analysis.sae_v.activations import collect_activations, iter_activations, modality_scales, scaled
from analysis.sae_v.architectures import ARCHITECTURES, JumpReLU, SaeType, Standard, TopK, architecture_settings
from analysis.sae_v.build import (
    Trained, available_saes, build, build_folder, demo_folder, is_stale, model_fingerprint, rebuild_store, train,
)
from analysis.sae_v.cli import cli
from analysis.sae_v.codec import Codec, as_codec
from analysis.sae_v.cost import explain_work, rank_work, steer_work, store_work, train_work
from analysis.sae_v.datasets import (
    DATASETS, Dataset, NoiseDataset, ScenesDataset, ShapesDataset, dataset_for, default_dataset, english_caption,
    image_token, make_pairs, register_dataset, render_pair,
)
from analysis.sae_v.explain import explain, explain_input
from analysis.sae_v.filtering import kept_subset, rank, rank_refusal, ranked_rows, ranked_text, write_exports
from analysis.sae_v.modality import IMAGE, LABELS, MODALITY_NAMES, TEXT
from analysis.sae_v.outside import SaeFitError, check_fit, hook_layer, load_outside
from analysis.sae_v.params import (
    BuildParams, ExplainParams, Keep, RankParams, SaeChoice, SaeState, SteerParams, StoreParams, TrainParams,
    parse_steer,
)
from analysis.sae_v.presets import PRESETS
from analysis.sae_v.rules import (
    SCORE_RULES, AllSharedRule, NormalisedRule, OfficialRule, ScoreRule, pair_scores, per_pair_max, rule_settings,
    same_omega, score_label, score_rule,
)
from analysis.sae_v.scores import (
    by_kind, cross_modal_weights, finish_ranking, keep_top, modality_labels, rank_dataset, rank_pairs, roc_auc,
    store_weights,
)
from analysis.sae_v.sources import Source, choose, data_pairs, locate, open_sae, sae_fingerprint, store_for
from analysis.sae_v.prompts import caption_prompt, pair_prompt
from analysis.sae_v.steering import steer
from analysis.sae_v.store import (
    build_feature_store, concept_in_both, concept_precision, load_store, read_store_json, save_store,
)
from analysis.sae_v.training import encode, load_sae, reconstruction_metrics, save_sae, train_sae
from analysis.sae_v.types import (
    CACHE_ROOT, META_FILE, SAE_ROOT, STORE_FILE, Activations, Concept, Example, FeatureCard, FeatureStore,
    ImageExample, InputExplanation, Pair, PairScore, PairSet, PositionFeatures, QuantileBin, Ranking, SaeMeta,
    Scored, Skipped, SteeredText, SteeringResult, TextExample,
)
from analysis.sae_v.userdata import DataError, UserData, pair_image, save_image, save_zip


def train_params(**flat) -> TrainParams:
    """TrainParams from flat settings (`d_sae=16, k=3, steps=30`): each SAE type's own go to that type."""
    return TrainParams(**flat)


ANALYSIS = Analysis(
    name="sae", title="SAE-V features", icon=":material/scatter_plot:", page="sae_features.py",
    summary="Sparse-autoencoder features of a multimodal model (or a language model): which modality they fire "
            "on, cross-modal scores, filtering your own image-caption data by those scores, and steering.",
    paper="SAE-V (ICML 2025)", kinds=("vlm", "causal_lm"),
    runs=(Run(rank, rank_work), Run(explain, explain_work), Run(steer, steer_work), Run(store_for, store_work),
          Run(train, train_work, trains=True)),
    cli=cli, params=SaeChoice, view_state=SaeState, presets=PRESETS,
)

__all__ = [
    "ANALYSIS", "SaeState", "decoder_layers", "SettingsError", "Codec", "as_codec", "collect_activations", "iter_activations", "modality_scales",
    "scaled", "ARCHITECTURES", "JumpReLU", "SaeType", "Standard", "TopK", "architecture_settings", "Trained",
    "available_saes", "build", "build_folder", "demo_folder", "is_stale", "model_fingerprint", "rebuild_store",
    "train", "cli", "explain_work", "rank_work", "steer_work", "store_work", "train_work", "DATASETS", "Dataset",
    "NoiseDataset", "ScenesDataset", "ShapesDataset", "dataset_for", "default_dataset", "english_caption",
    "image_token", "make_pairs", "register_dataset", "render_pair", "explain", "explain_input", "kept_subset", "rank",
    "rank_refusal", "ranked_rows", "ranked_text", "write_exports", "IMAGE", "LABELS", "MODALITY_NAMES", "TEXT", "SaeFitError",
    "check_fit", "hook_layer", "load_outside", "BuildParams", "ExplainParams", "Keep", "RankParams", "SaeChoice",
    "SteerParams", "StoreParams", "TrainParams", "parse_steer", "SCORE_RULES", "AllSharedRule", "NormalisedRule",
    "OfficialRule", "ScoreRule", "pair_scores", "per_pair_max", "rule_settings", "same_omega", "score_label",
    "score_rule",
    "by_kind", "cross_modal_weights", "finish_ranking", "keep_top", "modality_labels", "rank_dataset", "rank_pairs",
    "roc_auc", "store_weights", "Source", "choose", "data_pairs", "locate", "open_sae", "sae_fingerprint",
    "store_for", "caption_prompt", "pair_prompt", "steer", "build_feature_store", "concept_in_both", "concept_precision",
    "load_store", "read_store_json", "save_store", "encode", "load_sae", "reconstruction_metrics", "save_sae",
    "train_sae", "CACHE_ROOT", "META_FILE", "SAE_ROOT", "STORE_FILE", "Activations", "Concept", "Example",
    "FeatureCard", "FeatureStore", "ImageExample", "InputExplanation", "Pair", "PairScore", "PairSet",
    "PositionFeatures", "QuantileBin", "Ranking", "SaeMeta", "Scored", "Skipped", "SteeredText", "SteeringResult",
    "TextExample", "DataError", "UserData", "pair_image", "save_image", "save_zip", "train_params",
]

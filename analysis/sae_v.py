"""SAE-V: sparse-autoencoder features over the image and text tokens of a multimodal model.

Pipeline, top to bottom:
1. `collect_activations`: residual stream after one decoder layer, at every image-token and text-token
   position of a set of image-caption pairs (text positions only for a causal LM), with modality,
   pair and patch index recorded.
2. `train_sae`: an ordinary sae-lens SAE (TopK by default; Standard / JumpReLU selectable) trained
   with `SAETrainer` on those activations; `save_sae` / `load_sae` use sae-lens's own disk format.
3. `build_feature_store`: everything the browser shows, computed once per (model, layer, SAE,
   dataset): top examples, quantile samples, histograms, densities, neighbours, co-activation,
   logit-lens tokens, modality label, cross-modal weight omega_k and (Shapes World) concept labels.
4. `pair_scores` / `rank_pairs`: SAE-V data filtering, s_i = sum of omega_k over features active on
   both a text and an image token of pair i, with ROC AUC against known corrupted pairs.
5. `explain_input`: the active features of one user-supplied image and text.

`sae_lens` is imported lazily (it takes seconds to import), only where an SAE is built or loaded.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from analysis.models import ModelHandle
from analysis.results import Result

Progress = Callable[[float, str], None]

TEXT, IMAGE = 0, 1
MODALITY_NAMES = ("text", "image")
LABELS = ("text-only", "image-only", "cross-modal", "dead")
ARCHITECTURES = ("topk", "standard", "jumprelu")
SAE_ROOT = Path(__file__).resolve().parent / "zoo" / "sae"
CACHE_ROOT = Path(os.environ.get("MODEL_INSPECTOR_CACHE", Path.home() / ".cache" / "model-inspector")) / "sae"
STORE_FILE = "feature_store.json.gz"
META_FILE = "sae_v_meta.json"


def _noop(fraction: float, message: str = "") -> None:
    return None


# =============================================================================================
# Parameters and results


@dataclass
class TrainParams(Result):
    architecture: str = "topk"  # topk | standard | jumprelu
    d_sae: int = 512
    k: int = 8  # TopK: active latents per token
    l1_coefficient: float = 3.0  # Standard
    l0_coefficient: float = 0.3  # JumpReLU
    steps: int = 2000
    batch_size: int = 256
    lr: float = 2e-3
    seed: int = 0
    # Scale each modality to the same mean norm before the SAE. Image-token residuals can be tens of
    # times larger than text ones (they come from the projector); without this the reconstruction
    # loss is spent almost entirely on image tokens.
    balance_modalities: bool = True


@dataclass
class StoreParams(Result):
    top_n: int = 12  # top text tokens / top images shown per feature
    top_images: int = 6
    quantile_bins: int = 5
    per_quantile: int = 3
    hist_bins: int = 24
    neighbours: int = 8
    logit_tokens: int = 8
    modality_top: int = 30  # modality label: among the top-30 tokens ...
    modality_min: int = 5  # ... at least 5 of each modality makes a feature cross-modal
    omega_top: int = 5  # omega_k: top-5 text x top-5 image residual vectors
    concept_top: int = 20  # concept precision over the top-20 tokens of a modality
    threshold: float = 0.0  # "active" means activation > threshold


@dataclass
class Pair(Result):
    """One image-caption pair; the image is regenerated from `image_seed` by its dataset."""

    text: str
    image_seed: int | None = None
    corrupted: bool = False
    kind: str = "clean"  # clean | other-scene | swapped-attribute ...


@dataclass
class PairSet(Result):
    dataset: str  # registry name: "shapes" or "noise"
    seed: int
    image_size: int | None
    pairs: list[Pair] = field(default_factory=list)

    def image(self, i: int):
        pair = self.pairs[i]
        if pair.image_seed is None or self.image_size is None:
            return None
        return DATASETS[self.dataset].render(pair.image_seed, self.image_size)


@dataclass
class Activations:
    """Residual vectors of every recorded position (not a Result: it is large and never exported)."""

    acts: torch.Tensor  # (N, d) float32
    modality: torch.Tensor  # (N,) TEXT / IMAGE
    pair: torch.Tensor  # (N,) index into the pair set
    index: torch.Tensor  # (N,) text-token index within the pair, or patch index for image tokens
    tokens: list[list[str]]  # per pair: its text tokens, in order
    layer: int
    grid: int  # image patches per side (0 for text-only models)

    def __len__(self) -> int:
        return int(self.acts.shape[0])


@dataclass
class SaeMeta(Result):
    model: str
    layer: int
    d_in: int
    train: TrainParams
    dataset: str
    n_pairs: int
    n_tokens: int
    fve: float  # fraction of variance explained on held-out tokens
    l0: float
    dead: int
    train_seconds: float = 0.0
    model_fingerprint: str = ""  # of the weights it was trained on; a mismatch means the SAE is stale
    scales: list[float] = field(default_factory=lambda: [1.0, 1.0])  # input scale for text, image tokens
    fve_text: float | None = None
    fve_image: float | None = None


@dataclass
class Example(Result):
    pair: int
    index: int  # text-token index or patch index
    modality: int
    act: float


@dataclass
class TextExample(Result):
    pair: int
    index: int
    act: float
    context: list[float]  # the feature's activation on every text token of the pair


@dataclass
class ImageExample(Result):
    pair: int
    patch: int
    act: float
    heatmap: list[float]  # the feature's activation on every patch of the image


@dataclass
class QuantileBin(Result):
    low: float
    high: float
    examples: list[Example]


@dataclass
class Scored(Result):
    key: str  # a feature index (as text) or a token string
    value: float


@dataclass
class Concept(Result):
    name: str  # e.g. "colour:red"
    precision: float
    support: int  # tokens it was measured on


@dataclass
class FeatureCard(Result):
    index: int
    label: str  # text-only | image-only | cross-modal | dead
    omega: float
    density: float
    density_text: float
    density_image: float
    max_act: float
    mean_act: float
    n_text_top: int
    n_image_top: int
    top_text: list[TextExample]
    top_images: list[ImageExample]
    quantiles: list[QuantileBin]
    hist_edges: list[float]
    hist_counts: list[int]
    neighbours: list[Scored]
    coactive: list[Scored]
    logit_tokens: list[Scored]
    concept_text: Concept | None = None
    concept_image: Concept | None = None
    concept_both: Concept | None = None  # same concept in both modalities; precision = the lower one


@dataclass
class FeatureStore(Result):
    meta: SaeMeta
    params: StoreParams
    pairs: PairSet
    tokens: list[list[str]]
    grid: int
    features: list[FeatureCard]

    def summary(self) -> dict:
        n = len(self.features)
        labels = [f.label for f in self.features]
        both = [f for f in self.features
                if f.concept_both and f.concept_both.precision >= 0.9 and f.concept_both.support >= 5]
        return {
            "features": n,
            "cross_modal": labels.count("cross-modal"),
            "text_only": labels.count("text-only"),
            "image_only": labels.count("image-only"),
            "dead": labels.count("dead"),
            "concept_both_ge_0.9": len(both),
            "concept_both_ge_0.9_cross_modal": sum(f.label == "cross-modal" for f in both),
            "omega_mean_cross_modal": round(sum(f.omega for f in self.features if f.label == "cross-modal")
                                            / max(labels.count("cross-modal"), 1), 4),
            "fve": self.meta.fve,
            "l0": self.meta.l0,
        }


@dataclass
class PairScore(Result):
    pair: int
    text: str
    corrupted: bool
    kind: str
    score: float  # s_i: sum of omega over shared features
    weighted: float  # activation-weighted mean omega over shared features
    shared: int  # number of features active on both modalities of the pair
    rank: int = 0


@dataclass
class Ranking(Result):
    model: str
    layer: int
    by: str  # "sum" | "weighted"
    threshold: float
    rows: list[PairScore]
    roc_auc: float | None  # P(score of a clean pair > score of a corrupted pair)
    roc_auc_weighted: float | None
    precision: float | None  # of "clean" among the top half
    recall: float | None  # share of clean pairs that land in the top half


@dataclass
class PositionFeatures(Result):
    modality: int
    index: int  # text-token index or patch index
    token: str
    features: list[Scored]  # active features at this position, strongest first


@dataclass
class InputExplanation(Result):
    model: str
    layer: int
    tokens: list[str]
    grid: int
    positions: list[PositionFeatures]
    totals: list[Scored]  # features by their largest activation anywhere in the input
    text_max: dict[int, float]
    image_max: dict[int, float]


# =============================================================================================
# Datasets: image-caption pairs that can be regenerated from a seed


class Dataset:
    name = ""

    def pairs(self, handle: ModelHandle, n: int, seed: int, corrupted: float) -> PairSet:
        raise NotImplementedError

    def render(self, image_seed: int, size: int):
        raise NotImplementedError

    def prompt(self, handle: ModelHandle, text: str) -> str:
        if handle.kind != "vlm":
            return text
        return f"{image_token(handle)} {text}"

    def concepts(self, pair: Pair, tokens: list[str], grid: int) -> tuple[list[set], list[set]]:
        """Ground-truth concept sets per text token and per patch; empty when unknown."""
        return [set() for _ in tokens], [set() for _ in range(grid * grid)]


class NoiseDataset(Dataset):
    """Random coloured blocks with random vocabulary words: works on any model, knows no concepts."""

    name = "noise"

    def pairs(self, handle, n, seed, corrupted=0.0):
        rng = random.Random(seed)
        words = _plain_words(handle.tokenizer)
        size = handle.info.image_size if handle.kind == "vlm" else None
        out = []
        for i in range(n):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(4, 8)))
            out.append(Pair(text=text, image_seed=seed * 100_003 + i if size else None,
                            corrupted=rng.random() < corrupted))
        return PairSet(dataset=self.name, seed=seed, image_size=size, pairs=out)

    def render(self, image_seed, size):
        import numpy as np
        from PIL import Image

        rng = np.random.default_rng(image_seed)
        cells = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
        return Image.fromarray(np.kron(cells, np.ones((size // 4, size // 4, 1), dtype=np.uint8)))


def _plain_words(tokenizer, limit: int = 400) -> list[str]:
    specials = set(tokenizer.all_special_tokens)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    words = [w for w, _ in vocab if w not in specials and w.isalnum()][:limit]
    return words or ["a"]


class ShapesDataset(Dataset):
    """Shapes World scenes with their captions; the evaluation mix comes from `corrupted_pairs`
    (a third clean, a third another scene's caption, a third with swapped attributes).

    Ground truth per position: a caption word carries the attributes its sentence has stated so
    far (position words carry the whole position); an image patch carries the attributes of the
    object whose pixels cover it.
    """

    name = "shapes"
    TRAIN_BASE = 10_000_000  # the zoo's validation split: scenes the VLM was not trained on
    EVAL_BASE = 20_000  # corrupted_pairs(seed) draws scenes from seed * 1000: the test split

    def pairs(self, handle, n, seed, corrupted=0.0):
        from analysis.zoo import shapes_world as sw

        size = handle.info.image_size if handle.kind == "vlm" else None
        if corrupted > 0:
            raw = sw.corrupted_pairs(self.EVAL_BASE + seed, n)
            out = [Pair(text=p.caption, image_seed=p.scene.seed if size else None, corrupted=p.corrupted,
                        kind=p.kind) for p in raw]
        else:
            seeds = [self.TRAIN_BASE + seed * 100_000 + i for i in range(n)]
            out = [Pair(text=sw.caption(sw.generate_scene(s)), image_seed=s if size else None) for s in seeds]
        return PairSet(dataset=self.name, seed=seed, image_size=size, pairs=out)

    def render(self, image_seed, size):
        from analysis.zoo import shapes_world as sw

        return sw.render(sw.generate_scene(image_seed), size)

    def prompt(self, handle, text):
        from analysis.zoo import shapes_world as sw

        if handle.kind == "vlm":
            return f"{sw.VLM_CAPTION_PROMPT} {text}"
        return f"{sw.BOS} {text}"

    def concepts(self, pair, tokens, grid):
        return self.text_concepts(tokens), self.patch_concepts(pair.image_seed, grid)

    @staticmethod
    def text_concepts(tokens: list[str]) -> list[set]:
        from analysis.zoo import shapes_world as sw

        out: list[set] = []
        stated: set = set()
        position: list[str] = []
        in_position = False
        for i, word in enumerate(tokens):
            if word == "there":
                stated, position, in_position = set(), [], False
            if word in sw.COLOURS:
                stated.add(f"colour:{word}")
            elif word in sw.SHAPES:
                stated.add(f"shape:{word}")
            elif word in sw.SIZES:
                stated.add(f"size:{word}")
            elif word == "the" and i > 0 and tokens[i - 1] == "at":
                in_position = True
            if in_position and word in sw.POSITION_WORDS:
                # the position phrase is one or two words; every word of it carries the whole phrase
                j = i
                while j > 0 and tokens[j - 1] in sw.POSITION_WORDS:
                    j -= 1
                k = i
                while k + 1 < len(tokens) and tokens[k + 1] in sw.POSITION_WORDS:
                    k += 1
                phrase = " ".join(tokens[j:k + 1])
                if phrase in sw.POSITIONS:
                    stated.add(f"position:{phrase}")
            out.append(set(stated))
            if word == ".":
                stated, in_position = set(), False
        return out

    @staticmethod
    def patch_concepts(image_seed: int | None, grid: int) -> list[set]:
        if image_seed is None or grid == 0:
            return []
        import numpy as np

        from analysis.zoo import shapes_world as sw

        scene = sw.generate_scene(image_seed)
        size = 64
        pixels = np.asarray(sw.render(scene, size)).astype(int)
        ink = np.abs(pixels - np.array(sw.BACKGROUND)).max(-1) > 60
        step = size / grid
        out: list[set] = []
        by_cell = {o.cell: o for o in scene.objects}
        for r in range(grid):
            for c in range(grid):
                y0, y1, x0, x1 = int(r * step), int((r + 1) * step), int(c * step), int((c + 1) * step)
                patch = ink[y0:y1, x0:x1]
                # >= 20 % ink, or 30 ink pixels for coarse grids (a small object fills ~13 % of a cell)
                if patch.sum() < min(0.2 * patch.size, 30):
                    out.append(set())
                    continue
                ys, xs = patch.nonzero()
                cy, cx = y0 + ys.mean(), x0 + xs.mean()
                obj = by_cell.get(int(cy // (size / 3)) * 3 + int(cx // (size / 3)))
                out.append(set() if obj is None else {f"colour:{obj.colour}", f"shape:{obj.shape}",
                                                      f"size:{obj.size}", f"position:{obj.position}"})
        return out


DATASETS: dict[str, Dataset] = {"noise": NoiseDataset(), "shapes": ShapesDataset()}


def register_dataset(dataset: Dataset) -> None:
    DATASETS[dataset.name] = dataset


def default_dataset(handle: ModelHandle) -> str:
    """Shapes World for the demo VLM (its ground truth is known), random pairs otherwise."""
    words = ["describe", "there", "is", "a", "red", "circle", "at", "the", "top", "left"]
    try:
        word_level = handle.tokenizer.tokenize(" ".join(words)) == words
    except Exception:  # a tokenizer without tokenize(): not the zoo's
        word_level = False
    return "shapes" if word_level else "noise"


def make_pairs(handle: ModelHandle, dataset: str, n: int, seed: int, corrupted: float = 0.0) -> PairSet:
    if dataset not in DATASETS:
        raise ValueError(f"Unknown dataset '{dataset}' (available: {', '.join(DATASETS)}).")
    return DATASETS[dataset].pairs(handle, n, seed, corrupted)


def image_token(handle: ModelHandle) -> str:
    token = getattr(handle.processor, "image_token", None)
    if token is None:
        token = handle.tokenizer.convert_ids_to_tokens(handle.model.config.image_token_id)
    return token


# =============================================================================================
# 1. Activation collection


class _StopForward(Exception):
    """Raised by the capture hook: layers after the chosen one are not needed."""


def decoder_layers(handle: ModelHandle) -> torch.nn.ModuleList:
    return handle.language_model.model.layers


def collect_activations(handle: ModelHandle, pairs: PairSet, layer: int, batch_size: int = 32,
                        progress: Progress | None = None, images: list | None = None) -> Activations:
    """Residual stream after decoder layer `layer` at every text and image position of every pair.

    Special tokens (BOS, padding) are skipped; image tokens are numbered by patch in row-major
    order. `images` overrides the dataset's rendered images (used by `explain_input`).
    """
    progress = progress or _noop
    layers = decoder_layers(handle)
    if not 0 <= layer < len(layers):
        raise ValueError(f"Layer {layer} is out of range: {handle.spec.label} has {len(layers)} decoder layers.")
    is_vlm = handle.kind == "vlm"
    tok = handle.tokenizer
    img_id = handle.model.config.image_token_id if is_vlm else None
    skip = set(tok.all_special_ids) - ({img_id} if img_id is not None else set())
    grid = int(round(math.sqrt(handle.info.image_tokens))) if is_vlm else 0
    dataset = DATASETS.get(pairs.dataset) or Dataset()
    captured: list[torch.Tensor] = []

    def hook(module, args, output):
        captured.append((output[0] if isinstance(output, tuple) else output).detach().float().cpu())
        raise _StopForward

    acts, modality, pair_idx, index, tokens = [], [], [], [], []
    n = len(pairs.pairs)
    with handle.patch() as patch, torch.no_grad():
        patch.hook(layers[layer], hook)
        for start in range(0, n, batch_size):
            batch = list(range(start, min(n, start + batch_size)))
            prompts = [dataset.prompt(handle, pairs.pairs[i].text) for i in batch]
            if is_vlm:
                imgs = [images[i] if images is not None else pairs.image(i) for i in batch]
                if any(im is None for im in imgs):
                    raise ValueError("Every pair needs an image for a vision-language model.")
                enc = handle.processor(images=[im.convert("RGB") for im in imgs], text=prompts,
                                       return_tensors="pt", padding=True)
            else:
                enc = tok(prompts, return_tensors="pt", padding=True)
            enc = {k: v.to(handle.device) for k, v in enc.items()}
            captured.clear()
            try:
                handle.model(**enc)
            except _StopForward:
                pass
            hidden = captured[0]
            ids = enc["input_ids"].cpu()
            mask = enc["attention_mask"].cpu().bool()
            is_image = (ids == img_id) & mask if is_vlm else torch.zeros_like(mask)
            is_text = mask & ~is_image & ~torch.isin(ids, torch.tensor(sorted(skip), dtype=ids.dtype))
            for row, i in enumerate(batch):
                keep = (is_text[row] | is_image[row]).nonzero().squeeze(1)  # positions in order
                image_here = is_image[row, keep]
                # text tokens count 0, 1, 2, ... and image tokens count patches 0, 1, 2, ... separately
                idx = torch.where(image_here, image_here.long().cumsum(0) - 1, (~image_here).long().cumsum(0) - 1)
                acts.append(hidden[row, keep])
                modality.append(image_here.long() * IMAGE + (~image_here).long() * TEXT)
                pair_idx.append(torch.full((keep.numel(),), i, dtype=torch.long))
                index.append(idx)
                tokens.append(tok.convert_ids_to_tokens(ids[row, keep[~image_here]].tolist()))
            progress(batch[-1] / max(n, 1), f"activations {batch[-1] + 1}/{n}")
    if not sum(a.shape[0] for a in acts):
        raise ValueError("No text or image positions were found in the inputs.")
    return Activations(
        acts=torch.cat(acts), modality=torch.cat(modality), pair=torch.cat(pair_idx),
        index=torch.cat(index), tokens=tokens, layer=layer, grid=grid,
    )


# =============================================================================================
# 2. SAE training, saving, loading (sae-lens)


def _training_config(params: TrainParams, d_in: int):
    from sae_lens import (
        JumpReLUTrainingSAEConfig,
        StandardTrainingSAEConfig,
        TopKTrainingSAEConfig,
    )

    common = dict(d_in=d_in, d_sae=params.d_sae, normalize_activations="expected_average_only_in")
    if params.architecture == "topk":
        return TopKTrainingSAEConfig(k=params.k, **common)
    if params.architecture == "standard":
        return StandardTrainingSAEConfig(l1_coefficient=params.l1_coefficient,
                                         l1_warm_up_steps=params.steps // 10, **common)
    if params.architecture == "jumprelu":
        return JumpReLUTrainingSAEConfig(l0_coefficient=params.l0_coefficient,
                                         l0_warm_up_steps=params.steps // 10, **common)
    raise ValueError(f"Unknown SAE architecture '{params.architecture}' (use {', '.join(ARCHITECTURES)}).")


def _batches(acts: torch.Tensor, batch_size: int, total_steps: int, progress: Progress,
             generator: torch.Generator) -> Iterator[torch.Tensor]:
    """The trainer's data provider: an endless stream of shuffled batches that reports progress."""
    served = 0
    while True:
        order = torch.randperm(acts.shape[0], generator=generator)
        for start in range(0, acts.shape[0] - batch_size + 1, batch_size):
            served += 1
            if served % 25 == 0:
                progress(min(served / max(total_steps, 1), 1.0), f"SAE step {min(served, total_steps)}/{total_steps}")
            yield acts[order[start:start + batch_size]]


def train_sae(acts: torch.Tensor, params: TrainParams, progress: Progress | None = None):
    """Train an sae-lens SAE on residual vectors (N, d); returns the inference SAE."""
    import contextlib
    import io
    import tempfile

    from sae_lens import SAE, SAETrainer
    from sae_lens.config import LoggingConfig, SAETrainerConfig
    from sae_lens.saes.sae import TrainingSAE

    progress = progress or _noop
    if params.architecture not in ARCHITECTURES:
        raise ValueError(f"Unknown SAE architecture '{params.architecture}' (use {', '.join(ARCHITECTURES)}).")
    batch_size = min(params.batch_size, acts.shape[0])
    torch.manual_seed(params.seed)
    generator = torch.Generator().manual_seed(params.seed)
    sae_cfg = _training_config(params, acts.shape[1])
    training_sae = TrainingSAE.from_dict(sae_cfg.to_dict())
    trainer_cfg = SAETrainerConfig(
        total_training_samples=params.steps * batch_size, train_batch_size_samples=batch_size,
        lr=params.lr, lr_end=params.lr / 10, lr_scheduler_name="cosineannealing",
        lr_warm_up_steps=params.steps // 20, lr_decay_steps=params.steps // 5,
        dead_feature_window=max(params.steps // 4, 50), feature_sampling_window=max(params.steps, 1),
        n_batches_for_norm_estimate=20, logger=LoggingConfig(log_to_wandb=False),
    )
    provider = _batches(acts.float(), batch_size, params.steps, progress, generator)
    trainer = SAETrainer(cfg=trainer_cfg, sae=training_sae, data_provider=provider)
    with contextlib.redirect_stderr(io.StringIO()):  # the trainer's tqdm bar; analysis never prints
        trained = trainer.fit()
    with tempfile.TemporaryDirectory() as tmp:
        trained.save_inference_model(tmp)
        sae = SAE.load_from_disk(tmp)
    progress(1.0, "SAE trained")
    return sae.eval()


def modality_scales(acts: Activations) -> list[float]:
    """Per-modality factors that give each modality a mean norm of sqrt(d) (1.0 for an absent one)."""
    d = acts.acts.shape[1]
    out = []
    for mod in (TEXT, IMAGE):
        rows = acts.modality == mod
        norm = float(acts.acts[rows].norm(dim=1).mean()) if rows.any() else 0.0
        out.append(math.sqrt(d) / norm if norm > 0 else 1.0)
    return out


def scaled(acts: Activations, scales: list[float]) -> torch.Tensor:
    """The SAE's input: each token's residual times its modality's scale."""
    factor = torch.tensor(scales, dtype=acts.acts.dtype)[acts.modality]
    return acts.acts * factor[:, None]


def encode(sae, acts: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([sae.encode(acts[i:i + batch_size].float()) for i in range(0, acts.shape[0], batch_size)])


def reconstruction_metrics(sae, acts: torch.Tensor, threshold: float = 0.0) -> tuple[float, float, int]:
    """(fraction of variance explained, mean L0, features never active) on `acts`."""
    with torch.no_grad():
        codes = encode(sae, acts)
        recon = torch.cat([sae.decode(codes[i:i + 4096]) for i in range(0, codes.shape[0], 4096)])
    resid = ((acts - recon) ** 2).sum()
    total = ((acts - acts.mean(0)) ** 2).sum()
    active = codes > threshold
    return float(1 - resid / total), float(active.sum(1).float().mean()), int((~active.any(0)).sum())


def save_sae(sae, meta: SaeMeta, folder: str | Path) -> Path:
    """sae-lens layout (cfg.json + sae_weights.safetensors) plus our metadata."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sae.save_model(folder)
    (folder / META_FILE).write_text(meta.to_json(indent=1))
    return folder


def load_sae(folder: str | Path):
    """(SAE, SaeMeta) from a folder written by `save_sae`."""
    from sae_lens import SAE

    folder = Path(folder)
    if not (folder / "cfg.json").is_file():
        raise FileNotFoundError(f"No SAE in '{folder}'.")
    sae = SAE.load_from_disk(folder).eval()
    meta = SaeMeta.from_json((folder / META_FILE).read_text())
    return sae, meta


# =============================================================================================
# 3. Per-feature statistics (pure tensor maths, tested against brute force)


def modality_labels(codes: torch.Tensor, modality: torch.Tensor, top: int = 30, minimum: int = 5,
                    threshold: float = 0.0) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """SAE-V modality label per feature from its top-`top` activating tokens.

    Cross-modal when at least `minimum` of them are text and `minimum` are image; otherwise the
    modality of the majority; "dead" if it never fires. Returns (labels, n_text, n_image).
    """
    k = min(top, codes.shape[0])
    values, rows = codes.topk(k, dim=0)  # (k, F)
    live = values > threshold
    is_text = (modality[rows] == TEXT) & live
    is_image = (modality[rows] == IMAGE) & live
    n_text, n_image = is_text.sum(0), is_image.sum(0)
    labels = []
    for t, i in zip(n_text.tolist(), n_image.tolist()):
        if t + i == 0:
            labels.append("dead")
        elif t >= minimum and i >= minimum:
            labels.append("cross-modal")
        else:
            labels.append("text-only" if t >= i else "image-only")
    return labels, n_text, n_image


def cross_modal_weights(acts: torch.Tensor, codes: torch.Tensor, modality: torch.Tensor, top: int = 5,
                        threshold: float = 0.0) -> torch.Tensor:
    """omega_k (SAE-V): mean cosine between the raw residual vectors of the feature's top text and
    top image tokens (all top-x top pairs). 0 when the feature never fires in one of the modalities."""
    unit = torch.nn.functional.normalize(acts.float(), dim=1)
    omega = torch.zeros(codes.shape[1])
    sides = []
    for mod in (TEXT, IMAGE):
        rows = (modality == mod).nonzero().squeeze(1)
        if rows.numel() == 0:
            return omega
        k = min(top, rows.numel())
        values, which = codes[rows].topk(k, dim=0)  # (k, F)
        sides.append((values > threshold, rows[which]))
    (live_t, rows_t), (live_i, rows_i) = sides
    for f in range(codes.shape[1]):
        t = rows_t[live_t[:, f], f]
        i = rows_i[live_i[:, f], f]
        if t.numel() and i.numel():
            omega[f] = (unit[t] @ unit[i].T).mean()
    return omega


def _amax_into(out: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")
        return out.index_reduce_(0, index, values, "amax", include_self=True)


def per_pair_max(codes: torch.Tensor, modality: torch.Tensor, pair: torch.Tensor, n_pairs: int,
                 mod: int) -> torch.Tensor:
    """(n_pairs, F): each feature's largest activation over the pair's tokens of one modality."""
    out = torch.zeros(n_pairs, codes.shape[1])
    rows = modality == mod
    if rows.any():
        _amax_into(out, pair[rows], codes[rows].float())
    return out


def pair_scores(codes: torch.Tensor, modality: torch.Tensor, pair: torch.Tensor, omega: torch.Tensor,
                n_pairs: int, threshold: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SAE-V data score per pair: s_i = sum of omega_k over features active (> threshold) on a text
    token and on an image token of pair i. Also the mean of omega_k over those features weighted by
    min(text max, image max) activation, and the number of shared features."""
    text_max = per_pair_max(codes, modality, pair, n_pairs, TEXT)
    image_max = per_pair_max(codes, modality, pair, n_pairs, IMAGE)
    shared = (text_max > threshold) & (image_max > threshold)
    score = (shared.float() * omega).sum(1)
    weight = torch.minimum(text_max, image_max) * shared
    weighted = (weight * omega).sum(1) / weight.sum(1).clamp_min(1e-12)
    return score, weighted, shared.sum(1)


def roc_auc(positive: list[float], negative: list[float]) -> float | None:
    """P(a positive scores above a negative), ties counting one half (Mann-Whitney U / n+ n-)."""
    if not positive or not negative:
        return None
    pos = torch.tensor(positive, dtype=torch.float64)
    neg = torch.tensor(negative, dtype=torch.float64)
    greater = (pos[:, None] > neg[None, :]).double().sum()
    ties = (pos[:, None] == neg[None, :]).double().sum()
    return float((greater + 0.5 * ties) / (len(positive) * len(negative)))


def concept_precision(rows: list[int], concepts: list[set]) -> Concept | None:
    """The concept shared by most of the given tokens, with the share (precision)."""
    if not rows:
        return None
    counts: dict[str, int] = {}
    for r in rows:
        for c in concepts[r]:
            counts[c] = counts.get(c, 0) + 1
    if not counts:
        return None
    name = max(sorted(counts), key=counts.get)
    return Concept(name=name, precision=counts[name] / len(rows), support=len(rows))


def _concept_in_both(text_rows: list[int], image_rows: list[int], concepts: list[set]) -> Concept | None:
    if not text_rows or not image_rows:
        return None
    best = None
    names = set().union(*(concepts[r] for r in text_rows)) & set().union(*(concepts[r] for r in image_rows))
    for name in sorted(names):
        pt = sum(name in concepts[r] for r in text_rows) / len(text_rows)
        pi = sum(name in concepts[r] for r in image_rows) / len(image_rows)
        p = min(pt, pi)
        if best is None or p > best.precision:
            best = Concept(name=name, precision=p, support=min(len(text_rows), len(image_rows)))
    return best


# =============================================================================================
# 4. The feature store


def _logit_lens(handle: ModelHandle, sae, top: int) -> list[list[Scored]]:
    """Tokens each decoder direction promotes most, read through the final norm's scale and lm_head."""
    lm = handle.language_model
    w_dec = sae.W_dec.detach().float()  # (F, d)
    norm = getattr(lm.model, "norm", None)
    scale = getattr(norm, "weight", None)
    with handle.session():
        direction = w_dec * scale.detach().float().cpu() if scale is not None else w_dec
        logits = direction @ lm.lm_head.weight.detach().float().cpu().T  # (F, V)
    values, ids = logits.topk(min(top, logits.shape[1]), dim=1)
    tok = handle.tokenizer
    return [[Scored(tok.convert_ids_to_tokens(int(i)), round(float(v), 4)) for v, i in zip(vs, is_)]
            for vs, is_ in zip(values, ids)]


def _round(xs, nd: int = 3) -> list[float]:
    return [round(float(x), nd) for x in xs]


def build_feature_store(handle: ModelHandle, sae, meta: SaeMeta, acts: Activations, pairs: PairSet,
                        params: StoreParams | None = None, progress: Progress | None = None) -> FeatureStore:
    """Everything the browser shows per feature, computed once from the SAE codes of `acts`."""
    params = params or StoreParams()
    progress = progress or _noop
    progress(0.0, "encoding")
    codes = encode(sae, scaled(acts, meta.scales))
    n_tok, n_feat = codes.shape
    thr = params.threshold
    active = codes > thr
    mod, pair_of, index_of = acts.modality, acts.pair, acts.index
    is_text, is_image = mod == TEXT, mod == IMAGE
    n_text, n_image = int(is_text.sum()), int(is_image.sum())

    labels, top_text_n, top_image_n = modality_labels(codes, mod, params.modality_top, params.modality_min, thr)
    omega = cross_modal_weights(acts.acts, codes, mod, params.omega_top, thr)
    progress(0.2, "neighbours")
    w_dec = torch.nn.functional.normalize(sae.W_dec.detach().float(), dim=1)
    dec_cos = w_dec @ w_dec.T
    dec_cos.fill_diagonal_(-2)
    centred = codes - codes.mean(0)
    std = centred.pow(2).mean(0).sqrt().clamp_min(1e-8)
    corr = (centred.T @ centred) / n_tok / (std[:, None] * std[None, :])
    corr.fill_diagonal_(-2)
    corr[~active.any(0)] = -2
    corr[:, ~active.any(0)] = -2
    logit_tokens = _logit_lens(handle, sae, params.logit_tokens)

    # ground-truth concepts per recorded position (Shapes World)
    dataset = DATASETS.get(pairs.dataset)
    token_concepts: list[set] = [set() for _ in range(n_tok)]
    if dataset is not None:
        per_pair = [dataset.concepts(p, acts.tokens[i], acts.grid) for i, p in enumerate(pairs.pairs)]
        for r in range(n_tok):
            t_sets, i_sets = per_pair[int(pair_of[r])]
            sets = t_sets if mod[r] == TEXT else i_sets
            idx = int(index_of[r])
            token_concepts[r] = sets[idx] if idx < len(sets) else set()

    # rows of each pair, for contexts and heatmaps
    text_rows_of: dict[int, torch.Tensor] = {}
    image_rows_of: dict[int, torch.Tensor] = {}
    for p in range(len(pairs.pairs)):
        rows = (pair_of == p)
        text_rows_of[p] = (rows & is_text).nonzero().squeeze(1)
        image_rows_of[p] = (rows & is_image).nonzero().squeeze(1)

    cards = []
    for f in range(n_feat):
        if f % 32 == 0:
            progress(0.3 + 0.7 * f / n_feat, f"feature {f}/{n_feat}")
        col = codes[:, f]
        on = active[:, f]
        values = col[on]
        top_text: list[TextExample] = []
        top_images: list[ImageExample] = []
        quantiles: list[QuantileBin] = []
        t_rows = i_rows = []
        if n_text:
            t_col = torch.where(is_text, col, torch.full_like(col, -1.0))
            tv, tr = t_col.topk(min(params.top_n, n_tok))
            tr = tr[tv > thr]
            for r in tr.tolist():
                p = int(pair_of[r])
                top_text.append(TextExample(pair=p, index=int(index_of[r]), act=round(float(col[r]), 4),
                                            context=_round(col[text_rows_of[p]])))
            tv, tr = t_col.topk(min(params.concept_top, n_tok))
            t_rows = tr[tv > thr].tolist()
        if n_image:
            # top images: by each image's best patch
            i_col = torch.where(is_image, col, torch.full_like(col, -1.0))
            best = torch.full((len(pairs.pairs),), -1.0)
            _amax_into(best, pair_of, i_col)
            bv, bp = best.topk(min(params.top_images, len(best)))
            for v, p in zip(bv.tolist(), bp.tolist()):
                if v <= thr:
                    break
                rows = image_rows_of[p]
                heat = col[rows]
                top_images.append(ImageExample(pair=p, patch=int(index_of[rows[int(heat.argmax())]]),
                                               act=round(v, 4), heatmap=_round(heat)))
            iv, ir = i_col.topk(min(params.concept_top, n_tok))
            i_rows = ir[iv > thr].tolist()
        if values.numel():
            qs = torch.quantile(values, torch.linspace(0, 1, params.quantile_bins + 1))
            on_rows = on.nonzero().squeeze(1)
            gen = torch.Generator().manual_seed(f)
            for b in range(params.quantile_bins):
                lo, hi = float(qs[b]), float(qs[b + 1])
                inside = on_rows[(values >= lo) & ((values <= hi) if b == params.quantile_bins - 1 else (values < hi))]
                pick = inside[torch.randperm(inside.numel(), generator=gen)[:params.per_quantile]]
                quantiles.append(QuantileBin(round(lo, 4), round(hi, 4), [
                    Example(int(pair_of[r]), int(index_of[r]), int(mod[r]), round(float(col[r]), 4))
                    for r in pick.tolist()]))
            hist = torch.histogram(values.float(), bins=params.hist_bins)
            edges, counts = _round(hist.bin_edges, 4), [int(c) for c in hist.hist]
        else:
            edges, counts = [], []
        nb_v, nb_i = dec_cos[f].topk(min(params.neighbours, n_feat - 1))
        co_v, co_i = corr[f].topk(min(params.neighbours, n_feat - 1))
        cards.append(FeatureCard(
            index=f, label=labels[f], omega=round(float(omega[f]), 4),
            density=float(on.float().mean()),
            density_text=float(on[is_text].float().mean()) if n_text else 0.0,
            density_image=float(on[is_image].float().mean()) if n_image else 0.0,
            max_act=round(float(values.max()), 4) if values.numel() else 0.0,
            mean_act=round(float(values.mean()), 4) if values.numel() else 0.0,
            n_text_top=int(top_text_n[f]), n_image_top=int(top_image_n[f]),
            top_text=top_text, top_images=top_images, quantiles=quantiles,
            hist_edges=edges, hist_counts=counts,
            neighbours=[Scored(str(int(i)), round(float(v), 4)) for v, i in zip(nb_v, nb_i) if v > -2],
            coactive=[Scored(str(int(i)), round(float(v), 4)) for v, i in zip(co_v, co_i) if v > -2],
            logit_tokens=logit_tokens[f],
            concept_text=concept_precision(t_rows, token_concepts),
            concept_image=concept_precision(i_rows, token_concepts),
            concept_both=_concept_in_both(t_rows, i_rows, token_concepts),
        ))
    progress(1.0, "feature store built")
    return FeatureStore(meta=meta, params=params, pairs=pairs, tokens=acts.tokens, grid=acts.grid, features=cards)


def save_store(store: FeatureStore, folder: str | Path) -> Path:
    path = Path(folder) / STORE_FILE
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(store.to_dict(), fh, separators=(",", ":"))
    return path


def load_store(folder: str | Path) -> FeatureStore:
    path = Path(folder) / STORE_FILE
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return FeatureStore.from_dict(json.load(fh))


# =============================================================================================
# 5. Data ranking


def rank_pairs(store_or_meta: SaeMeta, omega: torch.Tensor, codes: torch.Tensor, acts: Activations,
               pairs: PairSet, by: str = "sum", threshold: float = 0.0) -> Ranking:
    """Rank image-caption pairs by their SAE-V score (highest first) and measure how well that
    separates corrupted pairs from clean ones."""
    if by not in ("sum", "weighted"):
        raise ValueError("Rank by 'sum' or 'weighted'.")
    n = len(pairs.pairs)
    score, weighted, shared = pair_scores(codes, acts.modality, acts.pair, omega, n, threshold)
    rows = [PairScore(pair=i, text=p.text, corrupted=p.corrupted, kind=p.kind, score=round(float(score[i]), 4),
                      weighted=round(float(weighted[i]), 4), shared=int(shared[i]))
            for i, p in enumerate(pairs.pairs)]
    key = (lambda r: r.score) if by == "sum" else (lambda r: r.weighted)
    rows.sort(key=lambda r: (-key(r), r.pair))
    for rank, r in enumerate(rows, 1):
        r.rank = rank
    clean = [r for r in rows if not r.corrupted]
    bad = [r for r in rows if r.corrupted]
    auc = roc_auc([r.score for r in clean], [r.score for r in bad])
    auc_w = roc_auc([r.weighted for r in clean], [r.weighted for r in bad])
    precision = recall = None
    if clean and bad:
        top = rows[: n // 2]
        kept_clean = sum(not r.corrupted for r in top)
        precision = kept_clean / max(len(top), 1)
        recall = kept_clean / len(clean)
    return Ranking(model=store_or_meta.model, layer=store_or_meta.layer, by=by, threshold=threshold, rows=rows,
                   roc_auc=auc, roc_auc_weighted=auc_w, precision=precision, recall=recall)


def rank_dataset(handle: ModelHandle, sae, meta: SaeMeta, store: FeatureStore, pairs: PairSet,
                 by: str = "sum", threshold: float = 0.0, progress: Progress | None = None) -> Ranking:
    """Collect activations for `pairs`, encode them, and rank with the store's omega."""
    acts = collect_activations(handle, pairs, meta.layer, progress=progress)
    omega = torch.tensor([f.omega for f in store.features])
    return rank_pairs(meta, omega, encode(sae, scaled(acts, meta.scales)), acts, pairs, by=by, threshold=threshold)


# =============================================================================================
# 6. One input


def explain_input(handle: ModelHandle, sae, meta: SaeMeta, text: str, image=None, per_position: int = 8,
                  threshold: float = 0.0) -> InputExplanation:
    """Active features at every text token and image patch of one input."""
    if handle.kind == "vlm" and image is None:
        raise ValueError("A vision-language model needs an image with the text.")
    if handle.kind != "vlm" and image is not None:
        raise ValueError(f"{handle.spec.label} is a text-only model; it cannot read an image.")
    pairs = PairSet(dataset="", seed=0, image_size=handle.info.image_size, pairs=[Pair(text=text)])
    layer = meta.layer
    acts = collect_activations(handle, pairs, layer, images=[image] if image is not None else None)
    codes = encode(sae, scaled(acts, meta.scales))
    tokens = acts.tokens[0]
    positions = []
    for r in range(len(acts)):
        row = codes[r]
        vals, idx = row.topk(min(per_position, row.numel()))
        feats = [Scored(str(int(i)), round(float(v), 4)) for v, i in zip(vals, idx) if v > threshold]
        m, ix = int(acts.modality[r]), int(acts.index[r])
        positions.append(PositionFeatures(modality=m, index=ix, token=tokens[ix] if m == TEXT else f"patch {ix}",
                                          features=feats))
    text_max = per_pair_max(codes, acts.modality, acts.pair, 1, TEXT)[0]
    image_max = per_pair_max(codes, acts.modality, acts.pair, 1, IMAGE)[0]
    overall = codes.max(0).values
    order = overall.argsort(descending=True)
    totals = [Scored(str(int(f)), round(float(overall[f]), 4)) for f in order if overall[f] > threshold]
    return InputExplanation(
        model=handle.spec.label, layer=layer, tokens=tokens, grid=acts.grid, positions=positions, totals=totals,
        text_max={int(f): round(float(text_max[f]), 4) for f in (text_max > threshold).nonzero().squeeze(1)},
        image_max={int(f): round(float(image_max[f]), 4) for f in (image_max > threshold).nonzero().squeeze(1)},
    )


# =============================================================================================
# 7. End to end: train (or load) an SAE and its store for one (model, layer)


@dataclass
class BuildParams(Result):
    layer: int = 1
    dataset: str = ""  # "" = the model's default (Shapes World for the demo VLM)
    train_pairs: int = 600
    eval_pairs: int = 300
    corrupted: float = 0.5  # share of corrupted pairs in the evaluation set
    seed: int = 0
    train: TrainParams = field(default_factory=TrainParams)
    store: StoreParams = field(default_factory=StoreParams)


def model_fingerprint(handle: ModelHandle) -> str:
    """A short hash of the model's weight files (empty when they are not on disk)."""
    digest = hashlib.sha256()
    files = sorted(Path(handle.path).glob("*.safetensors")) if handle.path else []
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16] if files else ""


def is_stale(handle: ModelHandle, meta: SaeMeta) -> bool:
    return bool(meta.model_fingerprint) and meta.model_fingerprint != model_fingerprint(handle)


def demo_folder(handle: ModelHandle, layer: int) -> Path | None:
    """The committed SAE for a demo-zoo model and layer, if there is one."""
    if handle.spec.source != "zoo":
        return None
    folder = SAE_ROOT / handle.spec.name / f"layer{layer}"
    return folder if (folder / STORE_FILE).is_file() else None


def available_saes(handle: ModelHandle) -> list[Path]:
    """Folders holding an SAE + store for this model: committed demo ones, then cached ones."""
    found = []
    if handle.spec.source == "zoo":
        found += sorted((SAE_ROOT / handle.spec.name).glob("layer*/" + STORE_FILE))
    found += sorted(_cache_dir(handle).glob("*/" + STORE_FILE))
    return [p.parent for p in found]


def _cache_dir(handle: ModelHandle) -> Path:
    digest = hashlib.sha1(f"{handle.spec.label}|{handle.path}".encode()).hexdigest()[:12]
    return CACHE_ROOT / digest


def build_folder(handle: ModelHandle, params: BuildParams) -> Path:
    digest = hashlib.sha1(params.to_json(sort_keys=True).encode()).hexdigest()[:10]
    return _cache_dir(handle) / f"layer{params.layer}-{digest}"


def build(handle: ModelHandle, params: BuildParams, folder: str | Path | None = None,
          progress: Progress | None = None) -> Path:
    """Collect activations, train the SAE, measure it and build its feature store into `folder`."""
    import time

    progress = progress or _noop
    dataset = params.dataset or default_dataset(handle)
    folder = Path(folder) if folder is not None else build_folder(handle, params)
    train_set = make_pairs(handle, dataset, params.train_pairs, params.seed * 2 + 1, corrupted=0.0)
    eval_set = make_pairs(handle, dataset, params.eval_pairs, params.seed * 2 + 2, corrupted=params.corrupted)
    train_acts = collect_activations(handle, train_set, params.layer,
                                     progress=lambda f, m: progress(0.15 * f, m))
    start = time.perf_counter()
    scales = modality_scales(train_acts) if params.train.balance_modalities else [1.0, 1.0]
    sae = train_sae(scaled(train_acts, scales), params.train, progress=lambda f, m: progress(0.15 + 0.6 * f, m))
    seconds = time.perf_counter() - start
    eval_acts = collect_activations(handle, eval_set, params.layer,
                                    progress=lambda f, m: progress(0.75 + 0.05 * f, m))
    eval_in = scaled(eval_acts, scales)
    fve, l0, dead = reconstruction_metrics(sae, eval_in, params.store.threshold)
    fve_mod = [reconstruction_metrics(sae, eval_in[eval_acts.modality == m], params.store.threshold)[0]
               if bool((eval_acts.modality == m).sum() > 1) else None for m in (TEXT, IMAGE)]
    meta = SaeMeta(model=handle.spec.label, layer=params.layer, d_in=int(train_acts.acts.shape[1]),
                   train=params.train, dataset=dataset, n_pairs=len(train_set.pairs), n_tokens=len(train_acts),
                   fve=round(fve, 4), l0=round(l0, 3), dead=dead, train_seconds=round(seconds, 1),
                   model_fingerprint=model_fingerprint(handle), scales=[round(x, 8) for x in scales],
                   fve_text=None if fve_mod[0] is None else round(fve_mod[0], 4),
                   fve_image=None if fve_mod[1] is None else round(fve_mod[1], 4))
    store = build_feature_store(handle, sae, meta, eval_acts, eval_set, params.store,
                                progress=lambda f, m: progress(0.8 + 0.2 * f, m))
    save_sae(sae, meta, folder)
    save_store(store, folder)
    (folder / "build_params.json").write_text(params.to_json(indent=1))
    progress(1.0, "done")
    return folder


# =============================================================================================
# CLI


def cli(argv: list[str]) -> int:
    import argparse

    from analysis.models import ModelSpec, load_model

    parser = argparse.ArgumentParser(prog="python -m analysis sae",
                                     description="SAE-V: train an SAE over image+text tokens, summarise its features, "
                                                 "rank image-caption pairs by cross-modal score.")
    parser.add_argument("--model", default="zoo:shapes-vlm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    parser.add_argument("--layer", type=int, default=None, help="decoder layer (default: the middle one)")
    parser.add_argument("--sae", default=None, help="folder of a saved SAE + feature store (skips training)")
    parser.add_argument("--out", default=None, help="where to write a newly trained SAE + store")
    parser.add_argument("--arch", default="topk", choices=ARCHITECTURES)
    parser.add_argument("--d-sae", type=int, default=512)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--train-pairs", type=int, default=600)
    parser.add_argument("--eval-pairs", type=int, default=300)
    parser.add_argument("--dataset", default="", help="shapes | noise (default: shapes on the demo VLM)")
    parser.add_argument("--feature", type=int, default=None, help="print this feature's card")
    parser.add_argument("--rank", action="store_true", help="also rank the evaluation pairs by s_i")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)

    handle = load_model(ModelSpec.parse(args.model))
    layer = args.layer if args.layer is not None else handle.info.layers // 2
    if args.sae:
        folder = Path(args.sae)
    else:
        folder = demo_folder(handle, layer) if args.out is None else None
        if folder is None:
            params = BuildParams(layer=layer, dataset=args.dataset, train_pairs=args.train_pairs,
                                 eval_pairs=args.eval_pairs,
                                 train=TrainParams(architecture=args.arch, d_sae=args.d_sae, k=args.k, steps=args.steps))
            folder = build(handle, params, args.out)
    store = load_store(folder)
    if args.feature is not None:
        if not 0 <= args.feature < len(store.features):
            print(f"error: feature {args.feature} out of range (0..{len(store.features) - 1})", file=__import__("sys").stderr)
            return 2
        card = store.features[args.feature]
        print(card.to_json(indent=1) if args.json else _card_text(card))
        return 0
    out: dict[str, Any] = {"folder": str(folder), "meta": store.meta.to_dict(), "summary": store.summary()}
    if args.rank:
        sae, meta = load_sae(folder)
        ranking = rank_dataset(handle, sae, meta, store, store.pairs)
        out["ranking"] = {"roc_auc": ranking.roc_auc, "roc_auc_weighted": ranking.roc_auc_weighted,
                          "precision": ranking.precision, "recall": ranking.recall}
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

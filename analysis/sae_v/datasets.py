"""SAE-V datasets: image-caption pairs that can be regenerated from a seed.

`shapes` (Shapes World, with ground-truth concepts and a corrupted evaluation mix) and `noise`
(random blocks and words: any model, no concepts). Each is a class registered in `DATASETS`
(analysis/registry.py); adding one is one decorated class.
"""
from __future__ import annotations

import random

from analysis import anatomy
from analysis.anatomy import image_token  # noqa: F401  (re-exported by analysis.sae_v)
from analysis.models import ModelHandle
from analysis.registry import Registry, SettingsError
from analysis.sae_v.types import Pair, PairSet
from analysis.tasks import tasks_for


class Dataset:
    name = ""
    label = "no dataset"

    def pairs(self, handle: ModelHandle, n: int, seed: int, corrupted: float) -> PairSet:
        raise NotImplementedError

    def render(self, image_seed: int, size: int):
        raise NotImplementedError

    def prompt(self, handle: ModelHandle, text: str) -> str:
        if handle.kind != "vlm":
            return text
        return anatomy.image_prompt(handle, text)

    def concepts(self, pair: Pair, tokens: list[str], grid: int) -> tuple[list[set], list[set]]:
        """Ground-truth concept sets per text token and per patch; empty when unknown."""
        return [set() for _ in tokens], [set() for _ in range(grid * grid)]


DATASETS: Registry["Dataset"] = Registry("SAE-V dataset")


@DATASETS.register
class NoiseDataset(Dataset):
    """Random coloured blocks with random vocabulary words: works on any model, knows no concepts."""

    name = "noise"
    label = "Random blocks and words (any model)"

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


@DATASETS.register
class ShapesDataset(Dataset):
    """Shapes World scenes with their captions; the evaluation mix comes from `corrupted_pairs`
    (a third clean, a third another scene's caption, a third with swapped attributes).

    Ground truth per position: a caption word carries the attributes its sentence has stated so
    far (position words carry the whole position); an image patch carries the attributes of the
    object whose pixels cover it.
    """

    name = "shapes"
    label = "Shapes World (ground-truth concepts)"
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
        from analysis.zoo import concepts

        return concepts.text_concepts(tokens)

    @staticmethod
    def patch_concepts(image_seed: int | None, grid: int) -> list[set]:
        from analysis.zoo import concepts

        return concepts.patch_concepts(image_seed, grid)


def register_dataset(dataset: type[Dataset] | Dataset) -> None:
    DATASETS.register(dataset if isinstance(dataset, type) else type(dataset))


def dataset_for(name: str) -> Dataset:
    """An instance of the registered dataset `name`; the plain base (no concepts) when unknown."""
    return DATASETS.get(name)() if name in DATASETS else Dataset()


def default_dataset(handle: ModelHandle) -> str:
    """The task provider's pairs: Shapes World for the demo models (ground truth known), random otherwise."""
    return tasks_for(handle).sae_dataset


def make_pairs(handle: ModelHandle, dataset: str, n: int, seed: int, corrupted: float = 0.0) -> PairSet:
    if dataset not in DATASETS:
        raise SettingsError(f"Unknown dataset '{dataset}' (available: {', '.join(DATASETS)}).")
    return dataset_for(dataset).pairs(handle, n, seed, corrupted)

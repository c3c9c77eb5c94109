"""SAE-V datasets: image-caption pairs that can be regenerated from a seed.

- `shapes`: Shapes World scenes with the zoo's captions (ground-truth concepts; a corrupted evaluation
  mix: another scene's caption, swapped attributes);
- `scenes`: the same scenes with plain-English captions, for any model: a third of the evaluation pairs
  clean, a third with another scene's caption, a third with one colour word swapped, so every pair
  flagged as corrupted really is;
- `noise`: random blocks and vocabulary words (any model). It has **no labels**: no pair is corrupted,
  so no ROC, precision or recall is measured on it.

Each is a class registered in `DATASETS`; adding one is one decorated class. `render_pair` draws a
generated pair's image (a user's pairs are read by `userdata.py`).
"""
from __future__ import annotations

import random

from analysis.model_access.anatomy import image_token  # noqa: F401  (re-exported by analysis.sae_v)
from analysis.model_access.models import ModelHandle
from analysis.framework.registry import Registry, SettingsError
from analysis.sae_v.types import Pair, PairSet
from analysis.tasks import tasks_for


class Dataset:
    name = ""
    label = "no dataset"
    has_labels = True  # whether its evaluation pairs say which are corrupted

    def pairs(self, handle: ModelHandle, n: int, seed: int, corrupted: float) -> PairSet:
        raise NotImplementedError

    def render(self, image_seed: int, size: int):
        raise NotImplementedError

    def concepts(self, pair: Pair, tokens: list[str], grid: int) -> tuple[list[set], list[set]]:
        """Ground-truth concept sets per text token and per patch; empty when unknown."""
        return [set() for _ in tokens], [set() for _ in range(grid * grid)]


DATASETS: Registry["Dataset"] = Registry("SAE-V dataset")


@DATASETS.register
class NoiseDataset(Dataset):
    """Random coloured blocks with random vocabulary words: works on any model, knows no concepts and has
    no corrupted pairs (nothing to separate)."""

    name = "noise"
    label = "Random blocks and words (any model; no labels)"
    has_labels = False

    def pairs(self, handle, n, seed, corrupted=0.0):
        rng = random.Random(seed)
        words = _plain_words(handle.tokenizer)
        size = handle.info.image_size if handle.kind == "vlm" else None
        out = []
        for i in range(n):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(4, 8)))
            rng.random()  # once a random "corrupted" flag; still drawn, so a seed gives the pairs it always gave
            out.append(Pair(text=text, image_seed=seed * 100_003 + i if size else None, kind="unlabelled"))
        return PairSet(dataset=self.name, seed=seed, image_size=size, pairs=out, labelled=False)

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

    Ground truth per position: a caption word carries the attributes its sentence has stated so far
    (position words carry the whole position); an image patch carries the attributes of the object
    whose pixels cover it.
    """

    name = "shapes"
    label = "Shapes World (ground-truth concepts)"
    TRAIN_BASE = 10_000_000  # the zoo's validation split: scenes the VLM was not trained on
    EVAL_BASE = 20_000  # corrupted_pairs(seed) draws scenes from seed * 1000: the test split

    def pairs(self, handle, n, seed, corrupted=0.0):
        from analysis.world import shapes_world as sw

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
        from analysis.world import shapes_world as sw

        return sw.render(sw.generate_scene(image_seed), size)

    def concepts(self, pair, tokens, grid):
        return self.text_concepts(tokens), self.patch_concepts(pair.image_seed, grid)

    @staticmethod
    def text_concepts(tokens: list[str]) -> list[set]:
        from analysis.world import concepts

        return concepts.text_concepts(tokens)

    @staticmethod
    def patch_concepts(image_seed: int | None, grid: int) -> list[set]:
        from analysis.world import concepts

        return concepts.patch_concepts(image_seed, grid)


PLACES = {"center": "in the center"}  # every other position reads "at the <position>"


def english_caption(scene) -> str:
    """A plain-English caption of a Shapes World scene: 'A picture of a large red circle at the top left and a
    small blue square in the center' (objects in reading order, no punctuation)."""
    parts = [f"a {o.size} {o.colour} {o.shape} {PLACES.get(o.position, 'at the ' + o.position)}"
             for o in sorted(scene.objects, key=lambda o: o.cell)]
    return "A picture of " + " and ".join(parts)


def swap_colour_word(scene, rng: random.Random) -> str:
    """The caption of `scene` with one object's colour word replaced by another colour: always false (that
    object, at that place, has the first colour)."""
    from analysis.world import shapes_world as sw

    objs = sorted(scene.objects, key=lambda o: o.cell)
    target = rng.randrange(len(objs))
    new = rng.choice([c for c in sw.COLOURS if c != objs[target].colour])
    parts = [f"a {o.size} {new if i == target else o.colour} {o.shape} "
             f"{PLACES.get(o.position, 'at the ' + o.position)}" for i, o in enumerate(objs)]
    return "A picture of " + " and ".join(parts)


@DATASETS.register
class ScenesDataset(Dataset):
    """Shapes World scenes as images with plain-English captions, for any model. Its evaluation pairs are
    a third clean, a third another scene's caption and a third with one colour word swapped: every pair
    flagged as corrupted really is (checked in tests/model/test_sae_data.py)."""

    name = "scenes"
    label = "Scenes with English captions (any model; real corrupted pairs)"
    TRAIN_BASE = 10_000_000  # validation-split scenes
    EVAL_BASE = 20_500_000  # test-split scenes

    @staticmethod
    def vocabulary() -> list[str]:
        """Every word its captions use (a word-level test tokenizer needs them)."""
        from analysis.world import shapes_world as sw

        words = ["A", "picture", "of", "a", "and", "at", "the", "in"] + list(sw.SIZES + sw.COLOURS + sw.SHAPES)
        return list(dict.fromkeys(words + list(sw.POSITION_WORDS)))

    def pairs(self, handle, n, seed, corrupted=0.0):
        from analysis.world import shapes_world as sw

        size = handle.info.image_size if handle.kind == "vlm" else None
        rng = random.Random(f"scenes-{seed}")
        base = (self.EVAL_BASE if corrupted > 0 else self.TRAIN_BASE) + seed * 10_000
        out = []
        for i in range(n):
            scene = sw.generate_scene(base + i)
            kind = ("clean", "other_scene", "colour_word")[i % 3] if corrupted > 0 else "clean"
            text = english_caption(scene)
            if kind == "other_scene":
                j = 1
                while english_caption(sw.generate_scene(base + n + 7 * i + j)) == text:
                    j += 1
                text = english_caption(sw.generate_scene(base + n + 7 * i + j))
            elif kind == "colour_word":
                text = swap_colour_word(scene, rng)
            out.append(Pair(text=text, image_seed=scene.seed if size else None, corrupted=kind != "clean", kind=kind))
        return PairSet(dataset=self.name, seed=seed, image_size=size, pairs=out)

    def render(self, image_seed, size):
        from analysis.world import shapes_world as sw

        return sw.render(sw.generate_scene(image_seed), size)

    def concepts(self, pair, tokens, grid):
        return english_concepts(tokens), ShapesDataset.patch_concepts(pair.image_seed, grid)


def english_concepts(tokens: list[str]) -> list[set]:
    """Per token of an English scene caption: the attributes its object has stated so far ('and' starts
    the next object). Sub-word markers (Ġ, ▁) are ignored; a word split into pieces carries none."""
    from analysis.world import shapes_world as sw

    out, stated = [], set()
    for token in tokens:
        word = token.replace("Ġ", "").replace("▁", "").strip().lower()
        if word == "and":
            stated = set()
        for kind, values in (("colour", sw.COLOURS), ("shape", sw.SHAPES), ("size", sw.SIZES)):
            if word in values:
                stated.add(f"{kind}:{word}")
        out.append(set(stated))
    return out


def register_dataset(dataset: type[Dataset] | Dataset) -> None:
    DATASETS.register(dataset if isinstance(dataset, type) else type(dataset))


def dataset_for(name: str) -> Dataset:
    """An instance of the registered dataset `name`; the plain base (no concepts) when unknown."""
    return DATASETS.get(name)() if name in DATASETS else Dataset()


def default_dataset(handle: ModelHandle) -> str:
    """The task provider's pairs: Shapes World for the demo models (ground truth known), English scene
    captions with real corrupted pairs otherwise."""
    return tasks_for(handle).sae_dataset


def make_pairs(handle: ModelHandle, dataset: str, n: int, seed: int, corrupted: float = 0.0) -> PairSet:
    if dataset not in DATASETS:
        raise SettingsError(f"Unknown dataset '{dataset}' (available: {', '.join(DATASETS)}).")
    return dataset_for(dataset).pairs(handle, n, seed, corrupted)


def render_pair(pairs: PairSet, i: int):
    """The image of pair `i` of a generated pair set (None for a text-only one). A user's pairs are read
    from their files by `userdata.pair_image`."""
    pair = pairs.pairs[i]
    if pair.image_seed is None or pairs.image_size is None:
        return None
    return dataset_for(pairs.dataset).render(pair.image_seed, pairs.image_size)

"""Held-out metrics of the demo zoo and the model cards written from them.

Every metric is computed on seeds the training never saw (the "test" split for scenes, a
separately named random stream for the number tasks), so a card is a measurement, not a claim.
Multi-token answers are scored by greedy exact match, computed in one teacher-forced forward:
greedy decoding reproduces the target exactly iff every target token (and the final "</s>") is the
argmax given the target prefix.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from analysis.zoo import shapes_world as sw

Progress = Callable[[float, str], None]
MAX_NS = (4, 8, 16, 32, 64, 128)
NEEDLE_LENGTHS = (64, 128, 256, 512, 1024)
NEEDLE_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
FULL = {"max": 200, "needle": 100, "depth": 100, "decompose": 200, "rewrite": 200, "yesno_scenes": 300,
        "captions": 200}
QUICK = {k: 8 for k in FULL}


@dataclass
class Card:
    name: str
    architecture: str
    parameters: int
    metrics: dict
    samples: dict
    training: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _load(folder: Path):
    from analysis.models import ModelSpec, load_model

    return load_model(ModelSpec("local", str(folder)))


def _batches(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


# ---------------------------------------------------------------------------------------------
# shapes-lm


def lm_answer_accuracy(handle, pairs: list[tuple[str, str]], batch: int = 50) -> float:
    """Share of (prompt, answer) pairs whose whole answer (+ "</s>") greedy decoding reproduces."""
    from analysis.zoo.train import collate, shifted_loss

    tok, model = handle.tokenizer, handle.language_model
    right = 0.0
    with handle.session():
        for chunk in _batches(pairs, batch):
            ids, mask, labels = collate(tok, chunk)
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            right += shifted_loss(logits, labels)[1].sum().item()
    return right / len(pairs)


def lm_first_token_accuracy(handle, pairs: list[tuple[str, str]], batch: int = 50) -> float:
    """Share of single-word answers that are the argmax next token after the prompt."""
    from analysis.zoo.train import collate

    tok, model = handle.tokenizer, handle.language_model
    right = 0
    with handle.session():
        for chunk in _batches(pairs, batch):
            ids, mask, labels = collate(tok, chunk, eos=False)
            logits = model(input_ids=ids, attention_mask=mask).logits
            last = mask.sum(1) - 2  # position predicting the answer word
            pred = logits[torch.arange(len(chunk)), last].argmax(-1)
            gold = ids[torch.arange(len(chunk)), last + 1]
            right += (pred == gold).sum().item()
    return right / len(pairs)


def max_pairs(n: int, k: int) -> list[tuple[str, str]]:
    rng = random.Random(f"eval-max-{n}")
    return [sw.max_retrieval_example(rng, n) for _ in range(k)]


def needle_pairs(length: int, k: int, depth: float | None = None, n_needles: int = 4) -> list[tuple[str, str]]:
    rng = random.Random(f"eval-needle-{length}-{depth}")
    out = []
    for _ in range(k):
        if depth is None:
            out.append(sw.needle_example(rng, length, n_needles)[:2])
        else:  # the queried needle sits at `depth`; the others are spread at random
            depths = [depth] + [rng.random() for _ in range(n_needles - 1)]
            out.append(sw.needle_example(rng, length, n_needles, depths=depths, query=0)[:2])
    return out


def decompose_pairs(k: int) -> list[tuple[str, str]]:
    rng = random.Random("eval-decompose")
    out = []
    for i, seed in enumerate(sw.split_seeds("test", k)):
        scene = sw.generate_scene(seed)
        out.append(sw.decompose_example(sw.hallucinate(scene, rng) if i % 2 else scene))
    return out


def rewrite_pairs(k: int) -> list[tuple[str, str]]:
    rng = random.Random("eval-rewrite")
    return [sw.rewrite_example(sw.generate_scene(seed), rng) for seed in sw.split_seeds("test", k)]


def evaluate_lm(handle, sizes: dict, progress: Progress | None = None) -> dict:
    metrics: dict = {"max_retrieval": {}, "needle_by_length": {}, "needle_by_depth_256": {}}
    for n in MAX_NS:
        metrics["max_retrieval"][str(n)] = lm_first_token_accuracy(handle, max_pairs(n, sizes["max"]))
    if progress:
        progress(0.3, f"max retrieval {metrics['max_retrieval']}")
    for length in NEEDLE_LENGTHS:
        if length <= handle.info.max_positions:
            pairs = needle_pairs(length, sizes["needle"])
            metrics["needle_by_length"][str(length)] = lm_first_token_accuracy(handle, pairs, batch=25)
    if progress:
        progress(0.6, f"needle {metrics['needle_by_length']}")
    for depth in NEEDLE_DEPTHS:
        pairs = needle_pairs(256, sizes["depth"], depth=depth)
        metrics["needle_by_depth_256"][str(depth)] = lm_first_token_accuracy(handle, pairs, batch=25)
    metrics["decomposition_exact"] = lm_answer_accuracy(handle, decompose_pairs(sizes["decompose"]))
    metrics["rewrite_exact"] = lm_answer_accuracy(handle, rewrite_pairs(sizes["rewrite"]))
    if progress:
        progress(1.0, f"decompose {metrics['decomposition_exact']:.3f} rewrite {metrics['rewrite_exact']:.3f}")
    return metrics


# ---------------------------------------------------------------------------------------------
# shapes-vlm


def _pixels(handle, scenes: list[sw.Scene]) -> torch.Tensor:
    size = handle.info.image_size
    images = [sw.render(s, size) for s in scenes]
    return handle.processor.image_processor(images=images, return_tensors="pt")["pixel_values"]


def _prompt_ids(handle, prompt: str) -> list[int]:
    from analysis.zoo.train import vlm_ids

    return vlm_ids(handle.tokenizer, prompt, handle.info.image_tokens)


def yes_no_probabilities(handle, scene: sw.Scene, claims: list[str]) -> list[tuple[float, float]]:
    """(p_yes, p_no) from the next-token distribution after each claim's question prompt."""
    tok = handle.tokenizer
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    rows = [_prompt_ids(handle, sw.vlm_question_prompt(c)) for c in claims]
    width = max(map(len, rows))
    # Right padding: positions then match an unpadded prompt; read each row at its last real token.
    ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    lengths = torch.tensor([len(r) for r in rows])
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    pixels = _pixels(handle, [scene]).expand(len(rows), -1, -1, -1)
    with handle.session():
        logits = handle.model(input_ids=ids, attention_mask=mask, pixel_values=pixels).logits
    probs = logits[torch.arange(len(rows)), lengths - 1].float().softmax(-1)
    return [(probs[i, yes].item(), probs[i, no].item()) for i in range(len(rows))]


def generate_captions(handle, scenes: list[sw.Scene], max_new_tokens: int = 64, batch: int = 25) -> list[str]:
    """Greedy captions (the prompt is the same for every image, so no padding is needed)."""
    tok = handle.tokenizer
    prompt = _prompt_ids(handle, sw.VLM_CAPTION_PROMPT)
    out: list[str] = []
    for chunk in _batches(scenes, batch):
        ids = torch.tensor([prompt] * len(chunk))
        with handle.session():
            gen = handle.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=_pixels(handle, chunk),
                max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
        out += tok.batch_decode(gen[:, ids.shape[1]:], skip_special_tokens=True)
    return [sw.normalize(t) for t in out]


def evaluate_vlm(handle, sizes: dict, progress: Progress | None = None) -> dict:
    rng = random.Random("eval-yesno")
    right = total = 0
    by_kind: dict[str, list[int]] = {}
    for seed in sw.split_seeds("test", sizes["yesno_scenes"]):
        scene = sw.generate_scene(seed)
        claims = sw.question_set(scene, rng, 2)
        for claim, (p_yes, p_no) in zip(claims, yes_no_probabilities(handle, scene, [c.text for c in claims])):
            ok = (p_yes > p_no) == claim.truth
            right += ok
            total += 1
            by_kind.setdefault(claim.kind, [0, 0])
            by_kind[claim.kind][0] += ok
            by_kind[claim.kind][1] += 1
    if progress:
        progress(0.5, f"yes/no accuracy {right / total:.3f}")
    scenes = [sw.generate_scene(s) for s in sw.split_seeds("test", sizes["captions"])]
    captions = generate_captions(handle, scenes)
    scores = caption_scores(scenes, captions)
    metrics = {
        "yes_no_accuracy": right / total,
        "yes_no_accuracy_by_kind": {k: v[0] / v[1] for k, v in sorted(by_kind.items())},
        "caption_factuality": scores["factuality"],
        "caption_coverage": scores["coverage"],
        "caption_exact": scores["exact"],
        "chair_object_hallucination": scores["chair"],
        "example_captions": [
            {"seed": s.seed, "truth": sw.caption(s), "generated": t} for s, t in list(zip(scenes, captions))[:3]
        ],
    }
    if progress:
        progress(1.0, f"factuality {metrics['caption_factuality']:.3f} coverage {metrics['caption_coverage']:.3f}")
    return metrics


def caption_scores(scenes: list, captions: list[str]) -> dict[str, float]:
    """Factuality and coverage pooled over all captions' claims, exact-match rate and CHAIR_i."""
    n_claims = n_true = n_stated = n_facts = exact = objects = false_objects = 0
    for scene, text in zip(scenes, captions):
        claims = sw.caption_claims(scene, text)
        facts = {c.text for c in sw.scene_facts(scene)}
        n_claims += len(claims)
        n_true += sum(c.truth for c in claims)
        n_stated += len({c.text for c in claims if c.truth} & facts)
        n_facts += len(facts)
        exact += text == sw.caption(scene)
        existence = [c for c in claims if c.kind == "existence"]
        objects += len(existence)
        false_objects += sum(not c.truth for c in existence)
    return {"factuality": n_true / max(1, n_claims), "coverage": n_stated / max(1, n_facts),
            "exact": exact / max(1, len(scenes)), "chair": false_objects / max(1, objects)}


# ---------------------------------------------------------------------------------------------
# Cards


def evaluate(name: str, folder: Path, quick: bool = False, progress: Progress | None = None) -> Card:
    handle = _load(folder)
    sizes = QUICK if quick else FULL
    if handle.kind == "vlm":
        metrics = evaluate_vlm(handle, sizes, progress)
        samples = {"yes_no_questions": sizes["yesno_scenes"] * 2, "captions": sizes["captions"]}
    else:
        metrics = evaluate_lm(handle, sizes, progress)
        samples = {k: sizes[k] for k in ("max", "needle", "depth", "decompose", "rewrite")}
    training_file = folder / "training.json"
    training = json.loads(training_file.read_text()) if training_file.is_file() else {}
    return Card(name=name, architecture=handle.info.architecture, parameters=handle.info.parameters,
                metrics=metrics, samples=samples, training=training)


def write_card(card: Card, folder: Path) -> None:
    from dataclasses import asdict

    (folder / "card.json").write_text(json.dumps(asdict(card), indent=2) + "\n")
    (folder / "card.md").write_text(card_markdown(card) + "\n")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def card_markdown(card: Card) -> str:
    m = card.metrics
    lines = [f"### {card.name}", "",
             f"`{card.architecture}`, {card.parameters:,} parameters. Held-out metrics measured by "
             f"`python -m analysis.zoo eval` (samples: {', '.join(f'{k} {v}' for k, v in card.samples.items())}).", ""]
    if "max_retrieval" in m:
        lines += ["| max retrieval, n items | " + " | ".join(m["max_retrieval"]) + " |",
                  "|---" * (len(m["max_retrieval"]) + 1) + "|",
                  "| accuracy | " + " | ".join(_pct(v) for v in m["max_retrieval"].values()) + " |", "",
                  "| needle recall (4 needles), context tokens | " + " | ".join(m["needle_by_length"]) + " |",
                  "|---" * (len(m["needle_by_length"]) + 1) + "|",
                  "| accuracy | " + " | ".join(_pct(v) for v in m["needle_by_length"].values()) + " |", "",
                  "| needle depth (256 tokens) | " + " | ".join(m["needle_by_depth_256"]) + " |",
                  "|---" * (len(m["needle_by_depth_256"]) + 1) + "|",
                  "| accuracy | " + " | ".join(_pct(v) for v in m["needle_by_depth_256"].values()) + " |", "",
                  f"Decomposition exact match {_pct(m['decomposition_exact'])}; "
                  f"rewrite exact match {_pct(m['rewrite_exact'])}."]
    else:
        kinds = ", ".join(f"{k} {_pct(v)}" for k, v in m["yes_no_accuracy_by_kind"].items())
        lines += ["| metric | value |", "|---|---|",
                  f"| yes/no claim accuracy (balanced) | {_pct(m['yes_no_accuracy'])} ({kinds}) |",
                  f"| caption factuality (share of caption claims true) | {_pct(m['caption_factuality'])} |",
                  f"| caption coverage (share of scene facts stated) | {_pct(m['caption_coverage'])} |",
                  f"| caption exact match | {_pct(m['caption_exact'])} |",
                  f"| CHAIR object hallucination | {_pct(m['chair_object_hallucination'])} |"]
    lines += [f"- {n}" for n in card.notes]
    return "\n".join(lines)

"""The demo zoo's training recipe: configs, tokenizers, batching and the loss every model shares."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from analysis.world import shapes_world as sw
from analysis.world.tokenizer import make_word_tokenizer

IMAGE_TOKEN = "<image>"


@dataclass
class LMConfig:
    layers: int = 4
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    max_positions: int = 1024
    steps: int = 4000
    lr: float = 2.5e-3
    warmup: int = 50
    batch: int = 32
    text_batch: int = 16  # decomposition / rewrite rows per step
    needle_batch: int = 16
    max_n: int = 16  # max retrieval trained on n <= max_n only
    # needle curriculum: (needles, length) stages, advance when the running accuracy passes 0.9
    needle_stages: tuple = ((1, 32), (2, 64), (4, 64), (4, 128), (4, 256))
    needle_final_lengths: tuple = (128, 384)
    seed: int = 0
    # Threads per phase are part of the recipe (a different count changes the float sums, so the weights):
    # phases 1-4 run on one thread beside shapes-vlm's one-thread build, which ends about when phase 4
    # does; phases from `late_phase` on use `late_threads` (1.64x faster per step on 2 cores, measured).
    late_phase: int = 5
    late_threads: int = 2


@dataclass
class VLMConfig:
    image_size: int = 63
    patch: int = 21  # one patch per cell of the 3x3 grid: 9 image tokens, each holding at most one object
    vision_hidden: int = 128
    vision_layers: int = 2
    hidden: int = 128
    layers: int = 3
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    vision_steps: int = 400  # patch-attribute and scene-table pretraining of the vision tower (see pretrain_vision)
    vision_batch: int = 64
    vision_lr: float = 1e-3
    vision_lr_scale: float = 0.3  # the pretrained tower then trains slower than the rest
    steps: int = 600  # phase 1: captions only
    batch_captions: int = 32
    weak_step: int = 300  # the phase-1 checkpoint saved as shapes-vlm-weak (its captions hallucinate)
    lr: float = 1e-3
    warmup: int = 50
    seed: int = 0


SMOKE_LM = LMConfig(layers=1, hidden=32, intermediate=64, steps=6, batch=4, text_batch=2, needle_batch=2,
                    needle_stages=((1, 32),), needle_final_lengths=(32, 48), max_positions=256,
                    late_phase=2)  # so the smoke build switches threads too
SMOKE_VLM = VLMConfig(vision_hidden=32, hidden=32, layers=1, vision_layers=1, intermediate=64, steps=4,
                      weak_step=2, batch_captions=2, vision_steps=2, vision_batch=2)


def lm_tokenizer():
    return make_word_tokenizer(list(sw.VOCAB))


def vlm_tokenizer():
    return make_word_tokenizer(list(sw.VOCAB), extra_special=[IMAGE_TOKEN])


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def lr_schedule(step: int, steps: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def collate(tok, pairs: list, eos: bool = True):
    """Examples -> right-padded input_ids, attention_mask, labels (loss on answer tokens only).

    An example is (prompt, answer) or a list of (text, is_answer) segments; "</s>" ends the last answer.
    """
    rows, labels = [], []
    for example in pairs:
        segments = [(example[0], False), (example[1], True)] if isinstance(example, tuple) else example
        row: list[int] = []
        lab: list[int] = []
        for text, is_answer in segments:
            ids = encode(tok, text)
            row += ids
            lab += ids if is_answer else [-100] * len(ids)
        if eos:
            row.append(tok.eos_token_id)
            lab.append(tok.eos_token_id)
        rows.append(row)
        labels.append(lab)
    width = max(map(len, rows))
    pad = tok.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return ids, mask, lab


def needle_training_example(rng: random.Random, length: int, n_needles: int) -> list[tuple[str, bool]]:
    """A needle prompt whose needles are then all asked in turn: "... query k2 = 57 query k0 = 9"."""
    prompt, answer, _ = sw.needle_example(rng, length, n_needles)
    words = prompt.split()
    body = words[:-3]
    values = {w: body[i + 1] for i, w in enumerate(body[:-1]) if w in sw.KEYS}
    order = [k for k in values if k != words[-2]]
    rng.shuffle(order)
    segments = [(prompt, False), (answer, True)]
    for key in order:
        segments += [(f"query {key} =", False), (values[key], True)]
    return segments


def shifted_loss(logits, labels):
    """Next-token loss and per-row 'every answer token right' (teacher forcing == greedy exact match)."""
    logits, labels = logits[:, :-1], labels[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    with torch.no_grad():
        right = (logits.argmax(-1) == labels) | (labels == -100)
        exact = right.all(dim=1).float()
    return loss, exact

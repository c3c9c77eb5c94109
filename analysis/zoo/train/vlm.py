"""Training shapes-vlm and the weak captioner shapes-vlm-weak: vision pretraining, caption and yes/no phases, grounding."""
from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from analysis.framework.progress import Progress
from analysis.world import shapes_world as sw
from analysis.zoo.train.common import (
    IMAGE_TOKEN, VLMConfig, collate, encode, lr_schedule, shifted_loss, vlm_tokenizer,
)

# ---------------------------------------------------------------------------------------------
# shapes-vlm


def build_vlm(cfg: VLMConfig, tok):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(cfg.seed)
    vision = CLIPVisionConfig(
        image_size=cfg.image_size, patch_size=cfg.patch, hidden_size=cfg.vision_hidden,
        intermediate_size=cfg.vision_hidden * 2, num_hidden_layers=cfg.vision_layers, num_attention_heads=4,
        projection_dim=cfg.vision_hidden,
    )
    text = LlamaConfig(
        vocab_size=len(tok), hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=512, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, tie_word_embeddings=False,
    )
    config = LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="default", vision_feature_layer=-1, attn_implementation="eager",
    )
    return LlavaForConditionalGeneration(config)


def make_processor(cfg: VLMConfig, tok):
    from transformers import CLIPImageProcessor, LlavaProcessor

    image_processor = CLIPImageProcessor(
        size={"shortest_edge": cfg.image_size}, crop_size={"height": cfg.image_size, "width": cfg.image_size},
    )
    return LlavaProcessor(
        image_processor=image_processor, tokenizer=tok, patch_size=cfg.patch,
        vision_feature_select_strategy="default", num_additional_image_tokens=1, image_token=IMAGE_TOKEN,
    )


def pixel_tensor(images, processor) -> torch.Tensor:
    """Same normalisation as the CLIP image processor (images are already image_size square)."""
    import numpy as np

    ip = processor.image_processor
    arr = torch.from_numpy(np.stack([np.asarray(im, dtype=np.float32) for im in images])) / 255.0
    mean, std = torch.tensor(ip.image_mean), torch.tensor(ip.image_std)
    return ((arr - mean) / std).permute(0, 3, 1, 2).contiguous()


def vlm_ids(tok, prompt: str, n_image_tokens: int) -> list[int]:
    ids = encode(tok, prompt)
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    out: list[int] = []
    for i in ids:
        out += [image_id] * n_image_tokens if i == image_id else [i]
    return out


def vlm_collate(tok, n_image_tokens: int, examples: list):
    """Like `collate`, with "<image>" expanded to the image tokens."""
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    ids, mask, labels = collate(tok, examples)
    rows = []
    for r in range(ids.shape[0]):
        row, lab = [], []
        for i, l in zip(ids[r].tolist(), labels[r].tolist()):
            n = n_image_tokens if i == image_id else 1
            row += [i] * n
            lab += [l] * n
        rows.append((row, lab, int(mask[r].sum()) + (n_image_tokens - 1) * row.count(image_id) // n_image_tokens))
    width = max(len(r) for r, _, _ in rows)
    out_ids = torch.full((len(rows), width), tok.pad_token_id)
    out_mask = torch.zeros((len(rows), width), dtype=torch.long)
    out_lab = torch.full((len(rows), width), -100)
    for k, (row, lab, length) in enumerate(rows):
        out_ids[k, :len(row)] = torch.tensor(row)
        out_lab[k, :len(lab)] = torch.tensor(lab)
        out_mask[k, :length] = 1
    return out_ids, out_mask, out_lab


def shuffled_caption(scene: sw.Scene, rng: random.Random) -> str:
    """The caption's sentences in random order. After "there is a large red circle at the" the
    position can then only come from finding the red circle in the image by content (in reading
    order it follows from the previous sentence), which is the lookup yes/no questions need."""
    objs = list(scene.objects)
    rng.shuffle(objs)
    return sw.caption(scene, objs)


def yes_no_example(scene: sw.Scene, rng: random.Random, existence: float = 0.0) -> tuple[str, str]:
    """One balanced yes/no question (the exact inference prompt). With probability `existence` it
    is an existence question (half about a present object, half about an absent one)."""
    if rng.random() < existence:
        if rng.random() < 0.5:
            obj = rng.choice(scene.objects)
            return sw.vlm_question_prompt(sw.existence_claim(obj.colour, obj.shape)), sw.vlm_answer(True)
        colour, shape = rng.choice([(c, s) for c in sw.COLOURS for s in sw.SHAPES if scene.find(c, s) is None])
        return sw.vlm_question_prompt(sw.existence_claim(colour, shape)), sw.vlm_answer(False)
    claim = sw.question_set(scene, rng, 1)[0]
    return sw.vlm_question_prompt(claim.text), sw.vlm_answer(claim.truth)


def vlm_batch(rows: "VLMRows", rng: random.Random, seeds, processor, image_size: int, n_image_tokens: int,
              scenes: list | None = None):
    """Caption rows for some scenes, one yes/no question each for others (one scene per row); the
    scenes are appended to `scenes` when given."""
    tok = processor.tokenizer
    images, examples = [], []
    scenes = [] if scenes is None else scenes
    for _ in range(rows.captions):
        scene = sw.generate_scene(next(seeds))
        scenes.append(scene)
        images.append(sw.render(scene, image_size))
        text = shuffled_caption(scene, rng) if rows.shuffle else sw.caption(scene)
        examples.append((sw.VLM_CAPTION_PROMPT, text))
    for _ in range(rows.questions):
        scene = sw.generate_scene(next(seeds))
        scenes.append(scene)
        images.append(sw.render(scene, image_size))
        examples.append(yes_no_example(scene, rng, rows.existence))
    ids, mask, labels = vlm_collate(tok, n_image_tokens, examples)
    return pixel_tensor(images, processor), ids, mask, labels


def patch_labels(scene: sw.Scene, image_size: int, patch: int) -> torch.Tensor:
    """(patches, 4) targets per patch, row-major: colour, shape, size, cell (0 = no object there).

    A patch belongs to the object covering most of its pixels, if that is at least 6 pixels.
    """
    mask = sw.object_mask(scene, image_size)
    grid = image_size // patch
    out = torch.zeros(grid * grid, 4, dtype=torch.long)
    for k in range(grid * grid):
        r, c = divmod(k, grid)
        block = mask[r * patch:(r + 1) * patch, c * patch:(c + 1) * patch].ravel()
        counts = [(block == i + 1).sum() for i in range(len(scene.objects))]
        if counts and max(counts) >= 6:
            o = scene.objects[max(range(len(counts)), key=counts.__getitem__)]
            out[k] = torch.tensor([1 + sw.COLOURS.index(o.colour), 1 + sw.SHAPES.index(o.shape),
                                   1 + sw.SIZES.index(o.size), 1 + o.cell])
    return out


COMBOS = tuple((c, s) for c in sw.COLOURS for s in sw.SHAPES)
TABLE_FIELDS = 2 + len(sw.POSITIONS)  # per pair: present, large, one-hot cell


def scene_table(scene: sw.Scene) -> torch.Tensor:
    """(12 * TABLE_FIELDS,) bits: per (colour, shape) pair, present / large / one-hot cell (zeros if absent)."""
    out = torch.zeros(len(COMBOS), TABLE_FIELDS)
    for o in scene.objects:
        k = COMBOS.index((o.colour, o.shape))
        out[k, 0] = 1.0
        out[k, 1] = float(o.size == "large")
        out[k, 2 + o.cell] = 1.0
    return out.reshape(-1)


def pretrain_vision(model, cfg: VLMConfig, processor, progress: Progress | None = None) -> dict:
    """Pretrain the vision tower, as CLIP towers are pretrained before LLaVA training, with linear
    probes on the features LLaVA reads (last hidden state), thrown away afterwards:

    - per patch, what lies in it (colour, shape, size, cell);
    - from every patch, the whole scene as a table (`scene_table`): which (colour, shape) pairs are
      present, their sizes and cells.

    Measured: trained from scratch inside LLaVA the tower stayed unused; with the per-patch probes
    alone the LM learned to caption, but yes/no existence stayed at chance for 2,500+ steps (the
    answer needs a sharp conjunctive lookup over patches, which did not train on CPU). With the
    scene table in every patch, existence accuracy passed 0.9 within 1,000 question steps."""
    tower = model.model.vision_tower
    sizes = (1 + len(sw.COLOURS), 1 + len(sw.SHAPES), 1 + len(sw.SIZES), 10)
    table = len(COMBOS) * TABLE_FIELDS
    heads = torch.nn.Linear(cfg.vision_hidden, sum(sizes) + table)
    params = list(tower.parameters()) + list(heads.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.vision_lr, weight_decay=0.01, betas=(0.9, 0.98))
    seeds = iter(sw.split_seeds("train", sw.SPLIT_SIZE)[8_000_000:])
    acc = table_acc = 0.0
    start = time.time()
    for step in range(cfg.vision_steps):
        scenes = [sw.generate_scene(next(seeds)) for _ in range(cfg.vision_batch)]
        pixels = pixel_tensor([sw.render(s, cfg.image_size) for s in scenes], processor)
        labels = torch.stack([patch_labels(s, cfg.image_size, cfg.patch) for s in scenes])
        tables = torch.stack([scene_table(s) for s in scenes])
        for g in opt.param_groups:
            g["lr"] = cfg.vision_lr * lr_schedule(step, cfg.vision_steps, 20)
        feats = tower(pixels, output_hidden_states=True).hidden_states[cfg_feature_layer(model)][:, 1:]
        out = heads(feats)
        logits = out[..., :sum(sizes)].split(sizes, dim=-1)
        table_logits = out[..., sum(sizes):]
        targets = tables[:, None].expand_as(table_logits)
        loss = sum(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), labels[..., i].reshape(-1))
                   for i, lg in enumerate(logits))
        loss = loss + F.binary_cross_entropy_with_logits(table_logits, targets) * 10
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            right = torch.stack([lg.argmax(-1) == labels[..., i] for i, lg in enumerate(logits)], -1).all(-1)
            acc = 0.9 * acc + 0.1 * right.float().mean().item()
            present = (table_logits.unflatten(-1, (len(COMBOS), TABLE_FIELDS))[..., 0] > 0) == (
                targets.unflatten(-1, (len(COMBOS), TABLE_FIELDS))[..., 0] > 0.5)
            table_acc = 0.9 * table_acc + 0.1 * present.float().mean().item()
        if progress and (step % 25 == 0 or step == cfg.vision_steps - 1):
            progress((step + 1) / cfg.vision_steps, f"shapes-vlm vision pretraining step {step + 1}/"
                     f"{cfg.vision_steps} loss {loss.item():.3f} patch accuracy {acc:.3f} scene table presence "
                     f"accuracy {table_acc:.3f} {time.time() - start:.0f}s")
    return {"steps": cfg.vision_steps, "patch_accuracy": round(acc, 4),
            "scene_table_presence_accuracy": round(table_acc, 4), "seconds": round(time.time() - start, 1)}


def cfg_feature_layer(model) -> int:
    return int(model.config.vision_feature_layer)


@dataclass
class VLMRows:
    """What one training step holds: caption rows (canonical or shuffled order) and question rows."""

    captions: int
    questions: int = 0
    shuffle: bool = False
    existence: float = 0.0  # share of questions forced to be existence questions


@dataclass
class VLMPhase2:
    """A phase after the caption-only phase 1: shuffled-order captions plus single yes/no questions.

    Measured on CPU (val split, 300 questions): after phase 1 the model captions almost perfectly,
    but 2,000 steps of canonical captions + questions left yes/no at chance. A balanced yes/no answer
    depends on the question and the image only jointly (each alone says nothing), so the gradient
    has no first-order signal to start from; shuffled captions supply one (see `shuffled_caption`),
    and size/position answers then climbed to about 0.8 within 5,000 steps. The last phase goes back
    to captions in reading order (the format `caption` and the decomposer expect)."""

    steps: int = 4000
    lr: float = 1e-3
    warmup: int = 50
    batch_captions: int = 8
    batch_questions: int = 24
    shuffle: bool = True
    existence: float = 0.0
    seed: int = 3


@dataclass
class GroundingPhase(VLMPhase2):
    """Captions and questions plus a grounding loss that puts each object's image token where the
    caption puts the object, in the LM's own residual stream (issue 15).

    After decoder layer `layer`, the image token of the cell an object occupies is pulled (relative
    squared error, the text side detached) towards the residual of the last word of the caption
    sentence that describes that object ("... large red circle at the top left"), the word that
    has read the object's size, colour, shape and position; every other image token is only held at
    the mean norm of the caption's text tokens, so neither modality's tokens are systematically
    longer (SAE-V counts a feature's 30 *strongest* tokens, so a longer modality would win them
    all). Measured before this phase, shapes-vlm's image tokens were 3.5x longer than its text
    tokens and shared almost no SAE features with them (docs/readme_zoo.md)."""

    weight: float = 5.0
    layer: int = 1


# Phase 4 (run on the phase-3 weights) is a lower-lr polish: yes/no 93.8 -> 95.8 % held out.
# Phase 5 (issue 15) grounds image tokens in the text residual stream at decoder layer 1: demo-SAE
# cross-modal features 3 -> 26, yes/no held at 95.8 %, caption factuality 1.000 -> 0.981
# (docs/readme_zoo.md, "Grounding phase").
GROUNDING_PHASE = GroundingPhase(steps=4000, lr=5e-4, weight=10.0, shuffle=False, seed=7)
VLM_PHASES = (VLMPhase2(steps=4000), VLMPhase2(steps=2000, shuffle=False, seed=4),
              VLMPhase2(steps=2000, lr=5e-4, shuffle=False, seed=5), GROUNDING_PHASE)
SMOKE_VLM_PHASES = (VLMPhase2(steps=2, batch_captions=1, batch_questions=2),
                    GroundingPhase(steps=1, batch_captions=1, batch_questions=1, shuffle=False, layer=0))


def grounding_loss(hidden: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
                   scenes: list, n_captions: int, image_id: int, stop_id: int) -> tuple[torch.Tensor, dict]:
    """The GroundingPhase loss on one batch (rows: `n_captions` caption rows in reading order, then
    question rows; `scenes` one per row). Returns (loss, numbers to log)."""
    is_image = (ids == image_id) & mask.bool()
    filled = torch.zeros_like(is_image)
    image_rows, text_rows = [], []
    for r, scene in enumerate(scenes):
        cells = is_image[r].nonzero().squeeze(1)
        for o in scene.objects:
            filled[r, cells[o.cell]] = True
        if r < n_captions:
            answer = (labels[r] != -100).nonzero().squeeze(1)
            stops = [int(i) for i in answer if int(ids[r, i]) == stop_id]
            # caption sentences follow the objects in reading order (cell order)
            for o, stop in zip(sorted(scene.objects, key=lambda o: o.cell), stops):
                image_rows.append((r, int(cells[o.cell])))
                text_rows.append((r, stop - 1))
    img = torch.tensor(image_rows)
    txt = torch.tensor(text_rows)
    h_image = hidden[img[:, 0], img[:, 1]]
    h_text = hidden[txt[:, 0], txt[:, 1]].detach()
    match = ((h_image - h_text).pow(2).sum(-1) / h_text.pow(2).sum(-1).clamp_min(1e-6)).mean()
    caption_text = (labels[:n_captions] != -100) & mask[:n_captions].bool()
    text_norm = hidden[:n_captions][caption_text].norm(dim=-1).mean().detach()
    others = is_image.clone()
    others[:n_captions] &= ~filled[:n_captions]
    norm = ((hidden[others].norm(dim=-1) / text_norm - 1) ** 2).mean()
    cosine = F.cosine_similarity(h_image, h_text, dim=-1).mean()
    return match + norm, {"match": match.item(), "norm": norm.item(), "cosine": cosine.item()}


def _vlm_steps(model, processor, cfg: VLMConfig, rows: VLMRows, steps: int, lr: float, warmup: int, rng, seeds,
               label: str, progress: Progress | None, on_step: Callable[[int], None] | None = None,
               ground: "GroundingPhase | None" = None) -> float:
    tok = processor.tokenizer
    n_image_tokens = (cfg.image_size // cfg.patch) ** 2
    tower = set(id(p) for p in model.model.vision_tower.parameters())
    groups = [{"params": [p for p in model.parameters() if id(p) in tower], "scale": cfg.vision_lr_scale},
              {"params": [p for p in model.parameters() if id(p) not in tower], "scale": 1.0}]
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    acc_cap = acc_q = 0.0
    start = time.time()
    image_id, stop_id = tok.convert_tokens_to_ids(IMAGE_TOKEN), tok.convert_tokens_to_ids(".")
    grounded: dict = {}
    for step in range(steps):
        scenes: list = []
        pixels, ids, mask, labels = vlm_batch(rows, rng, seeds, processor, cfg.image_size, n_image_tokens, scenes)
        for g in opt.param_groups:
            g["lr"] = lr * g["scale"] * lr_schedule(step, steps, warmup)
        out = model(input_ids=ids, attention_mask=mask, pixel_values=pixels, output_hidden_states=ground is not None)
        logits = out.logits
        loss, exact = shifted_loss(logits, labels)
        total = loss
        if ground is not None:
            extra, grounded = grounding_loss(out.hidden_states[ground.layer + 1], ids, mask, labels, scenes,
                                             rows.captions, image_id, stop_id)
            total = loss + ground.weight * extra
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if rows.captions:
            acc_cap = 0.9 * acc_cap + 0.1 * exact[: rows.captions].float().mean().item()
        if rows.questions:
            with torch.no_grad():
                lab = labels[rows.captions:, 1:]
                answer = (lab != -100) & (lab != tok.eos_token_id)
                pred = logits[rows.captions:, :-1].argmax(-1)
                acc_q = 0.9 * acc_q + 0.1 * ((pred == lab) & answer).sum().item() / max(1, answer.sum().item())
        if on_step is not None:
            on_step(step + 1)
        if progress and (step % 25 == 0 or step == steps - 1):
            progress((step + 1) / steps,
                     f"shapes-vlm {label} step {step + 1}/{steps} loss {loss.item():.3f} caption exact "
                     f"{acc_cap:.2f} yes/no {acc_q:.2f}"
                     + "".join(f" {k} {v:.3f}" for k, v in grounded.items()) + f" {time.time() - start:.0f}s")
    return time.time() - start


def train_vlm(cfg: VLMConfig, out: Path, weak_out: Path | None, progress: Progress | None = None,
              phases: tuple = VLM_PHASES) -> dict:
    """Vision pretraining, then phase 1 (captions only, in reading order: the LM learns to read the
    image tokens; shapes-vlm-weak is saved early in it), then the question phases."""
    tok = vlm_tokenizer()
    processor = make_processor(cfg, tok)
    model = build_vlm(cfg, tok)
    set_attention(model, "sdpa")  # training speed; the saved config says eager
    model.train()
    vision_log = pretrain_vision(model, cfg, processor, progress)
    rng = random.Random(cfg.seed + 1)
    seeds = iter(sw.split_seeds("train", sw.SPLIT_SIZE)[5_000_000:])  # disjoint from the LM's scenes

    def save_weak(step: int) -> None:
        if weak_out is not None and step == cfg.weak_step:
            save_vlm(model, processor, weak_out)

    seconds = _vlm_steps(model, processor, cfg, VLMRows(captions=cfg.batch_captions), cfg.steps, cfg.lr,
                         cfg.warmup, rng, seeds, "phase 1 (captions)", progress, save_weak)
    log = {"steps": cfg.steps, "weak_step": cfg.weak_step, "seconds": round(seconds, 1),
           "vision_pretraining": vision_log, "config": dataclasses.asdict(cfg)}
    for i, phase in enumerate(phases, start=2):
        log[f"phase{i}"] = continue_vlm(model, processor, cfg, phase, progress, label=f"phase {i}")
    save_vlm(model, processor, out)
    return log


def continue_vlm(model, processor, cfg: VLMConfig, phase: VLMPhase2, progress: Progress | None = None,
                 label: str = "phase 2") -> dict:
    set_attention(model, "sdpa")
    model.train()
    rows = VLMRows(captions=phase.batch_captions, questions=phase.batch_questions, shuffle=phase.shuffle,
                   existence=phase.existence)
    rng = random.Random(phase.seed)
    seeds = iter(sw.split_seeds("train", sw.SPLIT_SIZE)[7_000_000 + (phase.seed - 3) * 500_000:])
    seconds = _vlm_steps(model, processor, cfg, rows, phase.steps, phase.lr, phase.warmup, rng, seeds, label,
                         progress, ground=phase if isinstance(phase, GroundingPhase) else None)
    return {"steps": phase.steps, "seconds": round(seconds, 1), "config": dataclasses.asdict(phase)}


def set_attention(model, name: str) -> None:
    for cfg in (model.config, model.config.text_config, model.config.vision_config):
        cfg._attn_implementation = name


def save_vlm(model, processor, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    set_attention(model, "eager")
    model.save_pretrained(out)
    processor.save_pretrained(out)
    set_attention(model, "sdpa")
    model.train(was_training)

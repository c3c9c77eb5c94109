"""shapes-vlm-aligned (experimental): a LLaVA on the pretrained shapes-lm, projector-only first stage."""
from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from analysis.framework.progress import Progress
from analysis.world import shapes_world as sw
from analysis.world.tokenizer import make_word_tokenizer
from analysis.zoo.train.common import (
    IMAGE_TOKEN, SMOKE_VLM, VLMConfig, lr_schedule, shifted_loss, vlm_tokenizer,
)
from analysis.zoo.train.vlm import (
    VLMPhase2, VLMRows, continue_vlm, make_processor, pretrain_vision, save_vlm, set_attention, vlm_batch,
)

# ---------------------------------------------------------------------------------------------
# shapes-vlm-aligned (experimental): LLaVA on the pretrained shapes-lm, projector-only first stage


@dataclass
class AlignedVLMConfig:
    """How real LLaVA-family models are built: a *pretrained* text LM (here `shapes-lm`), a vision
    tower pretrained on its own (`pretrain_vision`, as for shapes-vlm), then stage 1 trains only the
    projector on captions with the LM and the tower frozen, which forces image tokens into the LM's
    own input space; later phases (`ALIGNED_VLM_PHASES`) train LM and projector (tower at
    `vision.vision_lr_scale`) on captions and yes/no questions. The LM's layer sizes come from the
    shapes-lm checkpoint; `vision` gives the tower geometry, its pretraining and the seed."""

    vision: VLMConfig = dataclasses.field(default_factory=VLMConfig)
    projector_steps: int = 300
    projector_lr: float = 1e-3
    projector_warmup: int = 20
    batch_captions: int = 32


# Stage 2: captions with the LM unfrozen, then the question phases of shapes-vlm.
ALIGNED_VLM_PHASES = (VLMPhase2(steps=300, batch_captions=32, batch_questions=0, shuffle=False, seed=6),
                      VLMPhase2(steps=4000, seed=7), VLMPhase2(steps=2000, shuffle=False, seed=8))
SMOKE_ALIGNED = AlignedVLMConfig(vision=SMOKE_VLM, projector_steps=3, batch_captions=2)
SMOKE_ALIGNED_PHASES = (VLMPhase2(steps=2, batch_captions=1, batch_questions=1, seed=6),)


def build_aligned_vlm(cfg: AlignedVLMConfig, tok, lm_folder: Path):
    """A LLaVA whose language model is the saved shapes-lm at `lm_folder`, copied weight for weight.

    The VLM tokenizer has one more special token (`<image>`) than the LM's, which shifts the ids of
    every word: embedding and output rows are copied by token string; `<image>`'s rows are zero
    (its input embedding is always replaced by a projected patch)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlamaForCausalLM, LlavaConfig, LlavaForConditionalGeneration

    lm = LlamaForCausalLM.from_pretrained(lm_folder)
    lm_vocab = make_word_tokenizer(list(sw.VOCAB)).get_vocab()
    if lm.config.vocab_size != len(lm_vocab):
        raise ValueError(f"{lm_folder} is not a shapes-lm checkpoint (vocabulary {lm.config.vocab_size}).")
    v = cfg.vision
    torch.manual_seed(v.seed)
    vision = CLIPVisionConfig(
        image_size=v.image_size, patch_size=v.patch, hidden_size=v.vision_hidden,
        intermediate_size=v.vision_hidden * 2, num_hidden_layers=v.vision_layers, num_attention_heads=4,
        projection_dim=v.vision_hidden,
    )
    text = {k: val for k, val in lm.config.to_dict().items() if k not in ("architectures", "transformers_version")}
    text.update(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id)
    config = LlavaConfig(
        vision_config=vision, text_config=LlamaConfig(**text), image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="default", vision_feature_layer=-1, attn_implementation="eager",
    )
    model = LlavaForConditionalGeneration(config)
    words = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    src = torch.tensor([lm_vocab.get(w, 0) for w, _ in words])
    known = torch.tensor([w in lm_vocab for w, _ in words], dtype=torch.float32)[:, None]
    state = lm.state_dict()
    with torch.no_grad():
        for name, p in model.model.language_model.named_parameters():
            weight = state["model." + name]
            p.copy_(weight[src] * known if name == "embed_tokens.weight" else weight)
        model.lm_head.weight.copy_(state["lm_head.weight"][src] * known)
    return model


def train_projector(model, processor, cfg: AlignedVLMConfig, progress: Progress | None = None) -> dict:
    """Stage 1: captions only, only the multimodal projector trains (LM and vision tower frozen)."""
    v = cfg.vision
    n_image_tokens = (v.image_size // v.patch) ** 2
    params = list(model.model.multi_modal_projector.parameters())
    frozen = [p for p in model.parameters() if all(p is not q for q in params)]
    for p in frozen:
        p.requires_grad_(False)
    opt = torch.optim.AdamW(params, lr=cfg.projector_lr, weight_decay=0.0, betas=(0.9, 0.98))
    rng = random.Random(v.seed + 11)
    seeds = iter(sw.split_seeds("train", sw.SPLIT_SIZE)[6_000_000:])
    rows = VLMRows(captions=cfg.batch_captions)
    set_attention(model, "sdpa")
    model.train()
    start = time.time()
    loss = torch.tensor(0.0)
    for step in range(cfg.projector_steps):
        pixels, ids, mask, labels = vlm_batch(rows, rng, seeds, processor, v.image_size, n_image_tokens)
        for g in opt.param_groups:
            g["lr"] = cfg.projector_lr * lr_schedule(step, cfg.projector_steps, cfg.projector_warmup)
        logits = model(input_ids=ids, attention_mask=mask, pixel_values=pixels).logits
        loss, _ = shifted_loss(logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if progress and (step % 25 == 0 or step == cfg.projector_steps - 1):
            progress((step + 1) / cfg.projector_steps, f"shapes-vlm-aligned stage 1 (projector only) step "
                     f"{step + 1}/{cfg.projector_steps} loss {loss.item():.3f} {time.time() - start:.0f}s")
    for p in frozen:
        p.requires_grad_(True)
    return {"steps": cfg.projector_steps, "final_loss": round(loss.item(), 4), "seconds": round(time.time() - start, 1)}


def train_aligned_vlm(cfg: AlignedVLMConfig, out: Path, lm_folder: Path, progress: Progress | None = None,
                      phases: tuple = ALIGNED_VLM_PHASES) -> dict:
    """Vision pretraining, the LM copied from shapes-lm, stage 1 (projector only), then `phases`."""
    tok = vlm_tokenizer()
    processor = make_processor(cfg.vision, tok)
    model = build_aligned_vlm(cfg, tok, lm_folder)
    set_attention(model, "sdpa")
    model.train()
    log = {"language_model": str(lm_folder.name), "vision_pretraining": pretrain_vision(model, cfg.vision, processor,
                                                                                          progress)}
    log["stage1_projector_only"] = train_projector(model, processor, cfg, progress)
    for i, phase in enumerate(phases, start=2):
        log[f"phase{i}"] = continue_vlm(model, processor, cfg.vision, phase, progress, label=f"aligned phase {i}")
    log["steps"] = cfg.projector_steps + sum(p.steps for p in phases)
    log["config"] = dataclasses.asdict(cfg)
    save_vlm(model, processor, out)
    return log

"""Tiny random-weight models in standard HF classes, saved in `save_pretrained` layout.

Used by tests (every code path runs on real HF classes, just small ones) and by benchmarks
(a GPT-2-small-shaped random model). Nothing here is a demo model: those are trained in `zoo/`.
"""
from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]


def make_word_tokenizer(words: list[str], extra_special: list[str] = ()):
    """A whitespace word-level `PreTrainedTokenizerFast` (ids: specials first, then `words`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for w in [*SPECIALS, *extra_special, *words]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        additional_special_tokens=list(extra_special) or None,
    )
    return fast


def default_words(n: int = 120) -> list[str]:
    return [f"w{i}" for i in range(n)]


def save_tiny_llama(folder: str | Path, *, layers: int = 2, hidden: int = 32, heads: int = 4,
                    kv_heads: int = 2, words: list[str] | None = None, seed: int = 0,
                    max_positions: int = 512) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    tok = make_word_tokenizer(words or default_words())
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    _spread_weights(model)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def save_tiny_gpt2(folder: str | Path, *, layers: int = 2, hidden: int = 32, heads: int = 4,
                   words: list[str] | None = None, seed: int = 0, max_positions: int = 512) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = Path(folder)
    tok = make_word_tokenizer(words or default_words())
    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=len(tok), n_embd=hidden, n_layer=layers, n_head=heads, n_positions=max_positions,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    model = GPT2LMHeadModel(cfg)
    _spread_weights(model)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def save_tiny_llava(folder: str | Path, *, image_size: int = 32, patch: int = 8, layers: int = 2,
                    hidden: int = 32, words: list[str] | None = None, seed: int = 0) -> Path:
    from transformers import (
        CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    folder = Path(folder)
    tok = make_word_tokenizer(words or default_words(), extra_special=["<image>"])
    torch.manual_seed(seed)
    vision = CLIPVisionConfig(
        image_size=image_size, patch_size=patch, hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=2, num_attention_heads=4, projection_dim=hidden,
    )
    text = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )
    cfg = LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=tok.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default", vision_feature_layer=-1,
    )
    model = LlavaForConditionalGeneration(cfg)
    _spread_weights(model)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size},
    )
    processor = LlavaProcessor(
        image_processor=image_processor, tokenizer=tok, patch_size=patch,
        vision_feature_select_strategy="default", num_additional_image_tokens=1, image_token="<image>",
    )
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def _spread_weights(model: torch.nn.Module) -> None:
    """HF init (std 0.02) makes tiny models nearly uniform; wider weights give sharper, varied attention."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3 if "embed" in name or "wte" in name else 1.0 / p.shape[-1] ** 0.5)


def gpt2_small_random(with_tokenizer: bool = False):
    """A GPT-2-small-shaped model (GPT2Config defaults, 124M parameters) with random weights, built in
    memory (no download), as a `ModelHandle`; the benchmarks' "real-sized" baseline. With
    `with_tokenizer`, a word-level tokenizer covering the whole vocabulary (t0, t1, ...)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from analysis.models import ModelHandle, ModelSpec, describe

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(attn_implementation="eager")).eval()
    tok = make_word_tokenizer([f"t{i}" for i in range(model.config.vocab_size - len(SPECIALS))]) if with_tokenizer else None
    return ModelHandle(spec=ModelSpec("local", "gpt2-small-random"), model=model, kind="causal_lm",
                       info=describe(model, "causal_lm"), language_model=model, tokenizer=tok)

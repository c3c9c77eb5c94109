"""Tiny random-weight models in standard HF classes, saved in `save_pretrained` layout.

Used by tests (every code path runs on real HF classes, just small ones) and by benchmarks
(a GPT-2-small-shaped random model). Nothing here is a demo model: those are trained in `zoo/`.
"""
from __future__ import annotations

from pathlib import Path

import torch

from analysis.world.tokenizer import SPECIALS, make_word_tokenizer


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

    from analysis.model_access.models import ModelHandle, ModelSpec, describe

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(attn_implementation="eager")).eval()
    tok = make_word_tokenizer([f"t{i}" for i in range(model.config.vocab_size - len(SPECIALS))]) if with_tokenizer else None
    return ModelHandle(spec=ModelSpec("local", "gpt2-small-random"), model=model, kind="causal_lm",
                       info=describe(model, "causal_lm"), language_model=model, tokenizer=tok)


# ---------------------------------------------------------------------------------------------
# One tiny random model per Hugging Face family (the support matrix and the anatomy tests)
#
# Each builder returns (model, tokenizer, processor) built offline from a config; `save_tiny`
# writes them in save_pretrained layout. Tokenizers are word-level with the family's own special
# tokens; a VLM's processor gets a short chat template in its family's style, so prompts go through
# `apply_chat_template` as they would on the real checkpoint.

HIDDEN = 32


def family_words() -> list[str]:
    """The default words plus yes/no, so a VLM can answer the caption panel's verification questions."""
    return [*default_words(), "yes", "no"]
TINY_IMAGE = 28  # px: 4 x 4 patches of 7 px (small enough for every vision tower)


def _text_kwargs(tok, **extra) -> dict:
    kw = dict(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
              tie_word_embeddings=False)
    kw.update(extra)
    return kw


def qwen2_char_tokenizer():
    """A `Qwen2Tokenizer` (byte-level BPE over single characters, space-led or not). AutoTokenizer loads a
    qwen2 folder with this class whatever tokenizer_config.json says, so a word-level one would not survive."""
    import string

    from transformers import Qwen2Tokenizer

    chars = list(string.ascii_letters + string.digits + ".,:;=?!")
    vocab: dict[str, int] = {}
    for w in [*SPECIALS, "\u0120", *chars, *("\u0120" + c for c in chars)]:
        vocab.setdefault(w, len(vocab))
    merges = [("\u0120", c) for c in chars]  # " a" -> "Ġa": one token per space-led character
    return Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                          eos_token="</s>")


def _causal(config_cls: str, model_cls: str, tokenizer: str = "words", **extra):
    def build(seed: int = 0):
        import transformers

        tok = qwen2_char_tokenizer() if tokenizer == "qwen2" else make_word_tokenizer(family_words())
        torch.manual_seed(seed)
        cfg = getattr(transformers, config_cls)(**_text_kwargs(tok, **extra))
        return getattr(transformers, model_cls)(cfg), tok, None
    return build


def _gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = make_word_tokenizer(family_words())
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=len(tok), n_embd=HIDDEN, n_layer=2, n_head=4, n_positions=512,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return GPT2LMHeadModel(cfg), tok, None


def _neox(seed: int = 0):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    tok = make_word_tokenizer(family_words())
    torch.manual_seed(seed)
    cfg = GPTNeoXConfig(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return GPTNeoXForCausalLM(cfg), tok, None


def _opt(seed: int = 0):
    from transformers import OPTConfig, OPTForCausalLM

    tok = make_word_tokenizer(family_words())
    torch.manual_seed(seed)
    cfg = OPTConfig(vocab_size=len(tok), hidden_size=HIDDEN, ffn_dim=2 * HIDDEN, num_hidden_layers=2,
                    num_attention_heads=4, word_embed_proj_dim=HIDDEN, max_position_embeddings=512,
                    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return OPTForCausalLM(cfg), tok, None


def _vision(kind: str = "clip", **extra):
    import transformers

    name = {"clip": "CLIPVisionConfig", "siglip": "SiglipVisionConfig"}[kind]
    kw = dict(image_size=TINY_IMAGE, patch_size=7, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
              num_hidden_layers=1, num_attention_heads=4)
    kw.update(extra)
    return getattr(transformers, name)(**kw)


LLAVA_TEMPLATE = ("{% for m in messages %}{{ m['role'] | upper }}: {% for c in m['content'] %}"
                  "{% if c['type'] == 'image' %}<image>\n{% else %}{{ c['text'] }}{% endif %}{% endfor %} "
                  "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")
MISTRAL_TEMPLATE = ("{% for m in messages %}[INST] {% for c in m['content'] %}{% if c['type'] == 'image' %}"
                    "<image>\n{% else %}{{ c['text'] }}{% endif %}{% endfor %} [/INST]{% endfor %}")
CHATML_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
                   "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}"
                   "{% endif %}{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                   "{% endif %}")
IDEFICS3_TEMPLATE = ("<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:{% for c in m['content'] %}"
                     "{% if c['type'] == 'image' %}<image>{% else %} {{ c['text'] }}{% endif %}{% endfor %}"
                     "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else "
                  "m['role'] }}\n{% for c in m['content'] %}{% if c['type'] == 'image' %}<start_of_image>{% else %}"
                  "{{ c['text'] }}{% endif %}{% endfor %}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}"
                  "<start_of_turn>model\n{% endif %}")


def _llava(seed: int = 0):
    from transformers import CLIPImageProcessorPil, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    tok = make_word_tokenizer(family_words(), extra_special=["<image>"])
    torch.manual_seed(seed)
    cfg = LlavaConfig(vision_config=_vision(), text_config=LlamaConfig(**_text_kwargs(tok)),
                      image_token_id=tok.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default",
                      vision_feature_layer=-1)
    ip = CLIPImageProcessorPil(size={"shortest_edge": TINY_IMAGE}, crop_size={"height": TINY_IMAGE, "width": TINY_IMAGE})
    proc = LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=7, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1, image_token="<image>", chat_template=LLAVA_TEMPLATE)
    return LlavaForConditionalGeneration(cfg), tok, proc


def _llava_next(seed: int = 0):
    from transformers import (LlamaConfig, LlavaNextConfig, LlavaNextForConditionalGeneration,
                              LlavaNextImageProcessorPil, LlavaNextProcessor)

    tok = make_word_tokenizer(family_words(), extra_special=["<image>"])
    torch.manual_seed(seed)
    pinpoints = [[TINY_IMAGE, TINY_IMAGE], [TINY_IMAGE, 2 * TINY_IMAGE], [2 * TINY_IMAGE, TINY_IMAGE]]
    cfg = LlavaNextConfig(vision_config=_vision(), text_config=LlamaConfig(**_text_kwargs(tok)),
                          image_token_index=tok.convert_tokens_to_ids("<image>"), image_grid_pinpoints=pinpoints,
                          vision_feature_select_strategy="default", vision_feature_layer=-1)
    ip = LlavaNextImageProcessorPil(size={"shortest_edge": TINY_IMAGE}, crop_size={"height": TINY_IMAGE, "width": TINY_IMAGE},
                                    image_grid_pinpoints=pinpoints)
    proc = LlavaNextProcessor(image_processor=ip, tokenizer=tok, patch_size=7, vision_feature_select_strategy="default",
                              num_additional_image_tokens=1, image_token="<image>", chat_template=MISTRAL_TEMPLATE)
    return LlavaNextForConditionalGeneration(cfg), tok, proc


def _qwen2_vl(seed: int = 0):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil, Qwen2VLProcessor

    special = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tok = make_word_tokenizer(family_words(), extra_special=special)
    torch.manual_seed(seed)
    ids = {t: tok.convert_tokens_to_ids(t) for t in special}
    text = dict(_text_kwargs(tok), rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                    "mrope_section": [1, 1, 2]})
    vision = dict(depth=1, embed_dim=HIDDEN, hidden_size=HIDDEN, num_heads=4, mlp_ratio=2, patch_size=7,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    cfg = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                        vision_end_token_id=ids["<|vision_end|>"])
    ip = Qwen2VLImageProcessorPil(min_pixels=TINY_IMAGE * TINY_IMAGE, max_pixels=TINY_IMAGE * TINY_IMAGE, patch_size=7,
                                  merge_size=2, temporal_patch_size=2)
    tok.chat_template = CHATML_TEMPLATE
    try:
        proc = Qwen2VLProcessor(image_processor=ip, tokenizer=tok, chat_template=CHATML_TEMPLATE)
    except (AttributeError, TypeError, ImportError):  # its video processor needs torchvision
        proc = ip  # saved alone: loading then falls back to the tokenizer (see models._load_processor)
    return Qwen2VLForConditionalGeneration(cfg), tok, proc


def _idefics3(seed: int = 0):
    from transformers import (Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessorPil,
                              Idefics3Processor, LlamaConfig)

    special = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", "<|im_start|>"]
    tok = make_word_tokenizer(family_words(), extra_special=special)
    torch.manual_seed(seed)
    vision = dict(image_size=TINY_IMAGE, patch_size=7, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                  num_hidden_layers=1, num_attention_heads=4)
    cfg = Idefics3Config(text_config=LlamaConfig(**_text_kwargs(tok)), vision_config=vision, scale_factor=2,
                         image_token_id=tok.convert_tokens_to_ids("<image>"))
    ip = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": TINY_IMAGE},
                                   max_image_size={"longest_edge": TINY_IMAGE})
    proc = Idefics3Processor(image_processor=ip, tokenizer=tok, image_seq_len=4, chat_template=IDEFICS3_TEMPLATE)
    return Idefics3ForConditionalGeneration(cfg), tok, proc


def _paligemma(seed: int = 0):
    from transformers import (GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration, PaliGemmaProcessor,
                              SiglipImageProcessorPil)

    tok = make_word_tokenizer(family_words(), extra_special=["<image>"])
    torch.manual_seed(seed)
    text = GemmaConfig(**_text_kwargs(tok, head_dim=8))
    cfg = PaliGemmaConfig(vision_config=_vision("siglip", projection_dim=HIDDEN), text_config=text,
                          image_token_index=tok.convert_tokens_to_ids("<image>"), vocab_size=len(tok),
                          projection_dim=HIDDEN, hidden_size=HIDDEN)
    cfg.vision_config.projection_dim = HIDDEN
    ip = SiglipImageProcessorPil(size={"height": TINY_IMAGE, "width": TINY_IMAGE})
    ip.image_seq_length = (TINY_IMAGE // 7) ** 2
    proc = PaliGemmaProcessor(image_processor=ip, tokenizer=tok)
    return PaliGemmaForConditionalGeneration(cfg), tok, proc


def _gemma3(seed: int = 0):
    from transformers import (Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessorPil, Gemma3Processor,
                              Gemma3TextConfig)

    special = ["<start_of_image>", "<end_of_image>", "<image_soft_token>", "<start_of_turn>", "<end_of_turn>"]
    from transformers import PreTrainedTokenizerFast

    words = make_word_tokenizer(family_words(), extra_special=special)
    # Gemma 3's tokenizer names its image tokens (saved in tokenizer_config.json); its processor reads them.
    tok = PreTrainedTokenizerFast(
        tokenizer_object=words._tokenizer, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                              "image_token": "<image_soft_token>"},
    )
    torch.manual_seed(seed)
    text = Gemma3TextConfig(**_text_kwargs(tok, head_dim=8, sliding_window=16,
                                           layer_types=["sliding_attention", "full_attention"]))
    cfg = Gemma3Config(text_config=text, vision_config=_vision("siglip"), mm_tokens_per_image=4,
                       boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
                       eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
                       image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"))
    ip = Gemma3ImageProcessorPil(size={"height": TINY_IMAGE, "width": TINY_IMAGE})
    proc = Gemma3Processor(image_processor=ip, tokenizer=tok, image_seq_length=4, chat_template=GEMMA_TEMPLATE)
    return Gemma3ForConditionalGeneration(cfg), tok, proc


# family name -> (kind, builder); names are the support matrix's rows
FAMILIES: dict[str, tuple[str, object]] = {
    "llama": ("causal_lm", _causal("LlamaConfig", "LlamaForCausalLM")),
    "mistral": ("causal_lm", _causal("MistralConfig", "MistralForCausalLM", sliding_window=None)),
    "mistral-sliding": ("causal_lm", _causal("MistralConfig", "MistralForCausalLM", sliding_window=16)),
    "qwen2": ("causal_lm", _causal("Qwen2Config", "Qwen2ForCausalLM", tokenizer="qwen2")),
    "qwen3": ("causal_lm", _causal("Qwen3Config", "Qwen3ForCausalLM", head_dim=8)),
    "gemma2": ("causal_lm", _causal("Gemma2Config", "Gemma2ForCausalLM", head_dim=8, sliding_window=16)),
    "gemma3-text": ("causal_lm", _causal("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=8, sliding_window=16,
                                         layer_types=["sliding_attention", "full_attention"])),
    "phi3": ("causal_lm", _causal("Phi3Config", "Phi3ForCausalLM")),
    "gpt2": ("causal_lm", _gpt2),
    "gpt-neox": ("causal_lm", _neox),
    "opt": ("causal_lm", _opt),
    "llava": ("vlm", _llava),
    "llava-next": ("vlm", _llava_next),
    "qwen2-vl": ("vlm", _qwen2_vl),
    "idefics3": ("vlm", _idefics3),
    "paligemma": ("vlm", _paligemma),
    "gemma3": ("vlm", _gemma3),
}


def build_tiny(family: str, seed: int = 0):
    """(model, tokenizer, processor) of a tiny random `family` model, in eval mode with eager attention."""
    if family not in FAMILIES:
        raise KeyError(f"unknown family '{family}' (known: {', '.join(FAMILIES)})")
    model, tok, proc = FAMILIES[family][1](seed)
    _spread_weights(model)
    model.config._attn_implementation = "eager"
    for sub in ("text_config", "vision_config"):
        if getattr(model.config, sub, None) is not None:
            getattr(model.config, sub)._attn_implementation = "eager"
    return model.eval(), tok, proc


def save_tiny(family: str, folder: str | Path, seed: int = 0) -> Path:
    """Save a tiny `family` model with its tokenizer (and processor) in save_pretrained layout."""
    folder = Path(folder)
    model, tok, proc = build_tiny(family, seed)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    if proc is not None:
        proc.save_pretrained(folder)
    return folder

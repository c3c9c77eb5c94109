"""Text generation and next-token probabilities on a shared model (always under its lock): the captioner,
the agents' language model and the verifier's inputs."""
from __future__ import annotations

import torch

from analysis.model_access import anatomy
from analysis.captions.world import CaptionError, shapes_text
from analysis.model_access.models import ModelHandle, require_kind
from analysis.tasks import tasks_for

GENERIC_CAPTION_PROMPT = "Describe this image in detail."
CAPTION_TOKENS = 96  # tokens a generated caption may have


def generate_text(handle: ModelHandle, prompt: str, max_new_tokens: int = 64,
                  add_special_tokens: bool = True) -> str:
    """Greedy continuation of `prompt` by the handle's language model (a VLM's own LM too)."""
    tok = handle.tokenizer
    ids = tok(prompt, return_tensors="pt", add_special_tokens=add_special_tokens).to(handle.device)
    room = (handle.info.max_positions or 1 << 30) - ids["input_ids"].shape[1]
    if room <= 0:
        raise CaptionError(f"The prompt is longer than {handle.spec.label} can read "
                           f"({handle.info.max_positions} tokens); use a shorter caption.")
    max_new_tokens = min(max_new_tokens, room)
    with handle.session(), anatomy.model_step(handle, "generating text"):
        out = handle.language_model.generate(
            **ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=_pad_id(tok),
        )
    return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def caption_image(handle: ModelHandle, image, prompt: str | None = None,
                  max_new_tokens: int = CAPTION_TOKENS) -> str:
    """Greedy caption of `image` by a VLM, with its chat template when it has one."""
    require_kind(handle, "vlm", panel="Caption correction")
    if prompt is None:
        prompt = caption_prompt(handle)
    inputs = vlm_inputs(handle, [image], [prompt])
    with handle.session(), anatomy.model_step(handle, "captioning the image"):
        out = handle.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                    pad_token_id=_pad_id(handle.tokenizer))
    text = handle.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
    return shapes_text(text) if speaks_shapes_world(handle) else text


def caption_prompt(handle: ModelHandle) -> str:
    """The captioning prompt: the task provider's (the demo VLMs' trained one), else a generic request
    through the chat template."""
    return tasks_for(handle).caption_prompt(handle) or vlm_prompt(handle, GENERIC_CAPTION_PROMPT)


def vlm_prompt(handle: ModelHandle, text: str) -> str:
    """A one-image user turn: the chat template's when there is one, else '<image> text'."""
    return anatomy.image_prompt(handle, text)


def speaks_shapes_world(handle: ModelHandle) -> bool:
    """True for the demo models: the task provider gives them Shapes World tasks."""
    return tasks_for(handle).shapes_world


def vlm_inputs(handle: ModelHandle, images: list, prompts: list[str]) -> dict[str, torch.Tensor]:
    """The processor's tensors for one image per prompt, left-padded (every row's next-token logits sit
    at its last position), on the model's device."""
    processor = anatomy.require_processor(handle, "Caption correction")
    with anatomy.model_step(handle, "preparing the image and prompt"):
        inputs = processor(images=[[_rgb(i)] for i in images], text=prompts, return_tensors="pt",
                           padding=True, padding_side="left")
    return {k: v.to(handle.device) for k, v in inputs.items()}


def _rgb(image):
    return image.convert("RGB") if getattr(image, "mode", "RGB") != "RGB" else image


def _pad_id(tok) -> int | None:
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


def answer_token_ids(tokenizer, word: str) -> list[int]:
    """Ids of single tokens that spell `word` (any case, with or without a leading space)."""
    ids: set[int] = set()
    for variant in {word, word.lower(), word.capitalize(), word.upper()}:
        for text in (variant, " " + variant):
            enc = tokenizer.encode(text, add_special_tokens=False)
            if len(enc) == 1 and enc[0] != tokenizer.unk_token_id:
                if tokenizer.decode(enc).strip().lower() == word.lower():
                    ids.add(enc[0])
    return sorted(ids)


def chat_prompt(handle: ModelHandle, text: str | list[dict]) -> str:
    """A chat prompt ready for the assistant's answer: one user turn (`text`), or a whole conversation
    (`[{"role": ..., "content": ...}, ...]`, e.g. worked examples before the question)."""
    tok = handle.tokenizer
    if not getattr(tok, "chat_template", None):
        raise CaptionError(f"{handle.spec.label} has no chat template, so it cannot follow the "
                           "prompt-based agents; choose the Shapes World agents instead.")
    messages = [{"role": "user", "content": text}] if isinstance(text, str) else text
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

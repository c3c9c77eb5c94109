"""How SAE-V puts an image-caption pair (or a text) in front of the model: one path for every pair.

Generated pairs, your own pairs and an explained input are all read the way the model reads a caption it
was asked for: on a vision-language model the model's captioning prompt followed by the caption, the
prompt being the one the model was trained with where its task provider knows it (the demo VLM:
`<s> <image> describe :`) and otherwise the processor's chat template asking to describe the image (the
caption is then the assistant's answer); on a language model the text after the beginning-of-sequence
token. A tokenizer that adds BOS itself gets no second one. Pairs identical in content therefore give
identical residuals wherever they come from (tests/unit/test_sae_pairs.py).

A pair longer than the model's context is not scored silently: `too_long` measures each prompt, and the
pair is reported and left out (`sources.data_pairs`), as steering and explain refuse a long text.
"""
from __future__ import annotations

from analysis.model_access import anatomy
from analysis.model_access.models import ModelHandle
from analysis.tasks import tasks_for

GENERIC_CAPTION = "Describe the image."


def caption_prompt(handle: ModelHandle) -> str:
    """The model's captioning prompt: the demo VLM's trained one, else a request through the chat template."""
    return tasks_for(handle).caption_prompt(handle) or anatomy.image_prompt(handle, GENERIC_CAPTION)


def pair_prompt(handle: ModelHandle, text: str) -> str:
    """The text the model reads for one pair: caption prompt + caption on a VLM, BOS + text on a language
    model."""
    if handle.kind == "vlm":
        prompt = caption_prompt(handle)
        return prompt + ("" if not prompt or prompt[-1].isspace() else " ") + text
    return with_bos(handle.tokenizer, text)


def with_bos(tokenizer, text: str) -> str:
    """`text` after the tokenizer's BOS token, unless the tokenizer adds it itself (or it has none)."""
    bos = getattr(tokenizer, "bos_token", None)
    if not bos or text.startswith(bos) or _adds_bos(tokenizer):
        return text
    return bos + text


def _adds_bos(tokenizer) -> bool:
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def prompt_lengths(handle: ModelHandle, texts: list[str]) -> list[int]:
    """Tokens the model reads for each text's pair (its prompt, and on a VLM the image's tokens)."""
    if not texts:
        return []
    ids = handle.tokenizer([pair_prompt(handle, t) for t in texts], add_special_tokens=True)["input_ids"]
    image = max(int(handle.info.image_tokens or 0) - 1, 0) if handle.kind == "vlm" else 0  # <image> expands
    return [len(row) + image for row in ids]


def too_long(handle: ModelHandle, texts: list[str]) -> dict[int, int]:
    """{index: tokens} of the texts whose pair does not fit the model's context ({} when it has no limit)."""
    limit = handle.info.max_positions
    if not limit:
        return {}
    return {i: n for i, n in enumerate(prompt_lengths(handle, texts)) if n > limit}


def too_long_reason(handle: ModelHandle, tokens: int) -> str:
    return (f"caption too long: {tokens:,} tokens with the prompt{' and the image' if handle.kind == 'vlm' else ''}; "
            f"{handle.spec.label} reads at most {handle.info.max_positions:,} (shorten it)")

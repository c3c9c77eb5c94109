"""Steering: add (or clamp) SAE features in the residual stream at the SAE's layer while the model
generates, and compare with the unsteered output token by token.

Adding feature k at strength S adds S times its decoder direction (what one unit of the feature adds to
the SAE's reconstruction) to the residual after the SAE's layer, at the chosen positions (the prompt's text and image tokens, and every generated token): what
the SAE's reconstruction would add if the feature fired at S there. Our SAEs read each modality scaled
(`SaeMeta.scales`), so the direction is divided by that position's scale. Clamping sets the feature's
activation to S: the SAE encodes the residual, and the difference S - f_k(x) times the direction is
added. Both outputs are greedy, so every difference comes from the steering.
"""
from __future__ import annotations

import difflib

import torch

from analysis.model_access import anatomy
from analysis.framework.errors import SettingsError
from analysis.model_access.models import ModelHandle
from analysis.sae_v.codec import as_codec
from analysis.sae_v.params import SteerParams
from analysis.sae_v.prompts import caption_prompt
from analysis.sae_v.sources import locate, open_sae, store_for
from analysis.sae_v.types import IMAGE, TEXT, Progress, SteeredText, SteeringResult, _noop
from analysis.sae_v.userdata import image_from_ref

def steer(handle: ModelHandle, params: SteerParams, progress: Progress | None = None) -> SteeringResult:
    """The runner's entry: the unsteered and the steered output of one prompt (with its image on a VLM)."""
    progress = progress or _noop
    params.validate()
    source = locate(handle, params.sae)  # resolved once
    sae, meta = open_sae(handle, params, source)
    pairs = store_for(handle, params, source=source).pairs if params.image.startswith("pair:") else None
    image = image_from_ref(params.image, pairs)
    return generate_both(handle, sae, meta, params.features, image=image, prompt=params.prompt, mode=params.mode,
                         max_new_tokens=params.max_new_tokens, positions=params.positions, progress=progress)


def generate_both(handle: ModelHandle, sae, meta, features: dict[int, float], image=None, prompt: str = "",
                  mode: str = "add", max_new_tokens: int = 24, positions: str = "all",
                  progress: Progress | None = None) -> SteeringResult:
    """Greedy output without and with `features` ({feature: strength}) steered at the SAE's layer."""
    progress = progress or _noop
    d_sae = int(sae.cfg.d_sae)
    bad = [k for k in features if not 0 <= int(k) < d_sae]
    if bad:
        raise SettingsError(f"Feature {bad[0]} does not exist: this SAE has features 0 to {d_sae - 1}.")
    text, inputs = _inputs(handle, prompt, image)
    progress(0.05, "generating without steering")
    plain = _generate(handle, inputs, max_new_tokens)
    progress(0.5, "generating with steering")
    mask = (inputs["input_ids"][0] == anatomy.image_token_id(handle)) if handle.kind == "vlm" else None
    with handle.patch() as patch:
        patch.hook(anatomy.decoder_layers(handle.model)[meta.layer], _Steer(sae, meta, features, mode, mask, positions))
        steered = _generate(handle, inputs, max_new_tokens)
    progress(1.0, "done")
    a, b = _texts(handle, plain), _texts(handle, steered)
    a.changed, b.changed = _changed(a.tokens, b.tokens)
    return SteeringResult(model=handle.spec.label, layer=meta.layer, features=dict(features), mode=mode,
                          prompt=text, unsteered=a, steered=b, positions=positions)


def _inputs(handle: ModelHandle, prompt: str, image) -> tuple[str, dict]:
    if handle.kind == "vlm":
        if image is None:
            raise SettingsError("A vision-language model is steered on an image: choose a pair or upload one.")
        text = prompt.strip() or caption_prompt(handle)
        if anatomy.image_token(handle) not in text:
            text = anatomy.image_prompt(handle, text)
        processor = anatomy.require_processor(handle, "SAE-V steering")
        with anatomy.model_step(handle, "preparing the steering input"):
            enc = processor(images=[[image.convert("RGB")]], text=[text], return_tensors="pt")
    else:
        if image is not None:
            raise SettingsError(f"{handle.spec.label} is a text-only model; it cannot read an image.")
        text = prompt.strip()
        if not text:
            raise SettingsError("Enter a prompt for the language model to continue.")
        enc = handle.tokenizer(text, return_tensors="pt")
    room = (handle.info.max_positions or 1 << 30) - int(enc["input_ids"].shape[1])
    if room <= 1:
        raise SettingsError(f"The prompt is longer than {handle.spec.label} can read ({handle.info.max_positions} "
                            "tokens).")
    return text, {k: v.to(handle.device) for k, v in enc.items()}


def _generate(handle: ModelHandle, inputs: dict, new_tokens: int) -> torch.Tensor:
    """The greedy continuation's token ids (EOS and what follows cut)."""
    new_tokens = min(new_tokens, (handle.info.max_positions or 1 << 30) - int(inputs["input_ids"].shape[1]))
    tok = handle.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with handle.session(), anatomy.model_step(handle, "generating"):
        out = handle.model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
    ids = out[0, inputs["input_ids"].shape[1]:]
    eos = tok.eos_token_id
    if eos is not None and (ids == eos).any():
        ids = ids[: int((ids == eos).nonzero()[0])]
    return ids


class _Steer:
    """The forward hook on the SAE's layer that adds the features' directions to its output: what the SAE's
    reconstruction of each position changes by (`Codec.steer_delta`, its input normalisation undone per
    position), divided by the position's modality scale."""

    def __init__(self, sae, meta, features: dict[int, float], mode: str, image_mask: torch.Tensor | None,
                 positions: str = "all") -> None:
        keys = sorted(int(k) for k in features)
        self.keys = keys
        self.strength = torch.tensor([float(features[k]) for k in keys])
        self.codec, self.scales, self.mode = as_codec(sae), meta.scales, mode
        self.image_mask = image_mask  # prompt positions that are image tokens (a VLM)
        self.positions = positions  # all | image | text

    def __call__(self, module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        n = hidden.shape[1]
        modality = torch.full((n,), TEXT, dtype=torch.long)
        if self.image_mask is not None and n == self.image_mask.numel():  # the prompt's own forward
            modality[self.image_mask.cpu()] = IMAGE
        scale = torch.tensor(self.scales, dtype=torch.float32)[modality][:, None]  # (T, 1)
        x = hidden[0].detach().float().cpu() * scale  # the SAE's input
        if self.mode == "clamp":
            amount = self.strength[None, :] - self.codec.encode(x)[:, self.keys]  # (T, K)
        else:
            amount = self.strength[None, :].expand(n, -1)
        delta = self.codec.steer_delta(x, self.keys, amount) / scale  # (T, d) in the raw residual
        if self.positions != "all":
            delta = delta * (modality == (IMAGE if self.positions == "image" else TEXT)).float()[:, None]
        steered = hidden + delta.to(hidden.dtype).to(hidden.device)[None]
        return (steered,) + tuple(output[1:]) if isinstance(output, tuple) else steered


def _texts(handle: ModelHandle, ids: torch.Tensor) -> SteeredText:
    """The output's text and its tokens as they read in it (each the difference of two decoded prefixes, so a
    word-level tokenizer's spaces and a BPE tokenizer's pieces both come out right)."""
    tok = handle.tokenizer
    special = set(tok.all_special_ids)
    kept = [int(i) for i in ids if int(i) not in special]
    pieces, previous = [], ""
    for n in range(1, len(kept) + 1):
        text = tok.decode(kept[:n], skip_special_tokens=True)
        pieces.append(text[len(previous):] if text.startswith(previous) else tok.decode([kept[n - 1]]))
        previous = text
    return SteeredText(text=previous.strip(), tokens=pieces, changed=[])


def _changed(a: list[str], b: list[str]) -> tuple[list[bool], list[bool]]:
    """Per token of each output: whether it is not matched in the other (difflib's alignment)."""
    mark_a, mark_b = [True] * len(a), [True] * len(b)
    for block in difflib.SequenceMatcher(None, [t.strip() for t in a], [t.strip() for t in b],
                                         autojunk=False).get_matching_blocks():
        for j in range(block.size):
            mark_a[block.a + j] = False
            mark_b[block.b + j] = False
    return mark_a, mark_b

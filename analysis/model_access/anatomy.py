"""A model's anatomy: the one place that knows where things are inside a Hugging Face model.

Every analysis asks this module for the decoder layers, the attention modules and their head layout
(query / key-value heads, sliding windows), the embeddings, the final norm, the unembedding, where a
VLM's image tokens sit and their patch grid, and it records a layer's output with `capture`. A model
this module cannot read gets one `AnatomyError` that names what could not be found.

Works on a bare `torch.nn.Module` (a `*ForCausalLM` or an image-text-to-text model) or on a
`ModelHandle` (then its processor is consulted too). A VLM's language model is found through
`get_decoder()`, so its vision tower's layers are never mistaken for the decoder's.

A panel that only needs a forward pass's values (layer outputs, attention, logits, patches, gradients)
asks `analysis.backends` instead of hooking the model itself: the same request then runs by hooks here,
by nnsight here, or on NDIF, as the deployment configures; `Capture` below stays for the analyses that
drive the model in their own loops (the reconstruction attack's search, cost calibration).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from analysis.framework.errors import AnatomyError, ModelLoadError, ModelRunError  # noqa: F401  (AnatomyError, ModelRunError: re-exported)

FINAL_NORM_NAMES = ("norm", "final_layernorm", "final_layer_norm", "ln_f", "norm_f")
LAYER_LIST_NAMES = ("layers", "h", "blocks", "layer")


def _model(obj: Any) -> torch.nn.Module:
    return getattr(obj, "model", obj) if not isinstance(obj, torch.nn.Module) else obj


def _name(obj: Any) -> str:
    spec = getattr(obj, "spec", None)
    if spec is not None:
        return spec.label
    model = _model(obj)
    return (getattr(model.config, "architectures", None) or [type(model).__name__])[0]


def text_config(obj: Any):
    return _model(obj).config.get_text_config()


# ---------------------------------------------------------------------------------------------
# Decoder, layers, attention


def decoder(obj: Any) -> torch.nn.Module:
    """The text decoder (the module that holds the embeddings, the layer list and the final norm)."""
    model = _model(obj)
    dec = None
    with contextlib.suppress(AttributeError, NotImplementedError, TypeError):
        dec = model.get_decoder()
    if isinstance(dec, torch.nn.Module) and _layer_list(dec) is not None:
        return dec
    for module in (model, getattr(model, "model", None), getattr(model, "transformer", None)):
        if isinstance(module, torch.nn.Module) and _layer_list(module) is not None:
            return module
    raise AnatomyError(f"Could not find the text decoder of {_name(obj)} (its decoder-layer list).")


def _layer_list(module: torch.nn.Module) -> torch.nn.ModuleList | None:
    for name in LAYER_LIST_NAMES:
        found = getattr(module, name, None)
        if isinstance(found, torch.nn.ModuleList) and len(found) > 0:
            return found
    inner = getattr(module, "decoder", None)  # OPT: OPTModel.decoder.layers
    if isinstance(inner, torch.nn.Module) and inner is not module:
        return _layer_list(inner)
    return None


def decoder_layers(obj: Any) -> torch.nn.ModuleList:
    """The decoder blocks, in order (Llama-family `model.layers`, GPT-2 `transformer.h`, OPT, NeoX, VLMs)."""
    layers = _layer_list(decoder(obj))
    n = getattr(text_config(obj), "num_hidden_layers", None)
    if layers is None or (n is not None and len(layers) != int(n)):
        raise AnatomyError(f"Could not find the {n} decoder layers of {_name(obj)}.")
    return layers


def n_layers(obj: Any) -> int:
    return len(decoder_layers(obj))


def check_layer(obj: Any, layer: int, *, embeddings: bool = False) -> int:
    """`layer` as an int in range (0..n-1, or 0..n where 0 is the embeddings); else AnatomyError."""
    n = n_layers(obj)
    low, high = (0, n) if embeddings else (0, n - 1)
    try:
        layer = int(layer)
    except (TypeError, ValueError):
        raise AnatomyError(f"Layer '{layer}' is not a number.") from None
    if not low <= layer <= high:
        what = f"layers 0 (embeddings) to {n}" if embeddings else f"{n} decoder layers (0-{n - 1})"
        raise AnatomyError(f"Layer {layer} is out of range: {_name(obj)} has {what}.")
    return layer


def attention_modules(obj: Any) -> dict[int, torch.nn.Module]:
    """The self-attention module of every decoder layer, by layer index."""
    found: dict[int, torch.nn.Module] = {}
    for i, block in enumerate(decoder_layers(obj)):
        for name, module in block.named_modules():
            if name and type(module).__name__.endswith("Attention") and not getattr(module, "is_cross_attention", False):
                found[i] = module
                break
    if not found:
        raise AnatomyError(f"Could not find the attention modules of {_name(obj)}.")
    return found


MLP_NAMES = ("mlp", "feed_forward", "ffn", "fc2")  # OPT has no MLP module: its fc2 output is the MLP's
OUT_PROJ_NAMES = ("o_proj", "c_proj", "out_proj", "dense")


def mlp_module(obj: Any, layer: int) -> torch.nn.Module:
    """Decoder layer `layer`'s MLP (its output is what the MLP adds to the residual stream)."""
    block = decoder_layers(obj)[check_layer(obj, layer)]
    for name in MLP_NAMES:
        found = getattr(block, name, None)
        if isinstance(found, torch.nn.Module):
            return found
    raise AnatomyError(f"Could not find the MLP of layer {layer} of {_name(obj)}.")


def residual_writers(obj: Any, layer: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(attention's, MLP's): the modules whose outputs decoder layer `layer` adds to its residual stream.
    The attention module and the MLP, except where the layer norms their outputs first (Gemma 2/3's
    "sandwich" norms: then those norms); OPT's MLP is its fc2."""
    block = decoder_layers(obj)[check_layer(obj, layer)]
    if isinstance(getattr(block, "pre_feedforward_layernorm", None), torch.nn.Module):
        return block.post_attention_layernorm, block.post_feedforward_layernorm
    return attention_modules(obj)[layer], mlp_module(obj, layer)


def output_projection(obj: Any, layer: int) -> torch.nn.Module:
    """The attention's output projection in layer `layer`: its input holds every head's output side by
    side (B, T, H * d)."""
    attn = attention_modules(obj)[check_layer(obj, layer)]
    for name in OUT_PROJ_NAMES:
        found = getattr(attn, name, None)
        if isinstance(found, torch.nn.Linear) or type(found).__name__ == "Conv1D":
            return found
    raise AnatomyError(f"Could not find the attention output projection of layer {layer} of {_name(obj)}.")


@dataclass(frozen=True)
class HeadLayout:
    """Per-layer attention shape: query heads share key-value heads in groups (GQA)."""

    heads: int
    kv_heads: int
    head_dim: int
    windows: tuple[int | None, ...]  # per layer: sliding-window length, None for full attention

    @property
    def groups(self) -> int:
        return self.heads // self.kv_heads

    @property
    def sliding_layers(self) -> list[int]:
        return [i for i, w in enumerate(self.windows) if w is not None]

    @property
    def full_layers(self) -> list[int]:
        return [i for i, w in enumerate(self.windows) if w is None]


def head_layout(obj: Any) -> HeadLayout:
    """Heads, KV heads, head dim and sliding windows, read from the text config (GPT-2 names too)."""
    cfg = text_config(obj)
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", None)
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None)
    if not heads or not hidden:
        raise AnatomyError(f"{_name(obj)} has no attention-head count in its config, so it is not a "
                           "transformer with attention layers that the panels can inspect.")
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    n = int(getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", 0))
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if types:
        windows = tuple(window if t == "sliding_attention" else None for t in types)
    else:  # e.g. Mistral: one window for every layer when set
        windows = tuple(window for _ in range(n))
    return HeadLayout(int(heads), int(kv_heads), int(head_dim), windows)


# ---------------------------------------------------------------------------------------------
# Embeddings, final norm, unembedding


def input_embeddings(obj: Any) -> torch.nn.Embedding:
    emb = _model(obj).get_input_embeddings()
    if emb is None:
        raise AnatomyError(f"Could not find the token embeddings of {_name(obj)}.")
    return emb


def unembedding(obj: Any) -> torch.nn.Module:
    """The output projection (lm_head) from the residual stream to the vocabulary."""
    head = _model(obj).get_output_embeddings()
    if head is None:
        raise AnatomyError(f"Could not find the unembedding (lm_head) of {_name(obj)}.")
    return head


def final_norm(obj: Any) -> torch.nn.Module | None:
    """The norm applied to the last layer's output before the unembedding (None if there is none)."""
    dec = decoder(obj)
    for holder in (dec, getattr(dec, "decoder", None)):
        for name in FINAL_NORM_NAMES:
            norm = getattr(holder, name, None) if holder is not None else None
            if isinstance(norm, torch.nn.Module):
                return norm
    return None


def final_norm_scale(obj: Any) -> torch.Tensor | None:
    """The final norm's per-dimension scale as applied: Gemma's RMSNorm multiplies by (1 + weight)."""
    norm = final_norm(obj)
    weight = getattr(norm, "weight", None)
    if weight is None:
        return None
    weight = weight.detach().float()
    return 1.0 + weight if type(norm).__name__.startswith("Gemma") else weight


def logit_softcap(obj: Any) -> float | None:
    """Gemma 2's final logit soft-capping (logits = cap * tanh(logits / cap)), if any."""
    cap = getattr(text_config(obj), "final_logit_softcapping", None)
    return float(cap) if cap else None


# ---------------------------------------------------------------------------------------------
# Image tokens


def image_token_id(obj: Any) -> int:
    """The id of the placeholder token a VLM's processor repeats once per image feature.

    Read from the model's config (`image_token_id` / `image_token_index`), else the processor's;
    never a hard-coded id.
    """
    model, processor = _model(obj), getattr(obj, "processor", None)
    for holder in (model.config, processor, getattr(processor, "tokenizer", None)):
        for key in ("image_token_id", "image_token_index"):
            value = getattr(holder, key, None)
            if isinstance(value, int) and value >= 0:
                return value
    token = getattr(processor, "image_token", None)
    tok = getattr(obj, "tokenizer", None) or getattr(processor, "tokenizer", None)
    if isinstance(token, str) and tok is not None:
        value = tok.convert_tokens_to_ids(token)
        if isinstance(value, int) and value != getattr(tok, "unk_token_id", None):
            return value
    raise AnatomyError(f"Could not find the image token of {_name(obj)} (no image_token_id in its "
                       "config or processor).")


def image_token(obj: Any) -> str:
    """The image placeholder as text (what a prompt writes where the image goes)."""
    processor = getattr(obj, "processor", None)
    token = getattr(processor, "image_token", None)
    if isinstance(token, str) and token:
        return token
    tok = getattr(obj, "tokenizer", None) or getattr(processor, "tokenizer", None)
    if tok is None:
        raise AnatomyError(f"Could not find the image token text of {_name(obj)} (no tokenizer).")
    return tok.convert_ids_to_tokens(image_token_id(obj))


def image_mask(obj: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """Boolean mask, same shape as `input_ids`, of the positions that hold image features."""
    return input_ids == image_token_id(obj)


@dataclass(frozen=True)
class ImageGrid:
    """How one image's tokens map to patches: the first rows x cols image tokens are the base
    image's patches in row-major order; `tokens` may be larger (LLaVA-NeXT's high-resolution tiles)."""

    rows: int
    cols: int
    tokens: int  # image tokens per image


def patch_grid(obj: Any, inputs: dict | None = None) -> ImageGrid:
    """The patch grid of the model's image tokens; from `inputs` (a processor output) when given."""
    model = _model(obj)
    cfg = model.config
    if inputs is not None and "input_ids" in inputs:
        ids = inputs["input_ids"]
        per_row = int(image_mask(obj, ids[:1]).sum())
        thw = inputs.get("image_grid_thw")
        if thw is not None:  # Qwen2-VL: (t, h, w) patches, merged spatially by merge_size
            merge = int(getattr(cfg.vision_config, "spatial_merge_size", 1))
            t, h, w = (int(x) for x in thw[0])
            return ImageGrid(h // merge, w // merge, per_row)
        side = _base_side(model)
        if side and side * side <= per_row:
            return ImageGrid(side, side, per_row)
        root = int(round(per_row ** 0.5))
        return ImageGrid(root, root, per_row) if root * root == per_row else ImageGrid(1, per_row, per_row)
    side = _base_side(model)
    if not side:
        raise AnatomyError(f"Could not find the image patch grid of {_name(obj)}.")
    return ImageGrid(side, side, side * side)


def vision_parameters(obj: Any) -> int:
    """Parameters outside the text decoder and its unembedding: a VLM's vision tower and projector
    (0 for a language model)."""
    model = _model(obj)
    text = {id(p) for m in (decoder(model), unembedding(model)) for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in text)


def vision_patches(obj: Any, inputs: dict) -> int:
    """Patches the vision tower reads for the images of `inputs` (a processor output): H/p x W/p per
    image or tile; Qwen2-VL's processor hands over the patches themselves, one row each."""
    pixels = inputs.get("pixel_values")
    if pixels is None:
        return 0
    if pixels.dim() == 2:
        return int(pixels.shape[0])
    patch = int(getattr(_model(obj).config.vision_config, "patch_size", 0) or 0)
    if not patch:
        raise AnatomyError(f"Could not find the vision patch size of {_name(obj)}.")
    images = int(torch.tensor(pixels.shape[:-3]).prod())
    return images * (pixels.shape[-2] // patch) * (pixels.shape[-1] // patch)


def _base_side(model: torch.nn.Module) -> int:
    """Patches per side of one image (or one tile) after the projector's merging."""
    cfg = model.config
    vc = getattr(cfg, "vision_config", None)
    if vc is None:
        return 0
    tokens = getattr(cfg, "mm_tokens_per_image", None)  # Gemma 3: pooled to a fixed count
    if tokens:
        return int(round(int(tokens) ** 0.5))
    size, patch = getattr(vc, "image_size", None), getattr(vc, "patch_size", None)
    if not size or not patch:
        return 0
    side = int(size) // int(patch)
    side //= int(getattr(cfg, "scale_factor", 1) or 1)  # Idefics3's pixel shuffle
    side //= int(getattr(vc, "spatial_merge_size", 1) or 1)
    return side


# ---------------------------------------------------------------------------------------------
# Capture-and-stop


class StopForward(Exception):
    """Raised by a capture hook: the layers after the captured one are not needed."""


class Capture:
    """Records the residual stream at one decoder layer's input (`before`) or output, and stops the
    forward there while `stop` is true. `run(fn)` calls a forward and swallows the stop."""

    def __init__(self, layer: int, before: bool = False, stop: bool = True) -> None:
        self.layer, self.before, self.stop = layer, before, stop
        self.output: torch.Tensor | None = None

    def _pre(self, module, args, kwargs):
        self.output = args[0] if args else kwargs["hidden_states"]
        if self.stop:
            raise StopForward

    def _post(self, module, args, output):
        self.output = output[0] if isinstance(output, tuple) else output
        if self.stop:
            raise StopForward

    def attach(self, patch, obj: Any) -> "Capture":
        """Hook the layer through `patch` (a `ModelHandle.patch()`), which removes it on exit."""
        block = decoder_layers(obj)[check_layer(obj, self.layer)]
        if self.before:
            patch.hook(block, self._pre, pre=True, with_kwargs=True)
        else:
            patch.hook(block, self._post)
        return self

    def run(self, fn: Callable, *args, **kwargs) -> Any:
        """`fn(*args, **kwargs)`, or None when the capture stopped it."""
        try:
            return fn(*args, **kwargs)
        except StopForward:
            return None


@contextlib.contextmanager
def capture(handle, layer: int, *, before: bool = False, stop: bool = True) -> Iterator[Capture]:
    """Inside: a forward of `handle.model` records decoder layer `layer`'s output (its input with
    `before`) into `.output` and, with `stop`, skips the layers above. Holds the model's lock; the
    hook is removed on exit. A forward stopped inside the block ends the block quietly."""
    with handle.patch() as patch:
        cap = Capture(layer, before=before, stop=stop).attach(patch, handle.model)
        try:
            yield cap
        except StopForward:
            pass


# ---------------------------------------------------------------------------------------------
# Errors from inside the model


def raised_by_model(exc: BaseException) -> bool:
    """True when `exc` was raised inside a transformers model's code (its forward, generate or
    processor), not by ours: the CLI then reports it as one line naming the model and the step."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return any("/transformers/" in f.filename or "/torch/nn/" in f.filename for f in frames[-3:])


PASS_THROUGH: tuple[type[BaseException], ...] = (ModelLoadError, StopForward, KeyboardInterrupt)


@contextlib.contextmanager
def model_step(obj: Any, step: str) -> Iterator[None]:
    """Turn an error raised by the model while doing `step` into one `ModelRunError` line that names
    the model and the step (errors meant for the user already pass through unchanged). Steps nest: a
    panel's step ("collecting layer-0 activations") runs the backend's ("running the model"), and the
    message names the outermost, the one the user asked for."""
    from analysis.framework.registry import SettingsError

    try:
        yield
    except ModelRunError as exc:
        if exc.detail is None:
            raise
        raise ModelRunError(f"{_name(obj)} failed while {step}: {exc.detail}", exc.detail) from exc.__cause__
    except (*PASS_THROUGH, SettingsError):
        raise
    except Exception as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise ModelRunError(f"{_name(obj)} failed while {step}: {detail}", detail) from exc


def require_processor(handle, panel: str) -> Any:
    """The VLM's processor, or one clear refusal saying why this panel cannot show it images."""
    if handle.processor is None:
        why = getattr(handle, "processor_error", "") or "it has no processor"
        raise AnatomyError(f"The {panel} panel needs {handle.spec.label}'s image processor, but {why}.")
    return handle.processor


def image_prompt(handle, text: str) -> str:
    """A one-image user turn: the processor's chat template when it has one, else '<image> text'."""
    processor = getattr(handle, "processor", None)
    if getattr(processor, "chat_template", None):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return f"{image_token(handle)} {text}"

"""Where a decoder layer adds to the residual stream, and how a norm acts on a sum of parts.

Built on `analysis.model_access.anatomy` (the decoder layers, attention modules, what each layer adds to the
residual stream, final norm, unembedding; the backend seam reads and writes the same modules), per layer:

- `out_proj`: the attention's output projection; its input holds every head's output side by side
  (B, T, heads * head_dim), so a head is a slice of it (patched there, read there);
- `attn_add` / `mlp_add`: the modules whose outputs are what the layer adds to the residual stream:
  the attention module and the MLP, or the norms Gemma 2/3 put on their outputs ("sandwich" norms),
  or OPT's fc2 (OPT has no MLP module);
- `attn_norm`: Gemma's post-attention sandwich norm (None elsewhere): a head's share of the attention
  output passes through it, linearised at the whole output (`NormLinear`).

`NormLinear` writes an RMSNorm or a LayerNorm, evaluated at a total x, as a linear map applied to each
part of x (its scale 1/rms(x) or 1/std(x) frozen at x): the parts then sum exactly to norm(x), minus
the norm's bias. Direct logit attribution rests on it (the final norm frozen at the last residual).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from analysis.model_access import anatomy
from analysis.framework.errors import AnatomyError


@dataclass(frozen=True)
class LayerParts:
    block: torch.nn.Module
    attention: torch.nn.Module
    out_proj: torch.nn.Module
    attn_add: torch.nn.Module  # its output is what the attention adds to the residual
    mlp_add: torch.nn.Module  # its output is what the MLP adds
    attn_norm: torch.nn.Module | None  # Gemma 2/3: the norm on the attention output (a head passes it)


def layer_parts(obj) -> list[LayerParts]:
    """The parts of every decoder layer, in order; AnatomyError naming what is missing."""
    attentions = anatomy.attention_modules(obj)
    out = []
    for i, block in enumerate(anatomy.decoder_layers(obj)):
        attn_add, mlp_add = anatomy.residual_writers(obj, i)
        attention = attentions[i]
        attn_norm = attn_add if attn_add is not attention else None
        out.append(LayerParts(block, attention, anatomy.output_projection(obj, i), attn_add, mlp_add, attn_norm))
    return out


def head_weights(parts: LayerParts, heads: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W, bias): W (heads, head_dim, D) maps head h's output z_h to its share z_h @ W[h] of the projection;
    the bias (D,) belongs to no head. GPT-2's Conv1D stores its weight transposed."""
    proj = parts.out_proj
    weight = proj.weight.detach().float()
    if type(proj).__name__ == "Conv1D":  # y = x @ W + b, W (in, out)
        w = weight
    else:  # nn.Linear: y = x @ W.T + b
        w = weight.T
    d_in = w.shape[0]
    if d_in % heads:
        raise AnatomyError(f"The attention output projection takes {d_in} inputs, not a multiple of {heads} heads.")
    bias = getattr(proj, "bias", None)
    return w.reshape(heads, d_in // heads, w.shape[1]), (bias.detach().float() if bias is not None else None)


@dataclass(frozen=True)
class NormLinear:
    """A norm frozen at a total x: `part(c)` is c's share of norm(x); the shares of parts summing to x add
    up to norm(x) - bias. rms: x * g / sqrt(mean(x^2) + eps); layer: (x - mean x) * g / sqrt(var x + eps) + b."""

    kind: str  # "rms" | "layer"
    gain: torch.Tensor  # (D,) the weight as applied (Gemma: 1 + weight)
    bias: torch.Tensor | None
    eps: float

    @classmethod
    def of(cls, norm: torch.nn.Module | None, width: int) -> "NormLinear":
        if norm is None:  # no norm: the identity
            return cls("none", torch.ones(width), None, 0.0)
        weight = getattr(norm, "weight", None)
        gain = weight.detach().float() if weight is not None else torch.ones(width)
        if type(norm).__name__.startswith("Gemma"):
            gain = 1.0 + gain
        eps = getattr(norm, "eps", None)
        eps = getattr(norm, "variance_epsilon", 1e-6) if eps is None else eps
        bias = getattr(norm, "bias", None)
        kind = "layer" if isinstance(norm, torch.nn.LayerNorm) else "rms"
        return cls(kind, gain, bias.detach().float() if bias is not None else None, float(eps))

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """1/rms(x) or 1/std(x) over the last axis, keepdim (ones for no norm)."""
        x = x.float()
        if self.kind == "none":
            return torch.ones_like(x[..., :1])
        if self.kind == "layer":
            return torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + self.eps)
        return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def part(self, c: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """c's share of norm(x), `scale` = self.scale(x) broadcast to c."""
        c = c.float()
        if self.kind == "layer":
            c = c - c.mean(-1, keepdim=True)
        return c * scale * self.gain.to(c.device)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        out = self.part(x, self.scale(x))
        return out + self.bias.to(out.device) if self.bias is not None else out


def final_norm_linear(obj) -> NormLinear:
    width = anatomy.unembedding(obj).weight.shape[1]
    return NormLinear.of(anatomy.final_norm(obj), width)


def unembedding_rows(obj, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The unembedding's rows (len(ids), D) of these tokens, and their biases (None without)."""
    head = anatomy.unembedding(obj)
    rows = head.weight.detach()[ids].float()
    bias = getattr(head, "bias", None)
    return rows, (bias.detach()[ids].float() if bias is not None else None)


def project_out(obj) -> torch.nn.Module | None:
    """OPT's projection from the hidden size to the embedding size after the final norm (None elsewhere)."""
    dec = anatomy.decoder(obj)
    for holder in (dec, getattr(dec, "decoder", None)):
        found = getattr(holder, "project_out", None) if holder is not None else None
        if isinstance(found, torch.nn.Module):
            return found
    return None

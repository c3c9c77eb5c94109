"""Direct logit attribution: how much each layer's attention and MLP, and each head, writes the target's
logit (minus the foil's) straight into the last position's residual stream.

The final residual x_L is the embeddings plus every layer's attention and MLP outputs. With the final
norm frozen at x_L (its 1/rms or 1/std fixed, `NormLinear`), the logit is linear in those parts, so
each part's share c -> (norm_frozen(c) . (u_target - u_foil)) adds up exactly to the model's logit
difference before any soft-cap. A head's share is its slice of the output projection (through Gemma's
sandwich norm frozen at the whole attention output); the projection's bias belongs to no head.
"""
from __future__ import annotations

import torch

from analysis.residual.hooks import Trace
from analysis.residual.records import Dla
from analysis.residual.sites import NormLinear, final_norm_linear, head_weights, layer_parts, project_out, unembedding_rows


def direction(lm: torch.nn.Module, target: int, foil: int | None) -> tuple[torch.Tensor, float]:
    """(u, constant): the logit difference is norm(x) . u + constant (unembedding biases, OPT's projection)."""
    ids = [target] if foil is None else [target, foil]
    rows, bias = unembedding_rows(lm, ids)
    u = rows[0] - rows[1] if foil is not None else rows[0]
    const = 0.0 if bias is None else float(bias[0] - bias[1] if foil is not None else bias[0])
    proj = project_out(lm)
    if proj is not None:  # logits = W_U (P y + p): u . (P y + p) = (u P) . y + u . p
        if getattr(proj, "bias", None) is not None:
            const += float(u @ proj.bias.detach().float())
        u = u @ proj.weight.detach().float()
    return u, const


def attribute(lm: torch.nn.Module, tr: Trace, target: int, foil: int | None, heads: int,
              position: int = -1) -> Dla:
    """The direct logit attribution of a trace that recorded resid, attn, mlp and z (batch row 0)."""
    parts = layer_parts(lm)
    n = len(parts)
    final = final_norm_linear(lm)
    x = tr.acts["resid"][n][0, position].float()
    scale = final.scale(x)
    u, const = direction(lm, target, foil)

    def value(c: torch.Tensor) -> float:
        return float(final.part(c.float(), scale) @ u)

    attn = [value(tr.acts["attn"][i][0, position]) for i in range(n)]
    mlp = [value(tr.acts["mlp"][i][0, position]) for i in range(n)]
    head_rows = []
    for i, p in enumerate(parts):
        w, bias = head_weights(p, heads)
        z = tr.acts["z"][i][0, position].float().reshape(heads, -1)
        shares = torch.einsum("hd,hdo->ho", z, w)  # (heads, D): each head's part of the projection
        if p.attn_norm is not None:  # Gemma 2/3: through the sandwich norm, frozen at the whole output
            whole = shares.sum(0) + (bias if bias is not None else 0.0)
            inner = NormLinear.of(p.attn_norm, whole.shape[-1])
            shares = inner.part(shares, inner.scale(whole))
        head_rows.append([value(s) for s in shares])
    bias_term = float(final.bias @ u) if final.bias is not None else 0.0
    embed = value(tr.acts["resid"][0][0, position])
    total = embed + sum(attn) + sum(mlp) + bias_term + const
    return Dla(target=target, foil=foil, position=position % tr.acts["resid"][0].shape[1],
               embed=embed, attn=attn, mlp=mlp, heads=head_rows, constant=bias_term + const, total=total)

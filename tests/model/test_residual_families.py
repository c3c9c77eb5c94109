"""The residual-stream panel on a tiny model of every supported family (and every VLM's language model):
the logit lens at the last state is the model's own logits, the layers' attention and MLP outputs add up to
the last state, each head's share adds up to its layer's attention output, and the direct logit attribution
adds up to the model's logit difference. Plain hooks written here (not the panel's) give the reference
activations of exact patching on GPT-2 and Gemma 2."""
from __future__ import annotations

import pytest
import torch

from analysis.model_access import anatomy, tiny_models
from analysis.model_access.models import ModelHandle, ModelSpec, causal_lm_view, describe
from analysis.residual import ResidualParams, analysis
from analysis.residual.hooks import SITES, trace
from analysis.residual.sites import NormLinear, head_weights, layer_parts

FAMILIES = list(tiny_models.FAMILIES)


def handle_of(family: str) -> ModelHandle:
    kind = tiny_models.FAMILIES[family][0]
    model, tok, _ = tiny_models.build_tiny(family)
    lm = causal_lm_view(model) if kind == "vlm" else model
    return ModelHandle(spec=ModelSpec("local", f"tiny-{family}"), model=model, kind=kind,
                       info=describe(model, kind), language_model=lm, tokenizer=tok)


def words(handle, n: int = 6, shift: int = 0) -> str:
    vocab = [w for w in tiny_models.default_words()[5 + shift: 5 + shift + n]]
    if handle.spec.name.endswith("qwen2"):  # a character tokenizer: one letter per token
        return " ".join("abcdefghij"[shift: shift + n])
    return " ".join(vocab)


@pytest.mark.parametrize("family", FAMILIES)
def test_lens_decomposition_and_attribution_add_up(family):
    h = handle_of(family)
    lm = h.language_model
    ids = torch.tensor([h.tokenizer(words(h), add_special_tokens=False)["input_ids"]])
    tr = trace(h, ids, want=SITES)
    with torch.no_grad():
        own = lm(input_ids=ids, use_cache=False).logits
    params = ResidualParams(pair="own", prompt=words(h), corrupt="x", top_k=2)
    result = analysis.inspect(h, params)
    assert result.lens.last_gap <= 1e-5, family  # the logit lens at the last state: the model's logits
    assert torch.allclose(tr.logits, own, atol=1e-5)
    n = anatomy.n_layers(lm)
    total = tr.acts["resid"][0] + sum(tr.acts["attn"][i] + tr.acts["mlp"][i] for i in range(n))
    assert torch.allclose(total, tr.acts["resid"][n], atol=1e-4), family
    heads = anatomy.head_layout(lm).heads
    for i, p in enumerate(layer_parts(lm)):
        w, bias = head_weights(p, heads)
        z = tr.acts["z"][i][0].float()
        shares = torch.einsum("thd,hdo->tho", z.reshape(z.shape[0], heads, -1), w)
        whole = shares.sum(1) + (bias if bias is not None else 0)
        if p.attn_norm is not None:
            assert torch.allclose(NormLinear.of(p.attn_norm, whole.shape[-1]).apply(whole), p.attn_norm(whole), atol=1e-5)
            whole = p.attn_norm(whole)
        assert torch.allclose(whole, tr.acts["attn"][i][0], atol=1e-4), (family, i)
    dla = result.dla
    assert abs(dla.total - dla.model_value) <= 1e-3 * max(1.0, abs(dla.model_value)), family
    assert abs(sum(map(sum, dla.heads)) - sum(dla.attn)) <= 1e-3 or any(
        getattr(p.out_proj, "bias", None) is not None for p in layer_parts(lm)), family


def plain_hook_metric(h: ModelHandle, blocks, ids, layer: int, position: int, value, target: int, foil: int) -> float:
    """Residual state `layer` (>= 1: the output of block layer - 1) at `position` replaced by `value`,
    with a hook written here."""
    def hook(module, args, output):
        out = (output[0] if isinstance(output, tuple) else output).clone()
        out[0, position] = value
        return (out, *output[1:]) if isinstance(output, tuple) else out
    handle = blocks[layer - 1].register_forward_hook(hook)
    try:
        with torch.no_grad():
            logits = h.language_model(input_ids=ids, use_cache=False).logits[0, -1]
    finally:
        handle.remove()
    return float(logits[target] - logits[foil])


@pytest.mark.parametrize("family", ["gpt2", "gemma2", "gpt-neox"])
def test_exact_residual_patching_equals_plain_hooks(family):
    h = handle_of(family)
    blocks = anatomy.decoder_layers(h.language_model)
    clean_text, corrupt_text = words(h), words(h).replace("w7", "w30")
    tok = h.tokenizer
    clean = torch.tensor([tok(clean_text, add_special_tokens=False)["input_ids"]])
    corrupt = torch.tensor([tok(corrupt_text, add_special_tokens=False)["input_ids"]])
    target, foil = tok.convert_tokens_to_ids(["w50", "w51"])
    states = {}
    hooks = [b.register_forward_hook(lambda m, a, o, i=i: states.__setitem__(i + 1, (o[0] if isinstance(o, tuple) else o)[0].clone()))
             for i, b in enumerate(blocks)]
    with torch.no_grad():
        base = h.language_model(input_ids=torch.cat([clean, corrupt]), use_cache=False).logits[:, -1]
    for x in hooks:
        x.remove()
    with torch.no_grad():  # the states of the clean run alone (the batch above recorded both rows)
        hooks = [b.register_forward_hook(lambda m, a, o, i=i: states.__setitem__(i + 1, (o[0] if isinstance(o, tuple) else o)[0].clone()))
                 for i, b in enumerate(blocks)]
        h.language_model(input_ids=clean, use_cache=False)
        for x in hooks:
            x.remove()
    m_clean, m_corrupt = [float(base[r, target] - base[r, foil]) for r in (0, 1)]
    params = ResidualParams(pair="own", prompt=clean_text, corrupt=corrupt_text, answer="w50", foil="w51",
                            components=["residual"], methods=["exact"], batch=4)
    result = analysis.patch(h, params)
    grid = result.grid("residual", "exact").share
    for layer in range(1, len(blocks)):
        for p in range(clean.shape[1]):
            m = plain_hook_metric(h, blocks, corrupt, layer, p, states[layer][p], target, foil)
            assert abs(grid[layer][p] - (m - m_corrupt) / (m_clean - m_corrupt)) <= 1e-5, (family, layer, p)

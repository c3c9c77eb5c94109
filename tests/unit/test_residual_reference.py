"""The residual-stream panel against an independent float64 Llama written out by hand (embeddings, RMSNorm,
rotary attention with grouped KV heads, SiLU MLP: transformers' modeling_llama.py as the reference), with
no hooks: its states, heads, lens, logit attribution, exact patching and attribution patching must match the
panel's (<= 1e-5)."""
from __future__ import annotations

import math

import pytest
import torch

from analysis.model_access import tiny_models
from analysis.model_access.models import ModelHandle, ModelSpec, describe
from analysis.residual import ResidualParams, analysis
from analysis.residual.hooks import SITES, trace

TOL = 1e-5


def close(a, b, tol=TOL) -> bool:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


@pytest.fixture(scope="module")
def llama():
    model, tok, _ = tiny_models.build_tiny("llama")
    return ModelHandle(spec=ModelSpec("local", "tiny-llama-reference"), model=model, kind="causal_lm",
                       info=describe(model, "causal_lm"), language_model=model, tokenizer=tok)


def rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def reference(model, ids: list[int], patch=None, grad: bool = False):
    """The forward in float64, step by step. `patch` = (site, layer, index, value): resid state `layer` at
    position `index`; head `index`'s z slice; a layer's attention or MLP output (index None)."""
    cfg, m = model.config, model.model
    W = lambda t: t.detach().double()  # noqa: E731
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    d, eps, n = cfg.hidden_size // heads, cfg.rms_norm_eps, len(ids)
    inv = 1.0 / cfg.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    rot = lambda v: torch.cat([-v[..., d // 2:], v[..., :d // 2]], -1)  # noqa: E731
    acts = {"resid": [], "z": [], "attn": [], "mlp": []}

    def touch(site, layer, t):
        if patch and patch[0] == site and patch[1] == layer:
            t = t.clone()
            if site == "resid":
                t[patch[2]] = patch[3]
            elif site == "z":
                t[:, patch[2] * d:(patch[2] + 1) * d] = patch[3]
            else:
                t = patch[3].clone()
        if grad:
            t = t if t.requires_grad else t.requires_grad_(True)
        acts[site].append(t)
        return t

    x = touch("resid", 0, W(m.embed_tokens.weight)[ids])
    causal = torch.full((n, n), -math.inf, dtype=torch.float64).triu(1)
    for i, layer in enumerate(m.layers):
        a = layer.self_attn
        h = rms(x, W(layer.input_layernorm.weight), eps)
        q = (h @ W(a.q_proj.weight).T).reshape(n, heads, d)
        k = (h @ W(a.k_proj.weight).T).reshape(n, kv, d)
        v = (h @ W(a.v_proj.weight).T).reshape(n, kv, d)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        outs = []
        for head in range(heads):
            g = head // (heads // kv)
            p = torch.softmax(q[:, head] @ k[:, g].T / math.sqrt(d) + causal, -1)
            outs.append(p @ v[:, g])
        z = touch("z", i, torch.cat(outs, -1))
        x = x + touch("attn", i, z @ W(a.o_proj.weight).T)
        h = rms(x, W(layer.post_attention_layernorm.weight), eps)
        mlp = layer.mlp
        up = torch.nn.functional.silu(h @ W(mlp.gate_proj.weight).T) * (h @ W(mlp.up_proj.weight).T)
        x = x + touch("mlp", i, up @ W(mlp.down_proj.weight).T)
        x = touch("resid", i + 1, x)
    logits = rms(x, W(m.norm.weight), eps) @ W(model.lm_head.weight).T
    return acts, logits


IDS = [2, 10, 11, 12, 13, 14, 15]
CORRUPT = [2, 10, 11, 40, 13, 14, 15]


def test_states_heads_and_outputs_equal_the_hand_written_forward(llama):
    acts, logits = reference(llama.model, IDS)
    tr = trace(llama, torch.tensor([IDS]), want=SITES)
    for site in SITES:
        for layer, t in tr.acts[site].items():
            assert close(t[0], acts[site][layer]), (site, layer)
    assert close(tr.logits[0], logits)


def test_logit_lens_and_attribution_equal_the_reference(llama):
    acts, logits = reference(llama.model, IDS)
    cfg, m = llama.model.config, llama.model.model
    target, foil = 20, 21
    params = ResidualParams(pair="own", prompt=" ".join(llama.tokenizer.convert_ids_to_tokens(IDS)),
                            corrupt="x", answer="w16", foil="w17", top_k=3)
    assert llama.tokenizer.convert_tokens_to_ids(["w16", "w17"]) == [target, foil]
    result = analysis.inspect(llama, params)
    w_u, g = llama.model.lm_head.weight.detach().double(), m.norm.weight.detach().double()
    final = torch.log_softmax(logits, -1)
    for layer, state in enumerate(acts["resid"]):
        logp = torch.log_softmax(rms(state, g, cfg.rms_norm_eps) @ w_u.T, -1)
        assert close(result.lens.target_prob[layer], logp[:, target].exp())
        assert close(result.lens.kl[layer], (final.exp() * (final - logp)).sum(-1))
    assert result.lens.last_gap == 0.0  # the logit lens at the last state is the model's own logits
    x = acts["resid"][-1][-1]
    scale = g / torch.sqrt((x * x).mean() + cfg.rms_norm_eps)
    u = w_u[target] - w_u[foil]
    share = lambda c: float((c * scale) @ u)  # noqa: E731
    assert close(result.dla.attn, [share(t[-1]) for t in acts["attn"]])
    assert close(result.dla.mlp, [share(t[-1]) for t in acts["mlp"]])
    heads = llama.model.config.num_attention_heads
    d = cfg.hidden_size // heads
    wo = llama.model.model.layers[0].self_attn.o_proj.weight.detach().double()
    z = acts["z"][0][-1]
    assert close(result.dla.heads[0], [share(z[h * d:(h + 1) * d] @ wo[:, h * d:(h + 1) * d].T) for h in range(heads)])
    assert close(result.dla.total, float(logits[-1, target] - logits[-1, foil]))


def _metric(logits, target=20, foil=21):
    return float(logits[-1, target] - logits[-1, foil])


def test_exact_and_attribution_patching_equal_the_reference(llama):
    tok = llama.tokenizer
    words = lambda ids: " ".join(tok.convert_ids_to_tokens(ids))  # noqa: E731
    params = ResidualParams(pair="own", prompt=words(IDS), corrupt=words(CORRUPT), answer="w16", foil="w17",
                            components=["residual", "heads", "attention", "mlp"], batch=5)
    result = analysis.patch(llama, params)
    clean, _ = reference(llama.model, IDS)
    m_clean, m_corrupt = _metric(reference(llama.model, IDS)[1]), _metric(reference(llama.model, CORRUPT)[1])
    assert close([result.clean_diff, result.corrupt_diff], [m_clean, m_corrupt])
    share = lambda m: (m - m_corrupt) / (m_clean - m_corrupt)  # noqa: E731
    layers, n, heads = len(clean["attn"]), len(IDS), llama.model.config.num_attention_heads
    d = llama.model.config.hidden_size // heads
    expected = {
        "residual": [[share(_metric(reference(llama.model, CORRUPT, ("resid", i, p, clean["resid"][i][p]))[1]))
                      for p in range(n)] for i in range(layers)],
        "heads": [[share(_metric(reference(llama.model, CORRUPT, ("z", i, h, clean["z"][i][:, h * d:(h + 1) * d]))[1]))
                   for h in range(heads)] for i in range(layers)],
        "attention": [[share(_metric(reference(llama.model, CORRUPT, ("attn", i, None, clean["attn"][i]))[1]))]
                      for i in range(layers)],
        "mlp": [[share(_metric(reference(llama.model, CORRUPT, ("mlp", i, None, clean["mlp"][i]))[1]))]
                for i in range(layers)],
    }
    for name, values in expected.items():
        assert close(result.grid(name, "exact").share, values), name
    # attribution: (a_clean - a_corrupt) . d metric / d a at the corrupted run, from autograd on the reference
    acts, logits = reference(llama.model, CORRUPT, grad=True)
    flat = [(s, i) for s in ("resid", "z", "attn", "mlp") for i in range(len(acts[s]))]
    grads = dict(zip(flat, torch.autograd.grad(logits[-1, 20] - logits[-1, 21], [acts[s][i] for s, i in flat])))
    est = lambda s, i: (clean[s][i] - acts[s][i].detach()) * grads[(s, i)]  # noqa: E731
    attribution = {
        "residual": [est("resid", i).sum(-1).tolist() for i in range(layers)],
        "heads": [est("z", i).reshape(n, heads, d).sum((0, 2)).tolist() for i in range(layers)],
        "attention": [[float(est("attn", i).sum())] for i in range(layers)],
        "mlp": [[float(est("mlp", i).sum())] for i in range(layers)],
    }
    for name, values in attribution.items():
        expected_share = [[v / (m_clean - m_corrupt) for v in row] for row in values]
        assert close(result.grid(name, "attribution").share, expected_share), name

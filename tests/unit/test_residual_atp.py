"""AtP* (QK fix + GradDrop, Kramár et al. 2024) against an independent float64 reference: a Llama forward written
out by hand with plain loops over heads (no hooks, nothing of analysis.residual), on which exact query/key
patching, AtP's and AtP*'s estimates are computed straight from the paper's definitions; and the false-negative
counts reproduced by a plain loop."""
from __future__ import annotations

import math

import pytest
import torch

from analysis.model_access import tiny_models
from analysis.model_access.models import ModelHandle, ModelSpec, describe
from analysis.residual import ResidualParams, analysis

TOL = 1e-4
IDS = [2, 10, 11, 12, 13, 14, 15, 16]
CORRUPT = [2, 10, 11, 40, 13, 14, 15, 16]
TARGET, FOIL = 20, 21


def close(a, b, tol=TOL) -> bool:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from transformers import LlamaForCausalLM

    folder = tiny_models.save_tiny_llama(tmp_path_factory.mktemp("atp"), layers=4, hidden=32, heads=4, kv_heads=2,
                                         seed=3)
    model = LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    tok = tiny_models.make_word_tokenizer(tiny_models.default_words())
    return ModelHandle(spec=ModelSpec("local", "tiny-llama-atp"), model=model, kind="causal_lm",
                       info=describe(model, "causal_lm"), language_model=model, tokenizer=tok)


def forward(model, ids, *, swap=None, drop=None, leaves=False):
    """The float64 forward. `swap` = (layer, head, "q" | "k", value (T, d)): that head's queries or keys (after
    rotary, as the head reads them) replaced; `drop` = layer whose attention and MLP outputs carry no gradient;
    `leaves`: the forward keeps a graph, so the gradient at each head's output z (T, d) can be taken. Returns (metric, {(layer, head): (q, k, v, z)})."""
    cfg, m = model.config, model.model
    W = lambda t: t.detach().double()  # noqa: E731
    heads, kv, eps, n = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.rms_norm_eps, len(ids)
    d = cfg.hidden_size // heads
    rms = lambda x, w: x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w  # noqa: E731
    inv = 1.0 / cfg.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    rot = lambda v: v * cos + torch.cat([-v[:, d // 2:], v[:, :d // 2]], -1) * sin  # noqa: E731
    x = W(m.embed_tokens.weight)[ids].requires_grad_(leaves)  # the graph every z's gradient is taken in
    seen = {}
    for i, layer in enumerate(m.layers):
        a = layer.self_attn
        h = rms(x, W(layer.input_layernorm.weight))
        outs = []
        for head in range(heads):
            g = head // (heads // kv)
            q = rot(h @ W(a.q_proj.weight)[head * d:(head + 1) * d].T)
            k = rot(h @ W(a.k_proj.weight)[g * d:(g + 1) * d].T)
            v = h @ W(a.v_proj.weight)[g * d:(g + 1) * d].T
            if swap and swap[:2] == (i, head):
                q, k = (swap[3], k) if swap[2] == "q" else (q, swap[3])
            rows = []
            for t in range(n):  # query t reads keys 0..t
                scores = torch.stack([q[t] @ k[s] for s in range(t + 1)]) / math.sqrt(d)
                w = torch.exp(scores - scores.max())
                rows.append(sum(w[s] / w.sum() * v[s] for s in range(t + 1)))
            z = torch.stack(rows)
            seen[(i, head)] = (q.detach(), k.detach(), v.detach(), z)
            outs.append(z)
        attn = torch.cat(outs, -1) @ W(a.o_proj.weight).T
        x = x + (attn.detach() if drop == i else attn)
        h = rms(x, W(layer.post_attention_layernorm.weight))
        mlp = layer.mlp
        up = torch.nn.functional.silu(h @ W(mlp.gate_proj.weight).T) * (h @ W(mlp.up_proj.weight).T)
        out = up @ W(mlp.down_proj.weight).T
        seen[("mlp", i)] = out
        x = x + (out.detach() if drop == i else out)
    logits = rms(x, W(m.norm.weight)) @ W(model.lm_head.weight).T
    return logits[-1, TARGET] - logits[-1, FOIL], seen


def softmax_row(q_t, keys, t, d):
    scores = [float(q_t @ keys[s]) / math.sqrt(d) for s in range(t + 1)]
    top = max(scores)
    w = [math.exp(sc - top) for sc in scores]
    return [x / sum(w) for x in w]


def qk_fixed(kind, clean_qkvz, corrupt_qkvz, dz, d):
    """The paper's QK fix for one head, loops: sum_t sum_s (A'_ts - A_ts) (v_s . dm/dz_t)."""
    qc, kc = clean_qkvz[:2]
    q, k, v, _ = corrupt_qkvz
    total = 0.0
    for t in range(len(q)):
        base = softmax_row(q[t], k, t, d)
        patched = softmax_row(qc[t], k, t, d) if kind == "q" else softmax_row(q[t], kc, t, d)
        for s in range(t + 1):
            total += (patched[s] - base[s]) * float(v[s] @ dz[t])
    return total


@pytest.fixture(scope="module")
def result(llama):
    tok = llama.tokenizer
    words = lambda ids: " ".join(tok.convert_ids_to_tokens(ids))  # noqa: E731
    params = ResidualParams(pair="own", prompt=words(IDS), corrupt=words(CORRUPT), answer="w16", foil="w17",
                            components=["queries", "keys", "heads", "mlp"], methods=["exact", "attribution", "atp*"], batch=7)
    return analysis.patch(llama, params)


def test_exact_query_and_key_patching_equal_the_reference(llama, result):
    model = llama.model
    m_clean, clean = forward(model, IDS)
    m_corrupt, _ = forward(model, CORRUPT)
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    assert close([result.clean_diff, result.corrupt_diff], [float(m_clean), float(m_corrupt)])
    for kind, name in (("q", "queries"), ("k", "keys")):
        expected = [[(float(forward(model, CORRUPT, swap=(i, h, kind, clean[(i, h)][0 if kind == "q" else 1]))[0])
                      - float(m_corrupt)) / float(m_clean - m_corrupt) for h in range(H)] for i in range(L)]
        assert close(result.grid(name, "exact").share, expected), name


def _estimates(model, drop=None):
    """{(component, layer, head): the first-order estimate} at the corrupted run, gradient dropped at `drop`."""
    d = model.config.hidden_size // model.config.num_attention_heads
    _, clean = forward(model, IDS)
    metric, corrupt = forward(model, CORRUPT, drop=drop, leaves=True)
    keys = sorted(k for k in corrupt if k[0] != "mlp")
    mlps = [("mlp", i) for i in range(model.config.num_hidden_layers)]
    found = torch.autograd.grad(metric, [corrupt[key][3] for key in keys] + [corrupt[k] for k in mlps],
                                allow_unused=True)
    grads = dict(zip(keys + mlps, found))
    out = {}
    for key in mlps:
        dm = grads[key] if grads[key] is not None else torch.zeros_like(corrupt[key])
        out[key + (0,)] = float(((clean[key] - corrupt[key].detach()) * dm).sum())
    for key in keys:
        dz = grads[key] if grads[key] is not None else torch.zeros_like(corrupt[key][3])
        out[("queries",) + key] = qk_fixed("q", clean[key], corrupt[key], dz, d)
        out[("keys",) + key] = qk_fixed("k", clean[key], corrupt[key], dz, d)
        out[("heads",) + key] = float(((clean[key][3] - corrupt[key][3].detach()) * dz).sum())
    return out


def test_atp_star_equals_the_papers_qk_fix_and_graddrop(llama, result):
    """AtP*: the QK-fixed estimate (heads: plain AtP) with GradDrop's 1/(L-1) sum over the other layers of |I_l|,
    signed as the undropped estimate."""
    model = llama.model
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    m_clean, _ = forward(model, IDS)
    m_corrupt, _ = forward(model, CORRUPT)
    span = float(m_clean - m_corrupt)
    signed = _estimates(model)
    dropped = [_estimates(model, drop=l) for l in range(L)]
    for name in ("queries", "keys", "heads", "mlp"):
        expected = []
        for i in range(L):
            row = []
            for h in range(1 if name == "mlp" else H):
                score = sum(abs(dropped[l][(name, i, h)]) for l in range(L) if l != i) / (L - 1)
                row.append(math.copysign(score, signed[(name, i, h)]) / span)
            expected.append(row)
        assert close(result.grid(name, "atp*").share, expected), name
    moved = max(abs(a - b) for ra, rb in zip(result.grid("queries", "atp*").share,
                                             result.grid("queries", "attribution").share) for a, b in zip(ra, rb))
    assert moved > 1e-3  # the two estimates differ on this model: the comparison above is not vacuous


def test_atp_on_queries_is_the_first_order_step_through_the_softmax(llama, result):
    """AtP at a query: (q_clean - q_corrupt) . dm/dq, dm/dq by autograd through the reference's own softmax."""
    model = llama.model
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    m_clean, clean = forward(model, IDS)
    m_corrupt, corrupt = forward(model, CORRUPT)
    span = float(m_clean - m_corrupt)
    expected = []
    for i in range(L):
        row = []
        for h in range(H):
            q = corrupt[(i, h)][0].clone().requires_grad_(True)
            metric, _ = forward(model, CORRUPT, swap=(i, h, "q", q))
            (grad,) = torch.autograd.grad(metric, q)
            row.append(float(((clean[(i, h)][0] - q.detach()) * grad).sum()) / span)
        expected.append(row)
    assert close(result.grid("queries", "attribution").share, expected)


def test_false_negatives_are_the_exact_top_cells_the_estimate_misses(result):
    for fn in result.false_negatives:
        exact = result.grid(fn.component, "exact")
        est = result.grid(fn.component, fn.method)
        name = lambda i, j: exact.rows[i] + ("" if len(exact.cols) == 1 else " " + exact.cols[j])  # noqa: E731
        cells = [(name(i, j), exact.share[i][j], est.share[i][j])
                 for i in range(len(exact.rows)) for j in range(len(exact.cols))]
        k = max(1, math.ceil(0.05 * len(cells)))
        top_exact, top_est = [], []
        for which, into in ((1, top_exact), (2, top_est)):
            ranked = sorted(range(len(cells)), key=lambda n: (-abs(cells[n][which]), n))
            into.extend(ranked[:k])
        missed = sorted(n for n in top_exact if n not in top_est)
        assert fn.top == k and fn.cells == len(cells)
        assert fn.missed == [cells[n][0] for n in missed], (fn.component, fn.method)
        assert fn.effects == [cells[n][1] for n in missed] and fn.cut == min(abs(cells[n][1]) for n in top_exact)
    assert {(fn.component, fn.method) for fn in result.false_negatives} == {
        (c, m) for c in ("queries", "keys", "heads", "mlp") for m in ("attribution", "atp*")}


def test_atp_star_is_the_same_through_nnsight(llama, result):
    """The attention rule and GradDrop's writes go through the backend seam: an nnsight trace gives the same grids."""
    from analysis import backends

    with backends.using("nnsight-local"):
        traced = analysis.patch(llama, result.params)
    for grid in result.grids:
        assert close(traced.grid(grid.component, grid.method).share, grid.share, 1e-4), (grid.component, grid.method)
    assert traced.false_negatives == result.false_negatives


def test_the_sweep_sums_each_pairs_false_negatives():
    from analysis.model_access.models import load_model, zoo_models

    if "shapes-lm" not in zoo_models():
        pytest.skip("needs the demo zoo")
    handle = load_model(ModelSpec("zoo", "shapes-lm"))
    params = ResidualParams(components=["heads", "keys"])
    sweep = analysis.atp_sweep(handle, params)
    assert len(sweep.pairs) + len(sweep.skipped) == len(analysis.pairs_for(handle))
    first = analysis.patch(handle, ResidualParams(pair=sweep.pairs[0].name, components=["heads", "keys"],
                                                  methods=["exact", "attribution", "atp*"]))
    assert sweep.pairs[0].false_negatives == first.false_negatives
    for total in sweep.totals:
        mine = [f for p in sweep.pairs for f in p.false_negatives if (f.component, f.method) == (total.component, total.method)]
        assert total.count == sum(f.count for f in mine) and total.top == sum(f.top for f in mine)
        assert total.missed == [f"{p.name}: {m}" for p in sweep.pairs for f in p.false_negatives
                                if (f.component, f.method) == (total.component, total.method) for m in f.missed]


def test_a_rule_that_never_ran_is_refused_not_shown_as_no_effect(llama, result, monkeypatch):
    """A model whose attention bypasses transformers' interface leaves the rule unrun: no query/key numbers."""
    from analysis.framework.errors import AnatomyError
    from analysis.residual import patching

    real = patching.trace

    def unruled(*args, **kwargs):
        got = real(*args, **kwargs)
        got.records = {}
        return got

    monkeypatch.setattr(patching, "trace", unruled)
    for method in ("exact", "attribution"):
        params = ResidualParams(**{**result.params.to_dict(), "components": ["keys"], "methods": [method]})
        with pytest.raises(AnatomyError, match="queries and keys cannot be patched"):
            analysis.patch(llama, params)

"""The contribution graph (analysis/residual/contributions.py) against an independent float64 re-computation of
Ferrando & Voita 2024's importance, written from the paper: for a sum y of parts z, importance(z) =
max(0, ||y||_1 - ||y - z||_1) normalised over the sum's parts, the residual being one of them; attention's parts
are each (source position, head)'s a_ij^h W_O^h v_j^h. Plain loops over layers, heads and positions on a float64
copy of a tiny Llama (grouped KV heads, biases on every projection), reading only HF's own outputs and weights."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from analysis.model_access import tiny_models
from analysis.model_access.models import ModelHandle, ModelSpec, describe
from analysis.residual.contributions import Importances, build_graph, importances
from analysis.world.tokenizer import make_word_tokenizer

IDS = [2, 10, 11, 12, 13, 14, 15, 16]


@pytest.fixture(scope="module")
def llama():
    tok = make_word_tokenizer(tiny_models.default_words())
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                      max_position_embeddings=64, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # spread the weights: random init leaves near-uniform attention
            p.mul_(3.0)
    return ModelHandle(spec=ModelSpec("local", "tiny-llama-graph"), model=model, kind="causal_lm",
                       info=describe(model, "causal_lm"), language_model=model, tokenizer=tok)


def l1(v) -> float:
    return float(sum(abs(float(t)) for t in v))


def reference(model) -> dict[str, list]:
    """Per layer: attn[i][j][h], attn_residual[i], mlp[i], mlp_residual[i] (lists of floats)."""
    m = copy.deepcopy(model).double()
    with torch.no_grad():
        out = m(torch.tensor([IDS]), output_hidden_states=True, output_attentions=True, use_cache=False)
    cfg = m.config
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    d, T = cfg.hidden_size // H, len(IDS)
    result = {"attn": [], "attn_residual": [], "mlp": [], "mlp_residual": []}
    for layer, block in enumerate(m.model.layers):
        x = out.hidden_states[layer][0]
        alpha = out.attentions[layer][0]
        with torch.no_grad():
            v = block.self_attn.v_proj(block.input_layernorm(x[None]))[0]
        w_o, b_o = block.self_attn.o_proj.weight.detach(), block.self_attn.o_proj.bias.detach()
        attn, attn_res, mlp, mlp_res = [], [], [], []
        for i in range(T):
            parts = {}
            y = x[i].clone() + b_o
            for j in range(T):
                for h in range(H):
                    g = h // (H // KV)
                    z = alpha[h, i, j] * (w_o[:, h * d:(h + 1) * d] @ v[j, g * d:(g + 1) * d])
                    parts[(j, h)] = z
                    y = y + z
            parts["residual"] = x[i]
            prox = {k: max(0.0, l1(y) - l1(y - z)) for k, z in parts.items()}
            total = sum(prox.values())
            attn.append([[prox[(j, h)] / total for h in range(H)] for j in range(T)])
            attn_res.append(prox["residual"] / total)
            with torch.no_grad():
                f = block.mlp(block.post_attention_layernorm(y[None]))[0]
            post = y + f
            if layer + 1 < len(m.model.layers):  # the reference's own sums are the model's states
                assert float((post - out.hidden_states[layer + 1][0, i]).abs().max()) < 1e-9
            pm, pr = max(0.0, l1(post) - l1(post - f)), max(0.0, l1(post) - l1(post - y))
            mlp.append(pm / (pm + pr))
            mlp_res.append(pr / (pm + pr))
        for key, val in zip(result, (attn, attn_res, mlp, mlp_res)):
            result[key].append(val)
    return result


def test_importances_match_a_float64_recomputation_of_the_papers_formula(llama):
    got = importances(llama, torch.tensor([IDS]))
    ref = reference(llama.model)
    for key in ("attn", "attn_residual", "mlp", "mlp_residual"):
        want = torch.tensor(ref[key], dtype=torch.float64)
        have = getattr(got, key).double()
        assert have.shape == want.shape, key
        assert float((have - want).abs().max()) < 2e-5, key
    # not a degenerate case: the heads and sources differ, and some proximities are clipped at 0
    a = got.attn[1, -1]
    assert float(a.max()) > 0.05 and float(a.std()) > 0.01
    assert int((got.attn[:, :, :, :] == 0).sum()) > 0
    sums = got.attn.sum((2, 3)) + got.attn_residual
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)


def test_the_graph_is_built_top_down_from_the_output_node():
    # 2 layers, 3 positions, 1 head; the output node is state 2 at position 2
    attn = torch.zeros(2, 3, 3, 1)
    attn[1, 2, 0, 0] = 0.6   # layer 1: 0 -> 2, kept
    attn[1, 2, 1, 0] = 0.01  # below tau
    attn[1, 1, 0, 0] = 0.9   # above tau but into a node never reached from the output: dropped
    attn[0, 0, 0, 0] = 0.0
    attn_res = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.1, 0.39]])
    mlp = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.5]])
    mlp_res = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.5]])
    imp = Importances(attn, attn_res, mlp, mlp_res, torch.zeros(3, 5))
    edges, nodes, share, strength, paths = build_graph(imp, 2, 0.05)
    kinds = sorted((e.kind, e.layer, e.source, e.target) for e in edges)
    assert kinds == sorted([("mlp", 1, 2, 2), ("mlp_residual", 1, 2, 2), ("attn", 1, 0, 2),
                            ("attn_residual", 1, 2, 2), ("mlp_residual", 0, 0, 0), ("mlp_residual", 0, 2, 2),
                            ("attn_residual", 0, 0, 0), ("attn_residual", 0, 2, 2)])
    # R2,2 A1,2 R1,0 R1,2 A0,0 A0,2 R0,0 R0,2
    assert nodes == 8
    assert strength == pytest.approx([0.5 * 0.6, 0.0, 0.5 * 0.39])
    assert [e.kind for e in paths[0]] == ["attn_residual", "mlp_residual", "attn", "mlp"]
    assert share == pytest.approx((1.0 + 0.99 + 1.0 + 1.0 + 1.0 + 1.0) / 6)


def test_the_docs_quote_the_graph_benchmark():
    import json

    from analysis.framework.paths import DOCS, RESULTS

    doc = (DOCS / "readme_residual.md").read_text()
    rows = {r["model"]: r for r in json.loads((RESULTS / "residual_graph.json").read_text())}
    shapes, real = rows["zoo:shapes-lm"], rows["zoo:smollm2-135m-instruct"]
    assert f"shapes-lm ({shapes['tokens']} tokens) {shapes['ratio_cpu']:.2f}× (its captured forward " \
           f"{shapes['captured_forward_ratio']:.2f}×" in doc
    assert f"({real['tokens']} tokens)\n{real['ratio_cpu']:.2f}× (captured forward {real['captured_forward_ratio']:.2f}×)" in doc
    assert real["ratio_cpu"] < 2.0  # one forward plus the decomposition, never a forward per edge


def test_chunks_of_destinations_and_sources_give_the_same_importances(llama, monkeypatch):
    import analysis.residual.contributions as module

    whole = importances(llama, torch.tensor([IDS]))
    monkeypatch.setattr(module, "CHUNK", 3)
    monkeypatch.setattr(module, "BUDGET", 3 * 32 * 4 * 2)  # two sources at a time
    cut = importances(llama, torch.tensor([IDS]))
    assert torch.equal(whole.attn, cut.attn) and torch.equal(whole.attn_residual, cut.attn_residual)

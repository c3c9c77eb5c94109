"""Generate and inspect: the commitment strip against a plain float64 loop written here.

The reference runs the model again in float64 on the whole sequence, one step per generated token, with
plain forward hooks on its decoder layers (no cache, none of the panel's code), reads every state through the
model's own final norm and unembedding, and takes argmax. The panel's strip (the generation's own cached
states, candidate tokens ruling states out, the rest read in full) must give the same top-1 table, the same
first-top-1 and top-1-from-there-on states, and the same greedy tokens."""
from __future__ import annotations

import copy

import pytest
import torch

from analysis.model_access import tiny_models
from analysis.model_access.models import ModelHandle, ModelSpec, describe
from analysis.residual import ResidualParams, generate
from analysis.residual.generation import CHUNK
from analysis.residual.prompts import prompt_ids
from analysis.world.tokenizer import make_word_tokenizer

@pytest.fixture(autouse=True)
def screened(monkeypatch):
    """These models' vocabularies are small enough to be read at once; the tests prove the screening path."""
    from analysis.residual import generation

    monkeypatch.setattr(generation, "SMALL", 0)


NEAR = 1e-4  # states whose top two logits are closer than this (float64) are not compared: float32 may swap them


def _tiny(family: str, layers: int, seed: int = 0) -> ModelHandle:
    import transformers

    tok = make_word_tokenizer(tiny_models.family_words())
    torch.manual_seed(seed)
    common = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id)
    if family == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=layers, n_head=4, **common))
    else:
        cls, cfg = {"llama": ("LlamaForCausalLM", "LlamaConfig"), "gemma2": ("Gemma2ForCausalLM", "Gemma2Config")}[family]
        extra = {"head_dim": 8, "sliding_window": 16} if family == "gemma2" else {}
        model = getattr(transformers, cls)(getattr(transformers, cfg)(
            hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=False, **extra, **common))
    tiny_models._spread_weights(model)
    model.config._attn_implementation = "eager"
    model.eval()
    return ModelHandle(spec=ModelSpec("local", f"tiny-{family}-{layers}"), model=model, kind="causal_lm",
                       info=describe(model, "causal_lm"), language_model=model, tokenizer=tok)


def _parts(model):
    """(decoder layers, final norm, unembedding) by each family's own attribute names."""
    if hasattr(model, "transformer"):
        return model.transformer.h, model.transformer.ln_f, model.lm_head
    return model.model.layers, model.model.norm, model.lm_head


def reference(model, prompt: list[int], new: list[int] | None, n: int, eos: int):
    """Float64, no cache: per generated token, [state] -> (top-1 token, margin of the top two logits); the
    tokens (greedy, or `new` teacher-forced)."""
    m = copy.deepcopy(model).double()
    layers, norm, head = _parts(m)
    seq, table, tokens = list(prompt), [], []
    for step in range(n):
        seen: list[torch.Tensor] = []
        hooks = [layers[0].register_forward_pre_hook(
            lambda mod, args, kwargs: seen.append((args[0] if args else kwargs["hidden_states"])[0, -1]),
            with_kwargs=True)]
        for layer in list(layers)[:-1]:
            hooks.append(layer.register_forward_hook(
                lambda mod, args, out: seen.append((out[0] if isinstance(out, tuple) else out)[0, -1])))
        try:
            with torch.no_grad():
                final = m(input_ids=torch.tensor([seq])).logits[0, -1]
                rows = [head(norm(s)) for s in seen]
                cap = getattr(m.config, "final_logit_softcapping", None)  # Gemma 2 caps its output logits
                rows = [torch.tanh(r / cap) * cap if cap else r for r in rows] + [final]
        finally:
            for h in hooks:
                h.remove()
        token = int(final.argmax()) if new is None else new[step]
        cells = []
        for logits in rows:
            top2 = logits.topk(2).values
            cells.append((int(logits.argmax()), float(top2[0] - top2[1]), float(logits.softmax(-1)[token])))
        table.append(cells)
        tokens.append(token)
        seq.append(token)
        if token == eos:
            break
    return tokens, table


def _check(result, table, tokens):
    strip = result.strip("logit")
    assert result.token_ids == tokens
    compared = 0
    for k, cells in enumerate(table):
        expect = [top == tokens[k] for top, _, _ in cells]
        near = [margin < NEAR for _, margin, _ in cells]
        for s, (want, got, skip) in enumerate(zip(expect, strip.top1[k], near)):
            if not skip:
                assert got == want, (k, s)
                compared += 1
        if not any(near):
            assert strip.first[k] == next((s for s, on in enumerate(expect) if on), None)
            assert strip.stays[k] == next((s for s in range(len(expect)) if all(expect[s:])), None)
        if strip.first[k] is not None:  # the lens's P(token) where it is first on top
            assert abs(strip.first_prob[k] - cells[strip.first[k]][2]) < 1e-4
        assert abs(result.prob[k] - cells[-1][2]) < 1e-4  # the model's own P(token)
    assert compared >= 0.95 * sum(len(c) for c in table)
    return strip


@pytest.mark.parametrize("family,layers", [("llama", 6), ("gpt2", 5), ("gemma2", 4)])
def test_commitment_strip_equals_a_float64_hook_loop(family, layers):
    h = _tiny(family, layers)
    prompt = "w3 w17 w5 w40 w8"
    result = generate(h, ResidualParams(pair="own", prompt=prompt, corrupt=prompt, new_tokens=12))
    ids = prompt_ids(h.tokenizer, prompt)  # the prompt as the panel tokenizes it
    assert h.tokenizer.convert_ids_to_tokens(ids)[-1] == "w8"
    tokens, table = reference(h.model, ids, None, 12, h.tokenizer.eos_token_id)
    strip = _check(result, table, tokens)
    assert result.layers == layers and all(len(row) == layers + 1 for row in strip.top1)
    assert all(row[-1] for row in strip.top1)  # greedy: every token is the model's own top-1
    assert all(f is not None and s is not None and f <= s for f, s in zip(strip.first, strip.stays))
    # the strip is not trivial on these models: some tokens are on top before the output, some only there
    assert any(f < layers for f in strip.first) and any(f == layers for f in strip.first)
    assert strip.first != strip.stays or family == "gemma2"


def test_sampled_tokens_are_reproducible_and_judged_against_the_models_own_top():
    h = _tiny("llama", 6)
    prompt = "w3 w17 w5 w40 w8"
    params = ResidualParams(pair="own", prompt=prompt, corrupt=prompt, new_tokens=12, decoding="sample", seed=7,
                            temperature=2.0)
    a, b = generate(h, params), generate(h, params)
    assert a.token_ids == b.token_ids  # the same seed, the same text
    other = generate(h, ResidualParams(pair="own", prompt=prompt, corrupt=prompt, new_tokens=12, decoding="sample",
                                       seed=8, temperature=2.0))
    assert other.token_ids != a.token_ids
    ids = prompt_ids(h.tokenizer, prompt)
    _, table = reference(h.model, ids, a.token_ids, len(a.token_ids), -1)
    strip = _check(a, table, a.token_ids)
    off = [k for k, (tok, top) in enumerate(zip(a.tokens, a.top)) if tok != top]
    assert off, "at temperature 2 some sampled token should not be the model's top-1"
    assert all(strip.stays[k] is None for k in off)  # not on top at the output: it never stays there


def test_candidates_rule_out_most_states_yet_the_table_is_the_full_readouts(monkeypatch):
    """With no candidates the strip must read every state in full; with them, fewer, and the same table."""
    h = _tiny("llama", 6)
    prompt = "w3 w17 w5 w40 w8"
    params = ResidualParams(pair="own", prompt=prompt, corrupt=prompt, new_tokens=12)
    screened = generate(h, params).strip("logit")
    from analysis.residual import generation

    monkeypatch.setattr(generation, "SMALL", 1 << 30)  # a small vocabulary read at once: the same table
    at_once = generate(h, params).strip("logit")
    assert at_once.full_rows == at_once.rows and at_once.top1 == screened.top1
    monkeypatch.setattr(generation, "SMALL", 0)
    monkeypatch.setattr(generation, "_rule_out", lambda lm, x, w, b, own, rows, cands: rows)
    full = generate(h, params).strip("logit")
    assert full.full_rows == full.rows
    assert screened.full_rows < screened.rows and screened.top1 == full.top1
    assert screened.first_prob == full.first_prob
    assert CHUNK >= 1

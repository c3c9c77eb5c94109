"""KV-cache eviction: each policy against a brute-force reference, and the runner's bookkeeping."""
from __future__ import annotations

import json

import pytest
import torch

from analysis import kv_eviction as kv
from analysis.models import ModelSpec, load_model, zoo_models

PROMPT, STEPS, BUDGET, WINDOW, SINKS, KERNEL = 24, 6, 12, 4, 2, 3
# PyramidKV on 2 layers, C=12: first layer 2C - max(w + 1, C/20) = 19, last max(w + 1, C/20) = 5
PYRAMID = {0: 19, 1: 5}


def _tokens(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, 120, (n,), generator=g).tolist()


def _params(policy: str, **kw) -> kv.KvParams:
    base = dict(policy=policy, budget=BUDGET, window=WINDOW, sinks=SINKS, kernel=KERNEL)
    return kv.KvParams(**{**base, **kw})


def _record_attention(handle):
    """Every attention forward of a run, in call order: (layer, probabilities (H_q, q, T))."""
    calls, removers = [], []
    for layer, module in kv.attention_modules(handle.language_model).items():
        def hook(mod, args, output, layer=layer):
            calls.append((layer, output[1][0].detach().double().clone()))
        removers.append(module.register_forward_hook(hook))
    return calls, removers


# ------------------------------------------------------------------------------------------------
# Brute-force reference: the paper rules written as plain loops over heads and positions, applied to
# dense attention matrices A[query position][query head][key position] (zero where not cached).


class Reference:
    def __init__(self, params: kv.KvParams, heads: int, kv_heads: int, n: int, prompt: int, budget: int):
        self.p, self.hq, self.hkv, self.n, self.prompt, self.budget = params, heads, kv_heads, n, prompt, budget
        self.g = heads // kv_heads
        self.A: dict[int, list[list[float]]] = {}  # query position -> [head][key position]
        self.kept: list[list[int]] = [[] for _ in range(kv_heads)]  # per kv head, sorted positions

    def observe(self, attn: torch.Tensor, first_pos: int, phase: str) -> list[list[int]]:
        """attn (H_q, q, T) over this reference's candidate set; returns the kept positions per kv head."""
        q = attn.shape[1]
        new = list(range(first_pos, first_pos + q))
        cands = [sorted(self.kept[h] + new) for h in range(self.hkv)]
        for i, pos in enumerate(new):
            dense = [[0.0] * self.n for _ in range(self.hq)]
            for h in range(self.hq):
                for j, key_pos in enumerate(cands[h // self.g]):
                    dense[h][key_pos] = float(attn[h, i, j])
            self.A[pos] = dense
        last = first_pos + q - 1
        self.kept = [self.choose(cands[h], h, phase, last) for h in range(self.hkv)]
        return self.kept

    def choose(self, cands: list[int], h: int, phase: str, last: int) -> list[int]:
        p, C = self.p, self.budget
        heads = range(h * self.g, (h + 1) * self.g)
        if p.policy == "full" or len(cands) <= C:
            return cands
        if p.policy in ("snapkv", "pyramidkv"):
            if phase != "prefill":
                return cands
            w = p.window
            old = cands[:-w]
            votes = {j: sum(self.A[q][hq][j] for q in range(last - w + 1, last + 1) for hq in heads) for j in old}
            half = p.kernel // 2
            pooled = {j: sum(votes.get(j + d, 0.0) for d in range(-half, half + 1)) / p.kernel for j in old}
            return sorted(sorted(old, key=lambda j: -pooled[j])[: C - w] + cands[-w:])
        if phase == "prefill":
            return cands
        if p.policy == "streaming_llm":
            return cands[: p.sinks] + cands[len(cands) - (C - p.sinks):]
        if p.policy == "tova":
            score = {j: sum(self.A[last][hq][j] for hq in range(self.hq)) / self.hq for j in cands}
            return sorted(sorted(cands, key=lambda j: -score[j])[:C])
        if p.policy == "h2o":
            old = cands[:-p.window]
            score = {j: sum(self.A[q][hq][j] for q in self.A for hq in heads) for j in old}
            return sorted(sorted(old, key=lambda j: -score[j])[: C - p.window] + cands[-p.window:])
        if p.policy == "morphkv":
            R = p.window
            old, rows = cands[:-R], range(last - R + 1, last + 1)
            fused = {}
            for j in old:
                per_head = []
                for hq in heads:
                    vals = []
                    for q in rows:
                        total = sum(self.A[q][hq][i] for i in old)
                        vals.append(self.A[q][hq][j] / total)
                    per_head.append(sum(vals) if p.fusion == "sum" else max(vals))
                fused[j] = max(per_head)
            return sorted(sorted(old, key=lambda j: -fused[j])[: C - R] + cands[-R:])
        raise AssertionError(p.policy)


@pytest.mark.parametrize("policy,fusion", [
    ("full", "max"), ("streaming_llm", "max"), ("h2o", "max"), ("tova", "max"), ("snapkv", "max"),
    ("morphkv", "max"), ("morphkv", "sum"), ("pyramidkv", "max"),
])
def test_policy_kept_set_matches_brute_force_reference(tiny_llama, policy, fusion):
    handle = tiny_llama
    assert handle.info.kv_heads < handle.info.heads  # GQA
    params = _params(policy, fusion=fusion)
    tokens = _tokens(PROMPT + STEPS + 1)
    calls, removers = _record_attention(handle)
    try:
        trace = kv.run_policy(handle, tokens, PROMPT, kv.make_policy(params))
    finally:
        for r in removers:
            r.remove()
    layers = sorted(kv.attention_modules(handle.language_model))
    budgets = PYRAMID if policy == "pyramidkv" else {layer: BUDGET for layer in layers}
    refs = {layer: Reference(params, handle.info.heads, handle.info.kv_heads, len(tokens), PROMPT, budgets[layer])
            for layer in layers}
    forwards = [calls[i:i + len(layers)] for i in range(0, len(calls), len(layers))]
    assert len(forwards) == 1 + STEPS
    for step, forward in enumerate(forwards):
        phase = "prefill" if step == 0 else "decode"
        first = 0 if step == 0 else PROMPT + step - 1
        for layer, attn in forward:
            expected = refs[layer].observe(attn, first, phase)
            got = trace.prefill_kept[layer] if step == 0 else trace.kept[step - 1][layer]
            for h in range(handle.info.kv_heads):
                assert got[h].tolist() == expected[h], (policy, step, layer, h)


@pytest.mark.parametrize("policy", ["streaming_llm", "h2o", "tova", "morphkv", "snapkv", "pyramidkv", "full"])
def test_cache_length_equals_budget_when_it_should(tiny_llama, policy):
    tokens = _tokens(PROMPT + STEPS + 1, seed=1)
    trace = kv.run_policy(tiny_llama, tokens, PROMPT, kv.make_policy(_params(policy)))
    for step, lens in enumerate(trace.cache_len):
        if policy == "full":
            expected = PROMPT + step + 1
        elif policy == "snapkv":  # cut once at prefill, then grows by one per step
            expected = BUDGET + step + 1
        else:  # prompt cut at the first decode step, then constant
            expected = BUDGET
        if policy == "pyramidkv":
            assert lens == [PYRAMID[0] + step + 1, PYRAMID[1] + step + 1]
            continue
        assert lens == [expected] * tiny_llama.info.layers, (policy, step)
    if policy == "snapkv":
        assert all(p.shape[-1] == BUDGET for p in trace.prefill_kept)


def test_morphkv_keeps_recent_window(tiny_llama):
    tokens = _tokens(PROMPT + STEPS + 1, seed=2)
    trace = kv.run_policy(tiny_llama, tokens, PROMPT, kv.make_policy(_params("morphkv")))
    for step, layers in enumerate(trace.kept):
        newest = PROMPT + step
        for positions in layers:
            for head in positions.tolist():
                assert head[-WINDOW:] == list(range(newest - WINDOW + 1, newest + 1))


def test_streaming_llm_keeps_sinks_and_recent(tiny_llama):
    tokens = _tokens(PROMPT + STEPS + 1, seed=3)
    trace = kv.run_policy(tiny_llama, tokens, PROMPT, kv.make_policy(_params("streaming_llm")))
    newest = PROMPT + STEPS - 1
    expected = list(range(SINKS)) + list(range(newest - (BUDGET - SINKS) + 1, newest + 1))
    assert trace.kept[-1][0][0].tolist() == expected


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_gpt2"])
def test_full_cache_reproduces_generate(request, fixture):
    handle = request.getfixturevalue(fixture)
    prompt = _tokens(20, seed=4)
    trace = kv.run_policy(handle, prompt, len(prompt), kv.FullCache(kv.KvParams()), generate=12)
    with handle.session():
        out = handle.language_model.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12,
                                             do_sample=False)
    assert trace.tokens[len(prompt):] == out[0, len(prompt):].tolist()


def test_full_cache_policy_matches_plain_forward_logits(tiny_llama):
    tokens = _tokens(30, seed=5)
    trace = kv.run_policy(tiny_llama, tokens, 20, kv.FullCache(kv.KvParams()))
    with tiny_llama.session():
        logits = tiny_llama.language_model(torch.tensor([tokens])).logits[0, 19:-1]
    torch.testing.assert_close(trace.logits, logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("policy", ["full", "morphkv", "snapkv", "pyramidkv"])
def test_measured_bytes_equal_analytic_formula(tiny_llama, policy):
    info = tiny_llama.info
    trace = kv.run_policy(tiny_llama, _tokens(PROMPT + STEPS + 1), PROMPT, kv.make_policy(_params(policy)))
    for lens, measured, analytic in zip(trace.cache_len, trace.cache_bytes, trace.analytic_bytes):
        if policy == "pyramidkv":  # per-layer lengths differ: sum the formula over layers
            formula = sum(2 * info.kv_heads * info.head_dim * t * 4 for t in lens)
        else:
            T = lens[0]
            assert all(t == T for t in lens)
            formula = 2 * info.layers * info.kv_heads * info.head_dim * T * 4  # float32
        assert measured == formula == analytic


@pytest.mark.parametrize("policy", ["h2o", "tova", "morphkv", "snapkv"])
def test_kept_keys_sit_at_their_original_positions(tiny_llama, policy):
    """Layer-0 keys depend only on token and position, so each kept key must equal the full cache's
    key at the position the runner says it came from (RoPE applied at the original position)."""
    tokens = _tokens(PROMPT + STEPS + 1, seed=6)
    full = kv.run_policy(tiny_llama, tokens, PROMPT, kv.FullCache(kv.KvParams()))
    run = kv.run_policy(tiny_llama, tokens, PROMPT, kv.make_policy(_params(policy)))
    positions = run.kept[-1][0]  # (H_kv, K)
    assert positions.shape[-1] < full.cache.layers[0].keys.shape[2]
    for h in range(tiny_llama.info.kv_heads):
        got = run.cache.layers[0].keys[0, h]
        expected = full.cache.layers[0].keys[0, h, positions[h]]
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(run.cache.layers[0].values[0, h], full.cache.layers[0].values[0, h, positions[h]])


def test_runner_restores_the_model(tiny_llama):
    modules = kv.attention_modules(tiny_llama.language_model)
    before = tiny_llama.language_model.config._attn_implementation
    # transformers installs its own output-capturing hooks once (on the first output_attentions call)
    # and keeps them, so install them first and compare with what was there before.
    with tiny_llama.session():
        tiny_llama.language_model(input_ids=torch.tensor([_tokens(4)]), output_attentions=True)
    hooks = {name: (dict(m._forward_hooks), dict(m._forward_pre_hooks)) for name, m in modules.items()}
    kv.run_policy(tiny_llama, _tokens(30), 20, kv.make_policy(_params("morphkv")))
    assert all((dict(m._forward_hooks), dict(m._forward_pre_hooks)) == hooks[name] for name, m in modules.items())
    assert tiny_llama.language_model.config._attn_implementation == before


def test_eviction_changes_predictions_but_full_cache_does_not(tiny_llama):
    params = kv.KvParams(policy="morphkv", budget=24, window=4, context=64, pairs=4)
    result = kv.analyze(tiny_llama, params)
    full, morph = result.run("full"), result.run("morphkv")
    assert max(full.kl) < 1e-9 and full.agreement == 1.0 and full.mean_recall == pytest.approx(1.0)
    assert morph.mean_kl > 0 and morph.mean_recall < 1.0
    assert all(n == 24 for n in morph.cache_len)
    assert len(result.kept) == len(result.layers) and len(result.kept[0]) == tiny_llama.info.kv_heads
    # the needle survival matrix is a share
    assert all(0.0 <= x <= 1.0 for row in morph.needle_survival for x in row)
    again = kv.KvResult.from_json(result.to_json())
    assert again.run("morphkv").kl == morph.kl and again.params == params


def test_attention_recall_matches_direct_sum(tiny_llama):
    """Recall = full-cache attention of the step's query summed over the entries the policy kept."""
    task = kv.synthetic_kv_task(tiny_llama.tokenizer, tiny_llama.info.vocab_size, context=40, pairs=3, seed=0)
    params = _params("tova")
    full = kv.run_policy(tiny_llama, task.tokens, task.prefill_len, kv.FullCache(params), record_attention=True)
    run = kv.run_policy(tiny_llama, task.tokens, task.prefill_len, kv.make_policy(params))
    res = kv.compare(full, run, task, kv.make_policy(params), [0, 1], 2)
    step, layer = 3, 1
    per_head = []
    for hq in range(4):
        present = set(run.kept[step - 1][layer][hq // 2].tolist()) | {task.prefill_len + step}
        per_head.append(sum(float(full.attention[step][layer][hq][j]) for j in present))
    assert res.recall[step][layer] == pytest.approx(sum(per_head) / 4, abs=1e-6)


def test_budget_not_below_context_is_refused(tiny_llama):
    with pytest.raises(kv.KvEvictionError, match="nothing would be evicted"):
        kv.analyze(tiny_llama, kv.KvParams(policy="h2o", budget=500, context=64))
    with pytest.raises(kv.KvEvictionError, match="too small"):
        kv.make_policy(kv.KvParams(policy="morphkv", budget=4, window=8))
    with pytest.raises(kv.KvEvictionError, match="Unknown policy"):
        kv.make_policy(kv.KvParams(policy="nope"))


def test_all_sliding_window_model_cannot_be_evicted(tiny_mistral_sliding_dir):
    folder = tiny_mistral_sliding_dir
    handle = load_model(ModelSpec("local", str(folder)))
    with pytest.raises(kv.KvEvictionError, match="sliding-window"):
        kv.evictable_layers(handle)


def test_cli_prints_json(tiny_llama_dir, capsys):
    from analysis.__main__ import main

    rc = main(["kv", "--model", f"local:{tiny_llama_dir}", "--policy", "tova", "--budget", "20",
               "--context", "48", "--new-tokens", "4", "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["params"]["policy"] == "tova"
    assert {r["policy"] for r in data["runs"]} == set(kv.POLICIES)


@pytest.mark.skipif("shapes-lm" not in zoo_models(), reason="needs the demo LM (it answers, then ends the text)")
def test_generated_text_stops_at_end_of_text():
    handle = load_model(ModelSpec("zoo", "shapes-lm"))
    params = kv.KvParams(policy="h2o", budget=64, context=128, pairs=2, new_tokens=6)
    task = kv.build_task(handle, params)
    texts = kv.generate_texts(handle, params, task, ["full", "h2o"])
    assert [t.policy for t in texts] == ["full", "h2o"]
    full = texts[0]
    assert 1 <= len(full.tokens) < 6  # the demo model answers, then ends: the rest is not shown
    for t in texts:
        assert handle.tokenizer.eos_token not in t.tokens and "</s>" not in t.text
        assert len(t.matches_full) <= len(t.tokens)
    assert all(full.matches_full)

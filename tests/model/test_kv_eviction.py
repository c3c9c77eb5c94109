"""KV-cache eviction: the runner's bookkeeping (equal entries, bytes, positions, forks), settings
validation and the CLI. Each policy against its official rule: tests/model/test_kv_references.py."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from analysis.model_access import anatomy
from analysis import kv, tasks
from analysis.model_access.models import ModelSpec, load_model, zoo_models
from analysis.framework.registry import SettingsError

PROMPT, STEPS, BUDGET, WINDOW, SINKS, KERNEL = 24, 6, 12, 4, 2, 3
SETTINGS = dict(sinks=SINKS, heavy_share=0.5, snap_window=WINDOW, kernel=KERNEL, morph_window=WINDOW)
# PyramidKV on 2 layers, C=12, w=4, a 24-token prompt (>= 2(C - w) = 16): older entries 16 - 0 and 0,
# plus the window (Zefan-Cai/PyramidKV pyramidkv_utils.py l. 205-238; tests/model/test_kv_references.py)
PYRAMID = {0: 20, 1: 4}


def _tokens(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, 120, (n,), generator=g).tolist()


def _params(policy: str, **kw) -> kv.KvParams:
    """KvParams for `policy`; keyword arguments are task settings or policy settings (by field name)."""
    task = {k: v for k, v in kw.items() if k in kv.KvParams.__dataclass_fields__}
    settings = {k: v for k, v in {**SETTINGS, **kw}.items() if k not in task}
    return kv.KvParams(**{"policy": policy, "budget": BUDGET, **task}, policies=kv.policy_settings(**settings))


def _policy(policy: str, **kw) -> kv.Policy:
    return kv.make_policy(_params(policy, **kw))


@pytest.mark.parametrize("policy", list(kv.POLICIES))
def test_cache_length_equals_budget_when_it_should(tiny_llama, policy):
    """Equal memory: every policy of the main comparison holds exactly C at every decode step (PyramidKV
    its layer budgets, mean C); only the labelled prefill-only variants grow."""
    tokens = _tokens(PROMPT + STEPS + 1, seed=1)
    trace = kv.run_policy(tiny_llama, tokens, PROMPT, kv.make_policy(_params(policy)))
    for step, lens in enumerate(trace.cache_len):
        if policy == "full":
            assert lens == [PROMPT + step + 1] * 2
        elif policy == "pyramidkv":
            assert lens == [PYRAMID[0], PYRAMID[1]]
        elif policy == "pyramidkv_prefill":
            assert lens == [PYRAMID[0] + step + 1, PYRAMID[1] + step + 1]
        elif policy == "snapkv_prefill":
            assert lens == [BUDGET + step + 1] * 2
        else:
            assert lens == [BUDGET] * 2, (policy, step)
    assert kv.POLICIES.get(policy).grows == policy.endswith("_prefill")
    prefill_cut = policy not in ("full", "morphkv", "morphkv_8903d2a")  # MorphKV cuts at the first decode step
    assert all(p.shape[-1] == (PROMPT if not prefill_cut else BUDGET if "pyramid" not in policy else PYRAMID[i])
               for i, p in enumerate(trace.prefill_kept))


def test_morphkv_keeps_the_last_w_plus_one(tiny_llama):
    tokens = _tokens(PROMPT + STEPS + 1, seed=2)
    trace = kv.run_policy(tiny_llama, tokens, PROMPT, kv.make_policy(_params("morphkv")))
    for step, layers in enumerate(trace.kept):
        newest = PROMPT + step
        for positions in layers:
            for head in positions.tolist():
                assert head[-(WINDOW + 1):] == list(range(newest - WINDOW, newest + 1))


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
    trace = kv.run_policy(handle, prompt, len(prompt), kv.FullCache(), generate=12)
    with handle.session():
        out = handle.language_model.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12,
                                             do_sample=False)
    assert trace.tokens[len(prompt):] == out[0, len(prompt):].tolist()


def test_full_cache_policy_matches_plain_forward_logits(tiny_llama):
    tokens = _tokens(30, seed=5)
    trace = kv.run_policy(tiny_llama, tokens, 20, kv.FullCache())
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
    full = kv.run_policy(tiny_llama, tokens, PROMPT, kv.FullCache())
    run = kv.run_policy(tiny_llama, tokens, PROMPT, kv.make_policy(_params(policy)))
    positions = run.kept[-1][0]  # (H_kv, K)
    assert positions.shape[-1] < full.cache.layers[0].keys.shape[2]
    for h in range(tiny_llama.info.kv_heads):
        got = run.cache.layers[0].keys[0, h]
        expected = full.cache.layers[0].keys[0, h, positions[h]]
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(run.cache.layers[0].values[0, h], full.cache.layers[0].values[0, h, positions[h]])


def test_runner_restores_the_model(tiny_llama):
    modules = anatomy.attention_modules(tiny_llama.language_model)
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
    params = kv.KvParams(policy="morphkv", budget=24, context=64, pairs=4, policies=kv.policy_settings(snap_window=4, morph_window=4))
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
    task = tasks.synthetic_kv_task(tiny_llama.tokenizer, tiny_llama.info.vocab_size, context=40, pairs=3, seed=0)
    params = _params("tova")
    full = kv.run_policy(tiny_llama, task.tokens, task.prefill_len, kv.FullCache(), record_attention=True)
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
    with pytest.raises(SettingsError, match="too small for MorphKV"):
        kv.make_policy(kv.KvParams(policy="morphkv", budget=9, policies=kv.policy_settings(morph_window=8)))
    with pytest.raises(SettingsError, match="Unknown eviction policy"):
        kv.make_policy(kv.KvParams(policy="nope"))


def test_each_policy_owns_its_settings():
    """No shared window: H2O splits its budget, SnapKV and MorphKV have their own windows."""
    h2o = kv.make_policy(kv.KvParams(policy="h2o", budget=20, policies=kv.policy_settings(heavy_share=0.25, snap_window=3, morph_window=7)))
    assert (h2o.heavy(), h2o.budget - h2o.heavy()) == (5, 15)
    assert kv.H2O().heavy_share == 0.5  # half/half, as in H2O's experiments (heavy_ratio = recent_ratio)
    snap = kv.make_policy(kv.KvParams(policy="snapkv", policies=kv.policy_settings(snap_window=3, morph_window=7)))
    morph = kv.make_policy(kv.KvParams(policy="morphkv", policies=kv.policy_settings(snap_window=3, morph_window=7)))
    assert (snap.snap_window, morph.morph_window) == (3, 7)
    assert not hasattr(snap, "morph_window") and not hasattr(morph, "snap_window") and not hasattr(h2o, "window")
    assert "window" not in {f.name for f in dataclasses.fields(kv.KvParams)}
    for name, cls in kv.POLICIES.items():
        assert cls.label and cls.colour.startswith("#"), name


@pytest.mark.parametrize("args,message", [
    (["--window", "-1"], "--window is gone"),
    (["--budget", "-1"], "Budget C (entries per head) must be at least 1"),
    (["--budget", "x"], "cannot read 'x' as Budget C"),
    (["--sinks", "-1"], "Sinks S (StreamingLLM) must be at least 0"),
    (["--kernel", "4"], "kernel must be a positive odd number"),
    (["--kernel", "-1"], "kernel must be at least 1"),
    (["--prefill", "0"], "Prefilled share must be at least 0.05"),
    (["--prefill", "1.5"], "Prefilled share must be at most 1"),
    (["--sweep", "0.5,1.2"], "Sweep budget shares must be at most 0.99"),
    (["--sweep", "0,0.5"], "Sweep budget shares must be at least 0.01"),
    (["--context", "-4"], "Context (tokens) must be at least 8"),
    (["--pairs", "0"], "Needles must be at least 1"),
    (["--queries", "0"], "Questions must be at least 1"),
    (["--examples", "0"], "Prompts averaged must be at least 1"),
    (["--heavy-share", "1"], "heavy-hitter share must be at most 0.95"),
    (["--snap-window", "0"], "SnapKV window w must be at least 1"),
    (["--morph-window", "-3"], "MorphKV window W must be at least 2"),
    (["--morph-window", "1"], "MorphKV window W must be at least 2"),
    (["--fusion", "mean"], "MorphKV fusion must be one of max, sum"),
    (["--policy", "nope"], "Policy must be one of full, streaming_llm"),
    (["--budget", "9", "--morph-window", "8"], "too small for MorphKV"),
])
def test_cli_bad_numbers_give_one_error_line(capsys, args, message):
    from analysis.__main__ import main

    rc = main(["kv", "--model", "zoo:does-not-matter", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


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
    texts = kv.generate_texts(handle, params, task, [kv.make_policy(params, n) for n in ("full", "h2o")])
    assert [t.policy for t in texts] == ["full", "h2o"]
    full = texts[0]
    assert 1 <= len(full.tokens) < 6  # the demo model answers, then ends: the rest is not shown
    for t in texts:
        assert handle.tokenizer.eos_token not in t.tokens and "</s>" not in t.text
        assert len(t.matches_full) <= len(t.tokens)
    assert all(full.matches_full)


@pytest.mark.parametrize("policy", list(kv.POLICIES))
def test_forked_continuation_equals_a_separate_run_over_the_prompt(tiny_llama, policy):
    """run_policy's fork (used by analyze for each policy's generated text) gives exactly the tokens of a
    separate run that reads only tokens[:fork_at] and then generates: forked at the end of the prefill,
    inside the decode and at the last token; the teacher-forced pass itself is unchanged by forking."""
    tokens = _tokens(PROMPT + STEPS + 8, seed=5)
    pol = kv.make_policy(_params(policy))
    plain = kv.run_policy(tiny_llama, tokens, PROMPT, pol)
    assert plain.forked is None
    for fork_at in (PROMPT, PROMPT + 5, len(tokens) - 1):
        trace = kv.run_policy(tiny_llama, tokens, PROMPT, pol, fork_at=fork_at, fork_generate=7)
        alone = kv.run_policy(tiny_llama, tokens[:fork_at], PROMPT, pol, generate=7)
        assert trace.forked == alone.tokens and len(trace.forked) == fork_at + 7, fork_at
        assert trace.tokens == plain.tokens and torch.equal(trace.logits, plain.logits)
        assert [[None if t is None else t.tolist() for t in step] for step in trace.kept] == \
            [[None if t is None else t.tolist() for t in step] for step in plain.kept]
    # nothing to share (the fork would start after the last token): no fork, the caller runs it alone
    assert kv.run_policy(tiny_llama, tokens, PROMPT, pol, fork_at=len(tokens), fork_generate=3).forked is None


def test_every_row_of_the_quality_table_holds_the_entries_it_claims(tiny_llama):
    """The budget sweep behind the README table: each policy holds what its rule says when the answer is
    predicted, and every main policy holds at least C (PyramidKV's official schedule rounds up; its steep
    schedule held 121 where the table said 142)."""
    params = kv.KvParams(context=48, pairs=2, sweep=[0.25, 0.5, 0.75], policies=kv.policy_settings(**SETTINGS))
    sweep = kv.budget_sweep(tiny_llama, params, names=kv.main_policies())
    task = kv.build_task(tiny_llama, params)
    read = len(task.tokens) - 1
    for pt in sweep.points:
        cache, claimed = pt.values["cache"], pt.values["claimed"]
        assert cache == claimed, (pt.policy, pt.share, cache, claimed)
        assert cache >= min(pt.budget, read), (pt.policy, pt.share, cache, pt.budget)


def test_an_analysis_builds_each_policy_and_its_task_once(tiny_llama, monkeypatch):
    """`analyze` builds every registered policy once (validated as it is built) and its task once, and hands
    them down; the sweep builds each policy once per budget it runs at, and one task per prompt averaged.
    Before: analyze built 29 policies, the 2-prompt sweep 86."""
    from analysis.kv import analysis as kv_analysis
    from analysis.framework.registry import Method

    built = {"policies": 0, "tasks": 0}
    post_init, build_task = Method.__post_init__, kv_analysis.build_task

    def counted_post_init(self):
        built["policies"] += isinstance(self, kv.Policy)
        post_init(self)

    def counted_build_task(*args, **kwargs):
        built["tasks"] += 1
        return build_task(*args, **kwargs)

    monkeypatch.setattr(Method, "__post_init__", counted_post_init)
    monkeypatch.setattr(kv_analysis, "build_task", counted_build_task)
    params = _params("h2o", budget=20, context=48, pairs=3, new_tokens=6)
    kv.analyze(tiny_llama, params)
    assert built == {"policies": len(kv.POLICIES), "tasks": 1}

    built.update(policies=0, tasks=0)
    sweep = dataclasses.replace(params, examples=2, sweep=[0.25, 0.5, 0.75])
    names = [n for n in kv.main_policies() if n != "full"]
    kv.budget_sweep(tiny_llama, sweep, names=kv.main_policies())
    assert built == {"policies": len(kv.POLICIES) + 3 * len(names), "tasks": 2}

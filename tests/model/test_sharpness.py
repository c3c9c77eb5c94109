"""Attention sharpness: the adaptive rule, the patched attention path, statistics, prompts, CLI."""
from __future__ import annotations

import json
import math
import random
import types

import numpy as np
import pytest
import torch

from analysis import sharpness as S
from analysis.backends import native
from analysis.world.tokenizer import make_word_tokenizer

COEFFS = [-0.037, 0.481, -2.3, 4.917, -1.791]  # the paper's polynomial, written out independently


def reference_adaptive(row: np.ndarray) -> tuple[np.ndarray, float, float]:
    """One attention row by the paper's recipe, in float64 numpy: (output, H of softmax, β)."""
    e = np.exp(row - row.max())
    p = e / e.sum()
    nz = p[p > 0]
    h = float(-(nz * np.log(nz)).sum())
    beta = max(float(np.polyval(COEFFS, h)), 1.0) if h > 0.5 else 1.0
    e2 = np.exp(beta * (row - row.max()))
    return e2 / e2.sum(), h, beta


def random_rows() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    n = 512
    scales = torch.tensor([0.0, 1e-3, 0.05, 0.3, 1.0, 2.0, 4.0, 8.0, 20.0, 60.0]).repeat_interleave(6)
    return torch.randn(len(scales), n, generator=gen, dtype=torch.float64) * scales[:, None]


def test_adaptive_rule_matches_independent_reference_on_random_logits():
    rows = random_rows()
    out, h, beta = S.tempered_softmax(rows, S.Temperature.adaptive())
    regimes = set()
    for i, row in enumerate(rows.numpy()):
        ref, ref_h, ref_beta = reference_adaptive(row)
        assert abs(float(h[i]) - ref_h) < 1e-9
        assert abs(float(beta[i]) - ref_beta) < 1e-9
        np.testing.assert_allclose(out[i].numpy(), ref, rtol=1e-9, atol=1e-12)
        regimes.add("sharp" if ref_h <= 0.5 else "diffuse" if ref_h > 5.95 else "sharpened" if ref_beta > 1 else "flat")
    # the test covers rows the rule leaves alone (H <= 0.5, very diffuse) and rows it sharpens
    assert {"sharp", "diffuse", "sharpened"} <= regimes


def test_adaptive_rule_ignores_masked_keys():
    row = torch.randn(1, 1, 1, 9, dtype=torch.float64)
    masked = torch.cat([row, torch.full((1, 1, 1, 5), torch.finfo(torch.float32).min, dtype=torch.float64)], -1)
    a, _, beta_a = S.tempered_softmax(row, S.Temperature.adaptive())
    b, _, beta_b = S.tempered_softmax(masked, S.Temperature.adaptive())
    assert torch.allclose(a, b[..., :9]) and float(b[..., 9:].abs().max()) == 0.0
    assert torch.allclose(beta_a, beta_b)


def test_entropy_never_increases_under_adaptive_temperature():
    rows = random_rows()
    out, h, beta = S.tempered_softmax(rows, S.Temperature.adaptive())
    assert bool((beta >= 1).all())
    assert bool((S.entropy_nats(out) <= h + 1e-9).all())
    assert bool((S.entropy_nats(out) < h - 1e-3).any())  # and it does sharpen some rows


def test_sharpening_interval_is_about_085_to_595_nats():
    lo, hi = S.sharpening_interval()
    assert 0.84 < lo < 0.86 and 5.93 < hi < 5.96


def test_fixed_theta_is_softmax_of_scaled_logits():
    rows = random_rows()[:8]
    out, _, _ = S.tempered_softmax(rows, S.Temperature.fixed(0.5))
    assert torch.allclose(out, torch.softmax(rows * 2, -1))
    assert bool((S.rule_beta(S.Temperature.fixed(0.5), S.row_entropy(rows)) == 2).all())


def test_bad_temperature_is_refused_clearly():
    with pytest.raises(S.SharpnessError, match="Temperature θ must be at least"):
        S.Temperature.fixed(0.0)
    with pytest.raises(S.SharpnessError, match="Unknown"):
        S.Temperature("hot")


# --- the patched path on real HF classes ---------------------------------------------------


def _ids(handle, n=12, seed=0):
    return torch.tensor([S.build_prompt(handle.tokenizer, n, seed).input_ids])


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_gpt2"])
@pytest.mark.parametrize("rule", [S.Temperature(), S.Temperature.fixed(1.0)])
def test_theta_one_through_patched_path_reproduces_unpatched_logits(which, rule, request):
    handle = request.getfixturevalue(which)
    x = torch.cat([_ids(handle, 12, 0), _ids(handle, 12, 1)])
    with handle.session():
        plain = handle.language_model(input_ids=x).logits
    rec = S.Recorder()
    patched = S.tempered_logits(handle, x, rule, rec)
    assert float((patched - plain).abs().max()) <= 1e-5
    assert sorted(rec.probs) == list(range(handle.info.layers))  # every layer went through it


def test_patched_path_applies_padding_masks_on_gqa_model(tiny_llama):
    x = torch.cat([_ids(tiny_llama, 10, 0), _ids(tiny_llama, 10, 1)])
    mask = torch.ones_like(x)
    mask[0, :3] = 0  # left padding in the first row
    with tiny_llama.session():
        plain = tiny_llama.model(input_ids=x, attention_mask=mask).logits
    with S.temperature_patch(tiny_llama, S.Temperature()) as lm:
        patched = lm(input_ids=x, attention_mask=mask).logits
    assert float((patched - plain).abs().max()) <= 1e-5


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_gpt2"])
def test_fixed_theta_matches_eager_with_rescaled_queries(which, request):
    """Reference: softmax(s/θ) is eager attention with the scaling factor divided by θ."""
    handle = request.getfixturevalue(which)
    x = _ids(handle, 16)
    theta = 0.4
    with handle.patch() as p, torch.no_grad():
        for m in handle.model.modules():
            if hasattr(m, "scaling") and hasattr(m, "layer_idx"):
                p.setattr(m, "scaling", m.scaling / theta)
        reference = handle.model(input_ids=x).logits
    tempered = S.tempered_logits(handle, x, S.Temperature.fixed(theta))
    assert float((tempered - reference).abs().max()) <= 1e-4
    assert float((tempered - S.tempered_logits(handle, x, S.Temperature())).abs().max()) > 1e-3


def test_recorded_probabilities_equal_eager_output_attentions(tiny_llama):
    x = _ids(tiny_llama, 16)
    with tiny_llama.session():
        eager = tiny_llama.model(input_ids=x, output_attentions=True).attentions
    rec = S.Recorder()
    S.tempered_logits(tiny_llama, x, S.Temperature(), rec)
    for layer, att in enumerate(eager):
        assert torch.allclose(rec.probs[layer], att[:, :, -1, :], atol=1e-6)


def test_model_is_restored_after_patch_even_on_error(tiny_llama):
    x = _ids(tiny_llama, 16)
    with tiny_llama.session():
        before = tiny_llama.model(input_ids=x).logits
    S.tempered_logits(tiny_llama, x, S.Temperature.adaptive())
    with pytest.raises(RuntimeError):
        with S.temperature_patch(tiny_llama, S.Temperature.fixed(0.1)):
            raise RuntimeError("boom")
    with tiny_llama.session():
        after = tiny_llama.model(input_ids=x).logits
    assert torch.equal(before, after)
    assert tiny_llama.model.config._attn_implementation == "eager"
    assert native._ACTIVE.get() is None


def test_adaptive_temperature_works_on_vlm_language_model(tiny_llava):
    x = _ids(tiny_llava, 16)
    with tiny_llava.session():
        plain = tiny_llava.language_model(input_ids=x).logits
    assert float((S.tempered_logits(tiny_llava, x, S.Temperature()) - plain).abs().max()) <= 1e-5
    rec = S.Recorder()
    adaptive = S.tempered_logits(tiny_llava, x, S.Temperature.adaptive(), rec)
    assert float((adaptive - plain).abs().max()) > 1e-4
    assert len(rec.beta) == tiny_llava.info.layers and all(bool((b >= 1).all()) for b in rec.beta.values())
    assert bool(torch.stack([rec.beta[k] for k in rec.beta]).gt(1).any())  # some head was sharpened
    assert tiny_llava.model.config.get_text_config()._attn_implementation == "eager"
    result = S.size_sweep(tiny_llava, S.SweepParams(ns=[4, 8], thetas=[0.5], samples=2))
    assert [p.n for p in result.points] == [4, 8]


def test_model_with_sdpa_attention_gives_same_statistics(tiny_llama):
    """The panel does not need eager: it swaps in its own function, so an sdpa handle works too."""
    x = _ids(tiny_llama, 16)
    rec_eager = S.Recorder()
    S.tempered_logits(tiny_llama, x, S.Temperature.adaptive(), rec_eager)
    rec_sdpa = S.Recorder()
    with tiny_llama.patch() as p:
        p.attn_implementation(tiny_llama.model, "sdpa")
        S.tempered_logits(tiny_llama, x, S.Temperature.adaptive(), rec_sdpa)
    for layer in rec_eager.probs:
        assert torch.allclose(rec_eager.probs[layer], rec_sdpa.probs[layer], atol=1e-6)


def self_computed_attention(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
    """A Llama attention forward that computes attention itself, bypassing transformers' interface."""
    b, t, _ = hidden_states.shape
    q = self.q_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)
    k = self.k_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)
    v = self.v_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), None


def bypass_interface(handle, patch) -> None:
    """Make every attention module compute attention itself (as models outside the interface do)."""
    for m in handle.model.modules():
        if type(m).__name__.endswith("Attention") and hasattr(m, "q_proj"):
            patch.setattr(m, "forward", types.MethodType(self_computed_attention, m))


def test_model_outside_attention_interface_gets_a_clear_error(tiny_llama):
    with tiny_llama.patch() as p:
        bypass_interface(tiny_llama, p)
        with pytest.raises(S.SharpnessError, match="attention interface"):
            S.size_sweep(tiny_llama, S.SweepParams(ns=[4], samples=1))


# --- statistics ------------------------------------------------------------------------------


def test_row_statistics_match_brute_force_with_and_without_sink():
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 3, 7, generator=gen)
    scores[1, :, 5:] = torch.finfo(torch.float32).min  # two masked keys in sample 1
    probs = torch.softmax(scores, -1)
    target = [[0, 2], [4]]
    for drop_sink in (False, True):
        st = S.row_stats(scores, probs, target, drop_sink)
        for b in range(2):
            for h in range(3):
                valid = [i for i in range(7) if scores[b, h, i] > -1e30 and not (drop_sink and i == 0)]
                p = probs[b, h, valid] / probs[b, h, valid].sum()
                ent = float(-(p * p.log()).sum())
                assert math.isclose(float(st["entropy"][b, h]), ent, rel_tol=1e-5)
                assert math.isclose(float(st["entropy_norm"][b, h]), ent / math.log(len(valid)), rel_tol=1e-5)
                assert math.isclose(float(st["max_weight"][b, h]), float(p.max()), rel_tol=1e-6)
                tw = sum(float(p[valid.index(t)]) for t in target[b] if t in valid)
                assert math.isclose(float(st["target_weight"][b, h]), tw, rel_tol=1e-5, abs_tol=1e-7)
                s = scores[b, h, valid]
                assert math.isclose(float(st["spread"][b, h]), float(s.max() - s.min()), rel_tol=1e-6)


def test_lemma_demo_follows_closed_form_and_bounds():
    res = S.lemma_demo(S.LemmaParams(ns=[2, 8, 64, 1024], thetas=[0.5, 1.0], spread=3.0))
    soft = next(c for c in res.curves if c.label == "θ = 1")
    for n, p in zip(res.params.ns, soft.p_max):
        assert math.isclose(p, math.exp(3) / (math.exp(3) + n - 1), rel_tol=1e-9)
        assert p <= res.upper_bound[1.0][res.params.ns.index(n)] + 1e-12
    assert soft.p_max == sorted(soft.p_max, reverse=True)  # disperses as n grows
    adaptive = next(c for c in res.curves if c.label == "adaptive θ")
    assert all(a >= s - 1e-12 for a, s in zip(adaptive.p_max, soft.p_max))
    assert all(e <= math.log(n) + 1e-9 for e, n in zip(soft.entropy, res.params.ns))


# --- prompts ---------------------------------------------------------------------------------


def test_zoo_prompt_is_exactly_the_shapes_world_training_format():
    from analysis.world import shapes_world as sw

    tok = make_word_tokenizer(list(sw.VOCAB))
    pr = S.build_prompt(tok, 20, seed=5)
    text, answer = sw.max_retrieval_example(random.Random(5 * 1_000_003 + 20), 20)
    assert (pr.text, pr.answer, pr.format) == (text, answer, "shapes-world")
    assert pr.input_ids == tok(text, add_special_tokens=False)["input_ids"]
    assert len(pr.values) == 20 and max(pr.values) == int(answer)
    assert pr.target and all(tok.decode([pr.input_ids[t]]) == answer for t in pr.target)
    assert pr.answer_id == tok.convert_tokens_to_ids(answer)


def test_numbers_prompt_for_a_tokenizer_with_number_tokens():
    tok = make_word_tokenizer([str(i) for i in range(100)] + ["Numbers:", "The", "largest", "number", "is"])
    pr = S.build_prompt(tok, 9, seed=1)
    assert pr.format == "numbers" and pr.text.startswith("Numbers:") and pr.text.endswith("is")
    assert pr.answer == str(max(pr.values)) and pr.values.count(max(pr.values)) == 1
    assert [tok.decode([pr.input_ids[t]]) for t in pr.target] == [pr.answer]


def test_vocabulary_prompt_for_a_word_tokenizer_without_numbers(tiny_llama):
    pr = S.build_prompt(tiny_llama.tokenizer, 30, seed=2)
    assert pr.format == "vocabulary" and len(pr.input_ids) == 30
    assert pr.answer == f"w{max(pr.values)}" and pr.input_ids[pr.target[0]] == pr.answer_id


# --- sweeps, single prompts, CLI ---------------------------------------------------------------


def test_size_sweep_reports_every_rule_and_round_trips(tiny_llama):
    res = S.size_sweep(tiny_llama, S.SweepParams(ns=[4, 16, 100_000], thetas=[0.5, 2.0], samples=3))
    assert [p.n for p in res.points] == [4, 16] and res.skipped == [100_000]
    assert res.rules() == ["softmax", "adaptive θ", "θ = 0.5", "θ = 2"]
    p16 = res.points[1]
    soft, sharp, hot = p16.run("softmax"), p16.run("θ = 0.5"), p16.run("θ = 2")
    assert np.all(np.array(sharp.with_sink.entropy) < np.array(soft.with_sink.entropy))
    assert np.all(np.array(hot.with_sink.entropy) > np.array(soft.with_sink.entropy))
    assert np.allclose(sharp.with_sink.beta, 2.0)
    adaptive = np.array(p16.run("adaptive θ").with_sink.beta)
    assert np.all(adaptive >= 1)
    assert all(0 <= r.accuracy <= 1 for r in p16.runs)
    back = S.SweepResult.from_json(res.to_json())
    assert back.points[1].run("θ = 2").with_sink.entropy == hot.with_sink.entropy


def test_size_sweep_accuracy_counts_argmax_hits(tiny_llama):
    res = S.size_sweep(tiny_llama, S.SweepParams(ns=[6], thetas=[], samples=4))
    build = S.prompt_builder(tiny_llama.tokenizer)
    hits = near = 0
    for k in range(4):
        pr = build(6, k)
        second = max(v for v in pr.values if v != max(pr.values))
        assert pr.runner_up_id == tiny_llama.tokenizer.convert_tokens_to_ids(f"w{second}")
        logits = S.tempered_logits(tiny_llama, torch.tensor([pr.input_ids]), S.Temperature())
        hits += int(logits[0, -1].argmax()) == pr.answer_id
        near += int(logits[0, -1].argmax()) == pr.runner_up_id
    assert res.points[0].run("softmax").accuracy == hits / 4
    assert res.points[0].run("softmax").runner_up == near / 4


def test_single_prompt_stats_change_with_theta_and_find_target(tiny_llama):
    text = "w3 w17 w99 w5 w42 w8"
    cold = S.analyse_prompt(tiny_llama, S.PromptParams(text, "w99", S.Temperature.fixed(0.25)))
    hot = S.analyse_prompt(tiny_llama, S.PromptParams(text, "w99", S.Temperature.fixed(4.0)))
    assert cold.target_positions == [2] and len(cold.tokens) == 6
    assert cold.softmax == hot.softmax  # the softmax reference does not depend on θ
    assert np.all(np.array(cold.tempered.entropy) < np.array(hot.tempered.entropy))
    w = np.array(cold.weights_tempered[0])
    assert np.allclose(w.sum(-1), 1, atol=1e-5)
    assert np.allclose(np.array(cold.tempered.target_weight[0]), w[:, 2], atol=1e-6)


@pytest.mark.parametrize("text,target,match", [("", "", "Enter a prompt"), ("   ", "", "Enter a prompt"),
                                               ("w1 w2 w3", "w77", "does not occur")])
def test_bad_prompts_give_clear_errors(tiny_llama, text, target, match):
    with pytest.raises(S.SharpnessError, match=match):
        S.analyse_prompt(tiny_llama, S.PromptParams(text, target))


def test_cli_prints_json_result(tiny_gpt2_dir, capsys):
    code = S.cli(["--model", f"local:{tiny_gpt2_dir}", "--n", "4,8", "--thetas", "0.5", "--samples", "2", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["n"] for p in data["points"]] == [4, 8]
    assert S.SweepResult.from_dict(data).points[0].run("θ = 0.5").rule.theta == 0.5


def test_fully_masked_and_minus_infinity_rows_stay_finite():
    low = torch.finfo(torch.float32).min
    rows = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)) * 3
    rows[0] = low  # a fully masked row (a padding query)
    rows[1, 3:] = -float("inf")  # a mask written with -inf
    for rule in (S.Temperature.adaptive(), S.Temperature.fixed(0.2)):
        out = S.tempered_softmax(rows, rule)[0]
        assert bool(torch.isfinite(out).all()) and torch.allclose(out.sum(-1), torch.ones(4))
        assert float(out[1, 3:].abs().max()) == 0.0
    _, h, _ = S.tempered_softmax(rows, S.Temperature.adaptive())
    assert math.isclose(float(h[0]), math.log(6), rel_tol=1e-5)
    assert math.isclose(float(h[1]), float(S.row_entropy(rows[1, :3])), rel_tol=1e-4, abs_tol=1e-5)


def test_temperature_restricted_to_layers_leaves_other_layers_softmax(tiny_llama):
    x = _ids(tiny_llama, 16)
    soft, only1, every = S.Recorder(), S.Recorder(), S.Recorder()
    S.tempered_logits(tiny_llama, x, S.Temperature(), soft)
    S.tempered_logits(tiny_llama, x, S.Temperature.fixed(0.3, layers=(1,)), only1)
    S.tempered_logits(tiny_llama, x, S.Temperature.fixed(0.3), every)
    assert torch.allclose(only1.probs[0], soft.probs[0])  # layer 0 untouched
    assert bool((only1.beta[0] == 1).all()) and torch.allclose(only1.beta[1], torch.full_like(only1.beta[1], 1 / 0.3))
    assert not torch.allclose(only1.probs[1], soft.probs[1], atol=1e-3)
    # layer 1 sees the same input as in the softmax run, so its probabilities are softmax(s / θ) of it
    assert torch.allclose(only1.probs[1], torch.softmax(soft.scores[1] / 0.3, -1), atol=1e-5)
    assert not torch.allclose(only1.probs[1], every.probs[1], atol=1e-4)  # layer 0 changed it in `every`
    res = S.size_sweep(tiny_llama, S.SweepParams(ns=[8], thetas=[0.5], samples=2, layers=[1]))
    assert res.points[0].run("θ = 0.5").rule.layers == (1,)
    assert S.SweepResult.from_json(res.to_json()).points[0].run("adaptive θ").rule.layers == (1,)
    with pytest.raises(S.SharpnessError, match="layers"):
        S.size_sweep(tiny_llama, S.SweepParams(ns=[8], samples=1, layers=[7]))


# --- command line: every number out of range is one `error:` line, before the model loads --------


def _run_cli(capsys, argv):
    from analysis.__main__ import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors (wrong type)
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


@pytest.mark.parametrize("extra, needle", [
    (["--n", "1"], "Item counts n must be at least 2"),
    (["--n", "4,-8"], "Item counts n must be at least 2"),
    (["--n", "4,eight"], "--n: cannot read '4,eight' as Item counts n"),
    (["--n", ","], "Item counts n needs at least 1 value"),
    (["--thetas", "0"], "Fixed temperatures θ must be at least"),
    (["--thetas", "-2"], "Fixed temperatures θ must be at least"),
    (["--thetas", "nan"], "--thetas: cannot read 'nan' as Fixed temperatures θ"),
    (["--samples", "0"], "Prompts per n must be at least 1"),
    (["--seed", "-1"], "Seed must be at least 0"),
    (["--layers", "-1"], "Each layer in --layers must be at least 0"),
    (["--samples", "many"], "--samples: cannot read 'many' as Prompts per n"),
    (["--min-entropy", "-1"], "Adaptive θ: rows left alone up to H (nats) must be at least 0"),
    (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
])
def test_cli_out_of_range_is_one_error_line(capsys, extra, needle):
    code, err = _run_cli(capsys, ["sharpness", "--model", "local:/nonexistent", *extra])
    assert code != 0 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and needle in lines[0], err


def test_cli_layer_beyond_the_model_is_one_error_line(tiny_gpt2_dir, capsys):
    code, err = _run_cli(capsys, ["sharpness", "--model", f"local:{tiny_gpt2_dir}", "--n", "4", "--samples", "1",
                                  "--layers", "99"])
    assert code != 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "cannot apply a temperature" in lines[0], err

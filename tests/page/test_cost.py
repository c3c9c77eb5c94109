"""Cost estimates: the work counted from the settings is the work done; the time is close to measured;
a view does not start long work on page load."""
from __future__ import annotations

import dataclasses
import os
import random
import time

import pytest
import torch
from conftest import app_with_model

from analysis.framework import cost
from analysis.framework.errors import MissingEstimator
from analysis.framework.paths import SCRIPTS
from analysis import inversion as inv
from analysis.inversion import cost as C
from analysis import kv
from analysis import sharpness as S
from analysis.model_access.models import ModelHandle, ModelSpec, describe, load_model, zoo_models
from analysis.model_access.tiny_models import default_words
from analysis.world.tokenizer import make_word_tokenizer

KV_SMALL = kv.KvParams(context=48, budget=16, new_tokens=4, policies=kv.policy_settings(snap_window=4, morph_window=4))
JOBS = [
    (kv.analyze, KV_SMALL),
    (kv.budget_sweep, kv.KvParams(context=48, budget=16, examples=2, policies=kv.policy_settings(snap_window=4, morph_window=4))),
    (kv.analyze, kv.KvParams(prompt="a b c d e f g h i j k l", budget=8, new_tokens=6, policies=kv.policy_settings(snap_window=2, morph_window=2, sinks=2))),
    (S.size_sweep, S.SweepParams(ns=[2, 4, 8], samples=5, batch=2)),
]


class CallCounter:
    """Counts forward calls and tokens of a language model with a pre-hook (a reference count)."""

    def __init__(self, lm):
        self.calls = self.tokens = 0
        self._handle = lm.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        x = kwargs.get("input_ids")
        x = x if x is not None else (args[0] if args else kwargs["inputs_embeds"])
        self.calls += 1
        self.tokens += x.shape[0] * x.shape[1]

    def close(self):
        self._handle.remove()


@pytest.mark.parametrize("fn,params", JOBS, ids=[f"{f.__name__}-{i}" for i, (f, _) in enumerate(JOBS)])
def test_counted_work_equals_the_forwards_the_analysis_runs(tiny_llama, fn, params):
    work = cost.estimate_work(fn, tiny_llama, params)
    counter = CallCounter(tiny_llama.language_model)
    try:
        fn(tiny_llama, params)
    finally:
        counter.close()
    assert (work.calls, work.tokens) == (counter.calls, counter.tokens)


def big_vocab_llama(vocab: int = 32_768, hidden: int = 256) -> ModelHandle:
    """Random weights with a large embedding table (8 M values) and a tiny body: ranking the
    vocabulary, not the forwards, is most of a reconstruction here (as on a 152 k-word 0.5 B model).
    The tokenizer knows 120 words; the attack searches every row of the table."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).eval()
    return ModelHandle(spec=ModelSpec("local", "big-vocab-random"), model=model, kind="causal_lm",
                       info=describe(model, "causal_lm"), language_model=model,
                       tokenizer=make_word_tokenizer(default_words()))


RECONSTRUCTIONS = [
    ("tiny", inv.AttackParams(prompt="w1 w2 w3 w4 w5 w6", layer=1)),  # small vocabulary: no gradient phase
    ("tiny", inv.AttackParams(prompt="w1 w2 w3 w4 w5 w6", layer=2, order="embedding")),
    ("tiny", inv.AttackParams(prompt="w1 w2 w3 w4", layer=1, exhaustive=True)),
    ("big-vocab", inv.AttackParams(prompt="w1 w2 w3 w4 w5 w6", layer=2)),  # the gradient phase runs
    ("big-vocab", inv.AttackParams(prompt="w1 w2 w3", layer=1, defences=["gaussian_noise"], max_batch=4096)),
]


@pytest.fixture(scope="module")
def big_vocab():
    return big_vocab_llama()


@pytest.mark.parametrize("which,params", RECONSTRUCTIONS, ids=[f"{w}-{i}" for i, (w, _) in enumerate(RECONSTRUCTIONS)])
def test_reconstruction_work_follows_the_attack(which, params, tiny_llama, big_vocab):
    """The attack's forwards (a backward counted as two more) are counted within 2x, and the
    vocabulary rankings at every position are counted: its candidate search depends on the data."""
    handle = tiny_llama if which == "tiny" else big_vocab
    work = cost.estimate_work(inv.reconstruct, handle, params)
    counter = CallCounter(handle.language_model)
    try:
        result = inv.reconstruct(handle, params)
    finally:
        counter.close()
    done = counter.calls + (cost.BACKWARD - 1) * result.gradient_steps
    counted = work.calls + work.cut  # a forward stopped early counts its share in calls, the rest in cut
    assert 0.5 <= done / counted <= 2, (done, counted, result.gradient_steps, [t.evaluations for t in result.tokens])
    vocab = inv.vocab_size(handle)
    positions = len(result.tokens)
    if params.exhaustive or params.defences:  # every token scored: no ranking, one distance per candidate
        assert work.rows == pytest.approx(positions * vocab)
    else:  # the table's directions once, then the vocabulary's scores at every position (and a ranking by
        # distance where the gradient phase runs): on a 152 k-word model a large part of the time
        per_position = C.SCORE_PASSES * (2 if result.gradient_steps else 1)
        assert work.rows >= vocab * (C.DIRECTION_PASSES + positions * per_position)


def test_estimate_grows_with_the_settings(tiny_llama):
    small = cost.estimate_work(S.size_sweep, tiny_llama, S.SweepParams(ns=[4, 8], samples=8))
    double = cost.estimate_work(S.size_sweep, tiny_llama, S.SweepParams(ns=[4, 8], samples=16))
    assert double.tokens == 2 * small.tokens
    longer = cost.estimate_work(kv.analyze, tiny_llama,
                                kv.KvParams(context=96, budget=16, policies=kv.policy_settings(snap_window=4, morph_window=4)))
    assert longer.calls > cost.estimate_work(kv.analyze, tiny_llama, KV_SMALL).calls


def test_an_undeclared_analysis_has_no_estimate(tiny_llama):
    """The gate fails closed: a function no panel declares raises (the runner then asks before starting)."""
    with pytest.raises(MissingEstimator):
        cost.estimate(lambda h, p: None, tiny_llama, KV_SMALL)


def _models():
    out = [("tiny-llama", None), ("big-vocab", None)]
    if "shapes-lm" in zoo_models():
        out.append(("shapes-lm", ModelSpec("zoo", "shapes-lm")))
    return out


@pytest.mark.skipif(os.environ.get("MODEL_INSPECTOR_TIMING_TESTS") != "1",
                    reason="wall-clock check: flaky on a shared machine; MODEL_INSPECTOR_TIMING_TESTS=1 runs it "
                           "(benchmarks/cost_bench.py is the measurement)")
@pytest.mark.parametrize("name,spec", _models(), ids=[m[0] for m in _models()])
def test_estimate_is_close_to_the_measured_time(name, spec, tiny_llama, big_vocab):
    """Three models (the big-vocabulary one: rankings dominate a reconstruction). The README's
    benchmark checks 2x on a 0.5 B model; on the shared test machine, whose load changes between the
    calibration and the run, the bound here is 3x."""
    handle = {"tiny-llama": tiny_llama, "big-vocab": big_vocab}.get(name) or load_model(spec)
    torch.set_num_threads(torch.get_num_threads())
    attack = inv.AttackParams(prompt="w1 w2 w3 w4 w5 w6 w7 w8" if spec is None else "there is a large red circle",
                              layer=2)
    ratios = []
    for fn, params in (JOBS[0], JOBS[3], (inv.reconstruct, attack)):
        fn(handle, params)  # first call: lazy imports and allocations
        cost._calibrated.pop(cost.calibration_key(handle), None)
        estimate = cost.estimate(fn, handle, params)
        t0 = time.perf_counter()
        fn(handle, params)
        measured = time.perf_counter() - t0
        ratios.append(measured / estimate.seconds)
    assert all(1 / 3 <= r <= 3 for r in ratios), ratios


def test_long_work_waits_for_a_click_then_runs(tiny_llama_dir, monkeypatch):
    from components import runs

    monkeypatch.setattr(runs, "ASK_ABOVE_S", 0.0)  # every run counts as long
    spec = ModelSpec("local", str(tiny_llama_dir))
    query = {"context": "40", "budget": "17", "snap_window": "4", "morph_window": "4", "examples": "1"}
    at = app_with_model(spec, "views/kv_cache.py", query=query, timeout=120)
    assert not at.exception, at.exception
    assert not at.get("plotly_chart"), "nothing is computed before the click"
    notes = " ".join(i.value for i in at.info)
    assert "would take about" in notes and "not started on its own" in notes
    run = next(b for b in at.button if b.label.startswith("Run it"))
    run.click().run()
    assert not at.exception, at.exception
    assert len(at.get("plotly_chart")) >= 1  # the headline heatmap; the other figures are in later sections
    # the later sections are shown one at a time behind a segmented control: the result is kept, not rerun
    at.segmented_control(key="kv_chapter").set_value("KL and needle survival").run()
    assert not at.exception, at.exception
    assert len(at.get("plotly_chart")) >= 3
    # The budget sweep is on demand: a button, not computed with the page.
    at.segmented_control(key="kv_chapter").set_value("Budget sweep").run()
    assert not at.exception, at.exception
    assert any(b.label.startswith("Run") for b in at.button)


# -- caption correction -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def caption_vlms(model_root):
    """Two tiny random LLaVAs: one whose vocabulary is Shapes World's (the demo's prompts and verifier)
    and one with the family's chat template (the generic caption prompt and yes/no question)."""
    from analysis.model_access import tiny_models
    from analysis.world import shapes_world as W

    shapes = tiny_models.save_tiny_llava(model_root / "tiny-llava-shapes-cost", words=list(W.VOCAB))
    chat = tiny_models.save_tiny("llava", model_root / "tiny-llava-chat-cost")
    return {name: load_model(ModelSpec("local", str(folder))) for name, folder in
            (("shapes", shapes), ("chat", chat))}


def _no_early_stop(handle, monkeypatch):
    """Greedy generation runs to max_new_tokens (a random model may otherwise say </s> at once)."""
    monkeypatch.setattr(handle.model.generation_config, "eos_token_id", None)


class DecoderCounter(CallCounter):
    """CallCounter on a VLM's text decoder, also recording each call's tokens."""

    def __init__(self, handle):
        self.sizes = []
        super().__init__(handle.language_model.model)

    def _count(self, module, args, kwargs):
        before = self.tokens
        super()._count(module, args, kwargs)
        self.sizes.append(self.tokens - before)


@pytest.mark.parametrize("which", ["shapes", "chat"])
def test_caption_estimate_is_the_processor_prompt_the_tower_and_max_new_tokens(which, caption_vlms, monkeypatch):
    from analysis import captions as C
    from analysis.world import shapes_world as W

    handle = caption_vlms[which]
    image = W.render(W.generate_scene(20000003))
    _no_early_stop(handle, monkeypatch)
    work = cost.estimate_work(C.caption_image, handle, None, {"image": image, "max_new_tokens": 7})
    counter = DecoderCounter(handle)
    try:
        C.caption_image(handle, image, max_new_tokens=7)
    finally:
        counter.close()
    assert counter.calls == 7 and work.calls == 7  # the generation count is max_new_tokens
    assert counter.sizes[0] == work.tokens - 6  # the prefill: the processor's input, image tokens expanded
    assert work.tokens == counter.tokens
    vc = handle.model.config.vision_config
    assert work.patches == (vc.image_size // vc.patch_size) ** 2


@pytest.mark.parametrize("which", ["shapes", "chat"])
def test_verification_estimate_counts_each_row_its_padding_and_the_grounding(which, caption_vlms):
    """Each claim is one row (the image and its question, left-padded to the batch's longest); grounding
    adds an Integrated-Gradients batch of ig_steps rows per claim, forward and (input-gradient) backward."""
    from analysis import captions as C
    from analysis.world import shapes_world as W

    handle = caption_vlms[which]
    scene = W.generate_scene(20000003)
    caption = W.caption(scene) + " there is a small green square at the center ."
    image = W.render(scene)
    counts = {}
    for ground in (False, True):
        params = C.CorrectionParams(caption=caption, decomposer="grammar", rewriter="grammar", ground=ground,
                                    ig_steps=2)
        work = cost.estimate_work(C.verify_caption, handle, params, {"image": image})
        counter = DecoderCounter(handle)
        try:
            verification = C.verify_caption(handle, image, params)
        finally:
            counter.close()
        counts[ground] = (work, counter)
    claims = len(verification.claims)
    assert claims == len(W.decompose(caption)) >= 10
    work, counter = counts[False]
    assert (work.calls, work.tokens) == (counter.calls, counter.tokens) == (1, counter.tokens)
    assert work.patches == claims * handle.info.image_tokens  # one patch per image token in these towers
    grounded, ground_counter = counts[True]
    backward = cost.INPUT_GRADIENT
    assert grounded.calls - work.calls == backward * (ground_counter.calls - counter.calls) == backward * claims
    assert grounded.tokens - work.tokens == backward * (ground_counter.tokens - counter.tokens)


@pytest.fixture(scope="module")
def demo_lm():
    if "shapes-lm" not in zoo_models():
        pytest.skip("demo model shapes-lm is not built")
    return load_model(ModelSpec("zoo", "shapes-lm"))


def test_decomposer_and_rewriter_are_priced_on_their_own_model(caption_vlms, demo_lm):
    """The demo LM's decomposition and rewrite are as long as the grammar's answers it was trained to
    give; their time is the LM's own (its calibration), carried into the VLM's estimate as seconds."""
    from analysis import captions as C
    from analysis.world import shapes_world as W

    vlm = caption_vlms["shapes"]
    scene = W.generate_scene(20000003)
    caption = W.caption(scene)
    params = C.CorrectionParams(caption=caption, decomposer="shapes-lm", rewriter="shapes-lm", ground=False)
    lm_params = C.CorrectionParams(**{**vars(params), "decomposer": "grammar"})
    work = cost.estimate_work(C.verify_caption, vlm, params, {"image": W.render(scene), "lm": demo_lm})
    without_lm = cost.estimate_work(C.verify_caption, vlm, lm_params, {"image": W.render(scene), "lm": demo_lm})
    decomposer = C.make_agent("decomposer", "shapes-lm", demo_lm)
    counter = CallCounter(demo_lm.language_model)
    try:
        claims = decomposer.decompose(caption)
    finally:
        counter.close()
    prompt = len(demo_lm.tokenizer(decomposer.prompt(caption), add_special_tokens=False)["input_ids"])
    assert claims == W.decompose(caption)
    assert decomposer.new_tokens(caption) == counter.calls  # its answer and </s>, one call each
    assert counter.tokens == prompt + counter.calls - 1
    lm_seconds = cost.sequence(prompt, prompt, generate=counter.calls).seconds(cost.calibrate(demo_lm))
    assert work.seconds_elsewhere == pytest.approx(lm_seconds)
    assert without_lm.seconds_elsewhere == 0 and (work.calls, work.tokens) == (without_lm.calls, without_lm.tokens)

    # the rewriter's trained task: a caption with an invented object, whose claims an oracle flags
    wrong = W.caption(W.hallucinate(scene, random.Random(0)))
    verification = C.Verification(caption=wrong, grid=0, agents={}, claims=[
        C.ClaimVerdict(c, *((0.9, 0.05) if W.claim_truth(scene, c) else (0.05, 0.9)), 0.0, False)
        for c in W.decompose(wrong)])
    rewrite = cost.estimate_work(C.apply_threshold, demo_lm, params, {"verification": verification})
    counter = CallCounter(demo_lm.language_model)
    try:
        result = C.apply_threshold(verification, params, demo_lm)
    finally:
        counter.close()
    assert result.dropped and not result.rewrite_note  # the LM's own rewrite, not the grammar's
    assert (rewrite.calls, rewrite.tokens) == (counter.calls, counter.tokens)
    lenient = C.CorrectionParams(**{**vars(params), "pi": 100.0})  # nothing flagged: no rewrite
    assert cost.estimate_work(C.apply_threshold, demo_lm, lenient, {"verification": verification}).calls == 0
    grammar = C.CorrectionParams(**{**vars(params), "rewriter": "grammar"})
    assert cost.estimate_work(C.apply_threshold, demo_lm, grammar, {"verification": verification}).calls == 0


def test_a_calibration_slowed_by_a_crowd_is_measured_again_later(tiny_llama, monkeypatch):
    """A reading taken while the measuring thread got little CPU (a burst of users) stands only for
    RECALIBRATE_AFTER_S; the next estimate after that measures again and keeps the faster reading of
    each kind. A reading taken with the CPU to itself stands for good."""
    key = cost.calibration_key(tiny_llama)
    now = [1000.0]
    monkeypatch.setattr(cost, "_clock", lambda: now[0])
    slow = cost.Throughput(per_call=1.0, per_token=1.0, per_pair=1.0, per_logit=1.0, model="m", per_row=1e-12,
                           per_call_fixed=1.0, per_patch=1.0)
    try:
        cost._calibrated[key] = cost._Calibration(slow, now[0], share=0.1)
        now[0] += cost.RECALIBRATE_AFTER_S - 1
        assert cost.calibrate(tiny_llama) is slow  # not yet
        now[0] += 2
        fresh = cost.calibrate(tiny_llama)  # measured again (a tiny model: far below a second per call)
        assert fresh.per_call < 1.0 and fresh.per_token < 1.0 and fresh.per_call_fixed < 1.0
        assert fresh.per_row == 1e-12  # the earlier reading was the faster one of this kind
        assert cost._calibrated[key].share >= 0.1
        cost._calibrated[key] = cost._Calibration(slow, now[0], share=0.9)
        now[0] += 1e6
        assert cost.calibrate(tiny_llama) is slow  # an unhurried reading is not measured again
    finally:
        cost._calibrated.pop(key, None)


def test_calibration_records_the_measuring_thread_s_share_of_a_cpu(tiny_llama, monkeypatch):
    """The share is the thread's CPU time over wall time during the measurement."""
    key = cost.calibration_key(tiny_llama)
    cost._calibrated.pop(key, None)
    ticks = iter([0.0, 0.25])  # thread_time before and after: 0.25 s of CPU
    walls = iter([10.0, 11.0])  # perf_counter before and after: 1 s of wall time
    monkeypatch.setattr(cost, "_measure", lambda handle, repeats: cost.Throughput(1, 1, 1, 1, "m"))
    monkeypatch.setattr(cost.time, "thread_time", lambda: next(ticks))
    monkeypatch.setattr(cost.time, "perf_counter", lambda: next(walls))
    try:
        cost.calibrate(tiny_llama)
        assert cost._calibrated[key].share == pytest.approx(0.25)
    finally:
        cost._calibrated.pop(key, None)


def test_a_reading_serves_every_load_of_the_same_model(tiny_llama_dir, monkeypatch):
    """Calibrations are kept per model (name, size, dtype, device), not per Python object: a reading
    taken on one load (serve.py's, at server start) is the one a session's own load gets, without
    measuring again. A different model is measured on its own."""
    first = load_model(ModelSpec("local", str(tiny_llama_dir)))
    second = load_model(ModelSpec("local", str(tiny_llama_dir)))
    assert first.language_model is not second.language_model
    key = cost.calibration_key(first)
    cost._calibrated.pop(key, None)
    try:
        reading = cost.calibrate(first)

        def measure_again(handle, repeats):
            raise AssertionError("measured again")

        monkeypatch.setattr(cost, "_measure", measure_again)
        assert cost.calibrate(second) is reading
        other = dataclasses.replace(second, spec=ModelSpec("local", str(tiny_llama_dir / "elsewhere")))
        assert cost.calibration_key(other) != key
        with pytest.raises(AssertionError, match="measured again"):
            cost.calibrate(other)
    finally:
        cost._calibrated.pop(key, None)


def test_server_start_measures_each_demo_model_for_the_sessions(monkeypatch):
    """scripts/serve.py calls preload.calibrate_zoo() before it listens: afterwards a session's own load
    of each demo model finds its reading (taken on the idle machine) and measures nothing."""
    from analysis.model_access.models import zoo_models
    from components import preload

    import threading

    monkeypatch.setattr(cost, "_calibrated", {})
    measuring_threads = set()
    real_measure = cost._measure

    def measure(handle, repeats):
        measuring_threads.add(threading.current_thread())
        return real_measure(handle, repeats)

    monkeypatch.setattr(cost, "_measure", measure)
    seconds = preload.calibrate_zoo()
    assert sorted(seconds) == sorted(zoo_models()) and len(seconds) >= 2
    # never on the caller's thread (the server's main thread): torch work there leaves OpenMP workers
    # behind that slowed every later session's forwards 2.7x
    assert measuring_threads and threading.current_thread() not in measuring_threads

    def measure_again(handle, repeats):
        raise AssertionError("measured again")

    monkeypatch.setattr(cost, "_measure", measure_again)
    for name in zoo_models():
        handle = load_model(ModelSpec("zoo", name))
        assert cost.calibrate(handle).per_call > 0
        assert cost._calibrated[cost.calibration_key(handle)].share > 0


def test_serve_measures_the_demo_models_before_the_server_listens(monkeypatch):
    """scripts/serve.py (the README's command) calls calibrate_zoo() before Streamlit starts."""
    import runpy
    import sys as _sys

    from streamlit.web import cli as streamlit_cli

    from components import preload

    calls = []
    monkeypatch.setattr(preload, "calibrate_zoo", lambda: calls.append("calibrate") or {})
    monkeypatch.setattr(streamlit_cli, "main", lambda: calls.append("serve") or 0)
    monkeypatch.setattr(_sys, "argv", ["serve.py"])
    with pytest.raises(SystemExit):
        runpy.run_path(str(SCRIPTS / "serve.py"), run_name="__main__")
    assert calls == ["calibrate", "serve"]

"""Caption correction: agents and probability forms as registered classes that check their own
settings; raw vs renormalised p_True/p_False against an independent float64 reference; the
yes+no mass warning; the CLI's one-line errors."""
from __future__ import annotations

import math

import pytest
from conftest import app_with_model

from analysis import captions as C
from analysis.model_access import tiny_models
from analysis.__main__ import main
from analysis.model_access.models import ModelSpec, load_model, zoo_models
from analysis.framework.registry import SettingsError
from analysis.world import shapes_world as W

PAGE = "views/caption_correction.py"


@pytest.fixture(scope="module")
def shapes_llava_dir(model_root):
    return tiny_models.save_tiny_llava(model_root / "tiny-llava-shapes-settings", words=list(W.VOCAB))


@pytest.fixture(scope="module")
def shapes_llava(shapes_llava_dir):
    return load_model(ModelSpec("local", str(shapes_llava_dir)))


# --- settings ---------------------------------------------------------------------------------


def test_params_check_every_number_with_a_message_for_the_user():
    cases = [(dict(pi=-0.5), "threshold π must be at least 0"), (dict(pi=math.nan), "finite"),
             (dict(eps=0.0), "ε must be at least"), (dict(eps=0.9), "ε must be at most 0.5"),
             (dict(ig_steps=0), "Integrated Gradients steps must be at least 1"),
             (dict(scene_seed=-1), "scene seed must be at least 0"),
             (dict(probabilities="softmax"), "p_True/p_False form must be one of raw, renormalised")]
    for settings, message in cases:
        with pytest.raises(SettingsError, match=message):
            C.CorrectionParams(caption="x", **settings).validate()
    C.CorrectionParams(caption="x").validate()


def test_agents_are_registered_classes_that_check_their_settings():
    assert C.DECOMPOSERS.names() == ["grammar", "shapes-lm", "lm-chat"]
    assert C.REWRITERS.names() == ["grammar", "shapes-lm", "lm-chat"]
    assert C.VERIFIERS.names() == ["shapes-vlm", "vlm-yesno"]
    assert C.PROBABILITY_FORMS.names() == ["raw", "renormalised"]
    assert C.DECOMPOSERS.label("grammar") == C.GrammarDecomposer.label
    with pytest.raises(SettingsError, match="Rewriter: tokens to generate must be at least 1"):
        C.ShapesLMRewriter(lm=None, max_new_tokens=0)
    with pytest.raises(C.CaptionError, match="needs a language model"):
        C.make_agent("rewriter", "lm-chat", None)
    with pytest.raises(C.CaptionError, match="Unknown verifier"):
        C.make_verifier("nope", load_model)  # the name is checked before the model is used


def test_paper_form_is_the_default():
    # CapMAS writes H(u) = -log max(p(T|x,Q(u)) - p(F|x,Q(u)), eps) with the raw probabilities.
    assert C.CorrectionParams().probabilities == C.DEFAULT_PROBABILITIES == "raw"
    assert C.hallucination_score(0.3, 0.1) == pytest.approx(-math.log(0.2))
    assert C.hallucination_score(0.3, 0.1, probabilities="renormalised") == pytest.approx(-math.log(0.5))
    assert C.hallucination_score(0.0, 0.0, eps=1e-3, probabilities="renormalised") == pytest.approx(-math.log(1e-3))


# --- an independent reference ------------------------------------------------------------------


def reference(handle, image, claims, eps, pi):
    """Per claim, from one unpadded forward: softmax in float64 by hand, the yes/no ids found by
    scanning the vocabulary, then both forms of H and the flags, as plain Python loops."""
    vocab = handle.tokenizer.get_vocab()
    decode = handle.tokenizer.decode
    yes = [i for i in vocab.values() if decode([i]).strip().lower() == "yes"]
    no = [i for i in vocab.values() if decode([i]).strip().lower() == "no"]
    rows = []
    for claim in claims:
        inputs = handle.processor(images=image, text=W.vlm_question_prompt(claim), return_tensors="pt")
        with handle.session():
            logits = [float(x) for x in handle.model(**inputs).logits[0, -1].double()]
        top = max(logits)
        exps = [math.exp(x - top) for x in logits]
        total = sum(exps)
        p_t = sum(exps[i] for i in yes) / total
        p_f = sum(exps[i] for i in no) / total
        mass = p_t + p_f
        h_raw = -math.log(max(p_t - p_f, eps))
        h_norm = -math.log(max((p_t - p_f) / mass, eps)) if mass > 0 else -math.log(eps)
        rows.append(dict(p_t=p_t, p_f=p_f, mass=mass, raw=h_raw, renormalised=h_norm,
                         flag_raw=h_raw > pi, flag_renormalised=h_norm > pi, low=mass < 0.5))
    return rows


def test_both_forms_and_the_mass_match_a_float64_reference(shapes_llava):
    scene = W.Scene(objects=[W.Obj("circle", "red", "large", 0), W.Obj("square", "blue", "small", 4)], seed=-1)
    image = W.render(scene)
    caption = W.caption(scene) + " there is a small green triangle at the center ."
    params = C.CorrectionParams(caption=caption, decomposer="grammar", rewriter="grammar", verifier="shapes-vlm",
                                ground=False, eps=1e-3)
    verification = C.verify_caption(shapes_llava, image, params)
    claims = [v.claim for v in verification.claims]
    for pi in (0.5, 2.0):
        ref = reference(shapes_llava, image, claims, params.eps, pi)
        for form in ("raw", "renormalised"):
            result = C.apply_threshold(verification, C.CorrectionParams(**{**vars(params), "pi": pi,
                                                                         "probabilities": form}))
            for got, want in zip(result.claims, ref):
                assert got.p_true == pytest.approx(want["p_t"], abs=1e-6)
                assert got.p_false == pytest.approx(want["p_f"], abs=1e-6)
                assert got.mass == pytest.approx(want["mass"], abs=1e-6)
                assert got.score == pytest.approx(want[form], rel=1e-4, abs=1e-5)
                assert got.flagged == want[f"flag_{form}"]
                assert got.low_mass == want["low"]
    # The tiny random VLM spreads its answer over the whole vocabulary: the two forms really differ.
    assert all(r["low"] for r in ref)
    assert any(abs(r["raw"] - r["renormalised"]) > 0.1 for r in ref)


# --- the page -----------------------------------------------------------------------------------


def test_page_shows_the_mass_warns_when_small_and_switches_form_without_reverifying(shapes_llava_dir,
                                                                                     monkeypatch):
    scene = W.generate_scene(20000003)
    at = app_with_model(ModelSpec("local", str(shapes_llava_dir)), PAGE,
                        query={"src": "scene", "seed": "20000003", "cap": "paste", "text": W.caption(scene),
                               "dec": "grammar", "rew": "grammar", "ground": "0", "pi": "1"})
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert "yes+no mass" in table.columns and (table["yes+no mass"] < 0.5).all()
    warnings = " ".join(w.value for w in at.warning)
    assert "not really answering the question" in warnings
    assert at.radio(key="cap_prob").value == "raw"
    raw_h = list(table["H (nats)"])

    def no_verify(*args, **kwargs):
        raise AssertionError("switching the probability form must reuse the cached verification")

    monkeypatch.setattr(C, "verify_caption", no_verify)
    monkeypatch.setattr(C.pipeline, "verify_caption", no_verify)
    at.radio(key="cap_prob").set_value("renormalised").run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert "p_True/(p_True+p_False)" in table.columns
    assert list(table["H (nats)"]) != raw_h
    assert at.query_params["prob"] == "renormalised"


def test_page_gives_the_class_message_for_a_negative_pi_in_the_url(shapes_llava_dir):
    at = app_with_model(ModelSpec("local", str(shapes_llava_dir)), PAGE,
                        query={"src": "scene", "seed": "20000003", "cap": "paste",
                               "text": "there is a red circle .", "dec": "grammar", "rew": "grammar",
                               "ground": "0", "pi": "-1"})
    assert not at.exception, at.exception
    assert any("threshold π must be at least 0" in e.value for e in at.error)
    assert at.slider(key="cap_pi").value == 0.0  # the nearest allowed value (components/params_form.py)


def test_demo_verifier_answers_the_question_so_there_is_no_mass_warning():
    if "shapes-vlm" not in zoo_models():
        pytest.skip("demo model shapes-vlm is not built")
    vlm = load_model(ModelSpec("zoo", "shapes-vlm"))
    scene = W.generate_scene(20000003)
    params = C.CorrectionParams(caption=W.caption(scene), decomposer="grammar", rewriter="grammar", ground=False)
    result = C.correct_caption(vlm, W.render(scene), params)
    assert min(c.mass for c in result.claims) > 0.9 and not any(c.low_mass for c in result.claims)


# --- the command line ---------------------------------------------------------------------------


def run_cli(capsys, argv):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


@pytest.mark.parametrize("extra, needle", [
    (["--pi", "-1"], "threshold π must be at least 0"),
    (["--pi", "inf"], "--pi: cannot read 'inf'"),
    (["--eps", "0"], "ε must be at least"),
    (["--eps", "2"], "ε must be at most 0.5"),
    (["--ig-steps", "0"], "Integrated Gradients steps must be at least 1"),
    (["--seed", "-4"], "scene seed must be at least 0"),
    (["--probabilities", "softmax"], "p_True/p_False form must be one of raw, renormalised, got 'softmax'"),
    (["--decomposer", "nope"], "Decomposer must be one of auto, grammar, shapes-lm, lm-chat, got 'nope'"),
    (["--pi", "high"], "--pi: cannot read 'high' as The threshold π"),
    (["--decomposer-tokens", "0"], "Decomposer: tokens to generate must be at least 1"),
    (["--batch-size", "0"], "Verifier batch size must be at least 1"),
])
def test_captions_cli_out_of_range_is_one_error_line(capsys, extra, needle):
    code, err = run_cli(capsys, ["captions", "--model", "local:/nonexistent", *extra])
    assert code != 0 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and needle in lines[0], err


def test_captions_cli_bad_model_is_one_error_line(capsys):
    code, err = run_cli(capsys, ["captions", "--model", "local:/nonexistent"])
    assert code != 0 and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1

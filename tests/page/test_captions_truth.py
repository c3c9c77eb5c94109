"""Caption correction without ground truth (issue 31): no metric where the Shapes World grammar cannot read the
caption (page, CLI and export say "not measurable", JSON null), no rewrite when nothing is kept, the demo LM
refuses a caption it cannot read, and each agent's own settings reach it from the CLI, the URL and saved params."""
from __future__ import annotations

import json

import pytest
from conftest import app_with_model

from analysis import captions as C
from analysis.model_access import tiny_models
from analysis.__main__ import main
from analysis.model_access.models import ModelSpec, load_model
from analysis.world import shapes_world as W

PAGE = "views/caption_correction.py"
CHAT = ("{% for m in messages %}<s> USER: {{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %} ASSISTANT:{% endif %}")
ENGLISH = "A brown dog runs along a sandy beach. Two people sit under a blue umbrella."
PARTLY = "there is a large yellow triangle at the top middle . it looks happy ."


@pytest.fixture(scope="module")
def shapes_llava_dir(model_root):
    return tiny_models.save_tiny_llava(model_root / "tiny-llava-shapes-truth", words=list(W.VOCAB))


@pytest.fixture(scope="module")
def shapes_llava(shapes_llava_dir):
    return load_model(ModelSpec("local", str(shapes_llava_dir)))


@pytest.fixture(scope="module")
def chat_lm_dir(model_root):
    """A tiny LM whose tokenizer has a chat template (its answers are faked: it is random)."""
    from transformers import AutoTokenizer

    folder = tiny_models.save_tiny_llama(model_root / "tiny-chat-lm")
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = CHAT
    tok.save_pretrained(folder)
    return folder


class Oracle:
    """Knows the scene: p_T = 0.9 for a true claim the grammar parses, 0.05 otherwise."""

    name = "oracle"

    def __init__(self, scene):
        self.scene = scene

    def verify(self, image, claims):
        return [(0.9, 0.05) if C.claim_truth(self.scene, c) else (0.05, 0.9) for c in claims]


def _answers(monkeypatch, *texts):
    """The agents' LM answers these texts in turn (and records what it was asked)."""
    asked, queue = [], list(texts)

    def fake(handle, prompt, max_new_tokens=64, add_special_tokens=True):
        asked.append((prompt, max_new_tokens))
        return queue.pop(0)

    monkeypatch.setattr(C.generation, "generate_text", fake)
    return asked


def test_the_grammar_covers_only_captions_it_reads_whole():
    scene = W.generate_scene(20000003)
    assert C.grammar_covers(W.caption(scene)) and C.grammar_covers("there is nothing .") and C.grammar_covers("")
    assert C.grammar_covers("there is a large red circle at the top left.")  # glued full stop
    assert not C.grammar_covers(PARTLY) and not C.grammar_covers(ENGLISH)
    assert C.claim_truth(scene, "There is a yellow triangle.") is True  # a sentence in the grammar's words
    assert C.claim_truth(scene, "The dog is brown.") is None


def test_a_caption_the_grammar_reads_only_in_part_has_no_metrics(shapes_llava, monkeypatch):
    seed = 20000003
    scene = W.generate_scene(seed)
    monkeypatch.setattr(C.pipeline, "verifier_of", lambda params, vlm: Oracle(scene))
    params = C.CorrectionParams(caption=PARTLY, decomposer="grammar", rewriter="grammar", ground=False,
                                scene_seed=seed)
    result = C.correct_caption(shapes_llava, W.render(scene), params)
    assert [c.truth for c in result.claims] == [True, True, False]  # the claims it parses have ground truth
    assert result.dropped == ["the yellow triangle is at the top middle"]
    assert result.before is None and result.after is None and "does not read this caption" in result.ground_truth
    assert result.sweep[0].factuality is not None  # its claims all parse: the claim-level sweep is exact
    data = json.loads(result.to_json())
    assert data["before"] is None and data["after"] is None
    # the same claims in a caption the grammar reads whole are measured (ground truth for every word)
    whole = C.correct_caption(shapes_llava, W.render(scene), C.CorrectionParams(
        **{**vars(params), "caption": "there is a large yellow triangle at the top middle ."}))
    assert whole.before.factuality == pytest.approx(2 / 3) and whole.after.factuality == 1.0
    assert whole.ground_truth == ""


def test_english_claims_have_no_truth_and_nothing_kept_means_no_rewrite(shapes_llava, chat_lm_dir, monkeypatch):
    lm = load_model(ModelSpec("local", str(chat_lm_dir)))
    scene = W.generate_scene(20000003)
    monkeypatch.setattr(C.pipeline, "verifier_of", lambda params, vlm: Oracle(scene))
    asked = _answers(monkeypatch, "The dog runs along a beach.\n- The dog is brown.", "Two people sit.",
                     "A brown dog runs along a sandy beach with a ball and two cats and a red frisbee in the sun.")
    params = C.CorrectionParams(caption=ENGLISH, decomposer="lm-chat", rewriter="lm-chat", ground=False,
                                scene_seed=20000003)
    result = C.correct_caption(shapes_llava, W.render(scene), params, lm)
    assert result.dropped == ["The dog runs along a beach.", "The dog is brown.", "Two people sit."]
    assert all(c.truth is None for c in result.claims)
    assert len(asked) == 2  # one decomposer call per sentence; the rewriter was not asked: nothing was kept
    assert result.corrected == "" and "no corrected caption" in result.rewrite_note
    assert result.before is None and result.after is None
    assert all(p.factuality is None and p.coverage is None for p in result.sweep)
    # its cost estimate counts no rewrite either
    from analysis.framework import cost

    verification = C.Verification(caption=ENGLISH, claims=result.claims, grid=0, agents={})
    assert cost.estimate_work(C.rewrite_verified, lm, params, {"verification": verification}).calls == 0


def _cli(capsys, argv):
    try:
        code = main(["captions", *argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_reports_no_factuality_for_a_caption_the_grammar_cannot_read(shapes_llava_dir, chat_lm_dir, capsys,
                                                                           monkeypatch):
    common = ["--model", f"local:{shapes_llava_dir}", "--seed", "20000003", "--verifier", "shapes-vlm", "--no-ground"]
    code, out, err = _cli(capsys, [*common, "--caption", PARTLY, "--decomposer", "grammar", "--rewriter", "grammar"])
    assert code == 0, err
    assert "not measurable" in out and "factuality 1" not in out and "factuality 0" not in out
    code, out, err = _cli(capsys, [*common, "--caption", PARTLY, "--decomposer", "grammar", "--rewriter", "grammar",
                                   "--json"])
    data = json.loads(out)
    assert code == 0 and data["before"] is None and data["after"] is None and data["ground_truth"]
    _answers(monkeypatch, "The dog runs along a beach.", "Two people sit under an umbrella.")
    code, out, err = _cli(capsys, [*common, "--lm", f"local:{chat_lm_dir}", "--caption", ENGLISH, "--json"])
    data = json.loads(out)
    assert code == 0, err
    assert data["agents"]["decomposer"] == "lm-chat" and data["before"] is None and data["after"] is None
    assert all(c["truth"] is None for c in data["claims"])


def test_the_demo_lm_refuses_a_caption_it_cannot_read(shapes_llava):
    decomposer = C.make_agent("decomposer", "shapes-lm", shapes_llava)  # its vocabulary is Shapes World's
    with pytest.raises(C.CaptionError, match=r"does not know \(A, brown, dog, runs, along"):
        decomposer.decompose(ENGLISH)


def test_the_agents_lm_of_a_vlm_that_is_not_a_demo_model_is_its_own(tiny_llava):
    assert C.load_agent_lm(None, tiny_llava) is tiny_llava


def test_page_shows_not_measurable_and_exports_it(shapes_llava_dir):
    at = app_with_model(ModelSpec("local", str(shapes_llava_dir)), PAGE,
                        query={"src": "scene", "seed": "20000003", "cap": "paste", "text": PARTLY, "dec": "grammar",
                               "rew": "grammar", "ver": "shapes-vlm", "ground": "0", "pi": "1"})
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert {m.label: m.value for m in at.metric} == {"Factuality": "not measurable", "Coverage": "not measurable",
                                                     "CHAIR_i": "not measurable"}
    assert any("does not read this caption" in c.value for c in at.caption)
    from components.figures import captions as F

    result = C.CorrectionResult(params=C.CorrectionParams(), caption="", corrected="", claims=[], diff=[],
                                agents={}, grid=0, ground_truth="why")
    assert {r["before"] for r in F.metric_rows(result)} == {"not measurable"}


# --- each agent's settings: CLI, URL, saved params ----------------------------------------------------------


def test_agent_settings_reach_the_agents_from_the_command_line(shapes_llava_dir, capsys, monkeypatch):
    import importlib

    cli = importlib.import_module("analysis.captions.cli")
    args = cli.parser().parse_args(["--decomposer-tokens", "7", "--rewriter-tokens", "9", "--batch-size", "3",
                                    "--rewriter-checked", "0"])
    params = cli.params_from(args)
    assert params.decomposers == {"shapes-lm": {"max_new_tokens": 7}, "lm-chat": {"max_new_tokens": 7}}
    assert params.rewriters == {"shapes-lm": {"max_new_tokens": 9, "checked": False},
                                "lm-chat": {"max_new_tokens": 9, "checked": False}}
    assert params.verifiers == {"shapes-vlm": {"batch_size": 3}, "vlm-yesno": {"batch_size": 3}}
    caption = W.caption(W.generate_scene(20000003))
    asked = _answers(monkeypatch, " ; ".join(W.decompose(caption)))
    code, out, err = _cli(capsys, ["--model", f"local:{shapes_llava_dir}", "--lm", f"local:{shapes_llava_dir}",
                                   "--seed", "20000003", "--caption", caption, "--decomposer", "shapes-lm",
                                   "--rewriter", "grammar", "--verifier", "shapes-vlm", "--no-ground",
                                   "--decomposer-tokens", "7", "--json"])
    assert code == 0, err
    assert asked[0][1] == 7  # the decomposer's own setting, not its default (160)
    assert json.loads(out)["params"]["decomposers"]["shapes-lm"] == {"max_new_tokens": 7}


def test_agent_settings_reach_the_agents_from_the_url(shapes_llava_dir, monkeypatch):
    caption = W.caption(W.generate_scene(20000003))
    asked = []

    def fake(handle, prompt, max_new_tokens=64, add_special_tokens=True):
        asked.append(max_new_tokens)
        return " ; ".join(W.decompose(caption))

    monkeypatch.setattr(C.generation, "generate_text", fake)
    at = app_with_model(ModelSpec("local", str(shapes_llava_dir)), PAGE,
                        query={"src": "scene", "seed": "20000003", "cap": "paste", "text": caption, "dec": "shapes-lm",
                               "rew": "grammar", "lm": "the VLM's own language model", "ground": "0",
                               "dec_tokens": "11", "batch": "2"})
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert asked == [11]
    assert at.number_input(key="cap_dec_max_new_tokens").value == 11
    assert at.query_params["dec_tokens"] == "11" and at.query_params["batch"] == "2"
    at = app_with_model(ModelSpec("local", str(shapes_llava_dir)), PAGE,
                        query={"src": "scene", "seed": "20000003", "cap": "paste", "text": caption, "dec": "shapes-lm",
                               "rew": "grammar", "lm": "the VLM's own language model", "ground": "0",
                               "dec_tokens": "0"})
    assert not at.exception
    assert any("Decomposer: tokens to generate must be at least 1" in e.value.replace("\\", "")  # shown escaped
               for e in at.error)


def test_params_check_each_agents_settings_by_its_class():
    with pytest.raises(C.CaptionError.__mro__[1], match="Verifier batch size must be at least 1"):
        C.CorrectionParams(verifiers={"vlm-yesno": {"batch_size": 0}}).validate()
    with pytest.raises(C.CaptionError.__mro__[1], match="has no setting"):
        C.CorrectionParams(decomposers={"grammar": {"max_new_tokens": 5}}).validate()
    with pytest.raises(C.CaptionError.__mro__[1], match="Unknown rewriter 'nope'"):
        C.CorrectionParams(rewriters={"nope": {}}).validate()
    with pytest.raises(C.CaptionError.__mro__[1], match="No decomposer has the setting"):
        C.agent_settings("decomposer", batch_size=3)


def test_an_old_flat_saved_analysis_still_opens():
    """Params and a result as saved before each agent owned its settings (no per-agent dicts, no notes)."""
    old_params = {"caption": "there is a large red circle .", "pi": 1.0, "eps": 0.0001, "decomposer": "auto",
                  "verifier": "auto", "rewriter": "auto", "ground": True, "ig_steps": 8, "scene_seed": 20000003,
                  "probabilities": "raw"}
    params = C.CorrectionParams.from_dict(old_params)
    params.validate()
    assert params.decomposers == {} and params.pi == 1.0 and params.scene_seed == 20000003
    old_result = {"params": old_params, "caption": old_params["caption"], "corrected": old_params["caption"],
                  "claims": [{"claim": "there is a red circle", "p_true": 0.9, "p_false": 0.1, "score": 0.2,
                              "flagged": False, "truth": False, "heatmap": None, "asked": True}],
                  "diff": [{"op": "same", "text": old_params["caption"]}], "agents": {"decomposer": "grammar"},
                  "grid": 0, "before": None, "after": None, "sweep": [], "rewrite_note": ""}
    result = C.CorrectionResult.from_dict(old_result)
    assert result.kept == ["there is a red circle"] and result.ground_truth == "" and result.decompose_note == ""


def test_runs_are_keyed_by_an_uploads_bytes_and_a_verifications_content():
    a, b = C.Upload(b"abc"), C.Upload(b"abd")
    assert repr(a) == repr(C.Upload(b"abc")) != repr(b) and "sha256=" in repr(a)
    v = C.Verification(caption="x", claims=[C.ClaimVerdict("x", 0.5, 0.5, 9.2, True, heatmap=[[0.0] * 24] * 24)],
                       grid=24, agents={})
    assert len(repr(v)) < 80 and repr(v) == repr(C.Verification.from_json(v.to_json()))

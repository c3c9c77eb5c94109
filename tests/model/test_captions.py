"""Caption correction (CapMAS): agents, score, pipeline, grounding, metrics, image checks."""
from __future__ import annotations

import math
import struct
import zlib

import pytest
import torch

from analysis import captions as C
from analysis.model_access import tiny_models
from analysis.framework.images import ImageError, open_image
from analysis.model_access.models import ModelSpec, load_model, zoo_models
from analysis.world import shapes_world as W


@pytest.fixture(scope="module")
def shapes_llava(model_root):
    """A tiny random LLaVA whose vocabulary is Shapes World's, so its prompts tokenize exactly."""
    folder = tiny_models.save_tiny_llava(model_root / "tiny-llava-shapes", words=list(W.VOCAB))
    return load_model(ModelSpec("local", str(folder)))


@pytest.fixture(scope="module")
def shapes_vlm():
    if "shapes-vlm" not in zoo_models():
        pytest.skip("demo model shapes-vlm is not built")
    return load_model(ModelSpec("zoo", "shapes-vlm"))


@pytest.fixture(scope="module")
def shapes_lm():
    if "shapes-lm" not in zoo_models():
        pytest.skip("demo model shapes-lm is not built")
    return load_model(ModelSpec("zoo", "shapes-lm"))


@pytest.fixture
def scene():
    return W.Scene(objects=[W.Obj("circle", "red", "large", 0), W.Obj("square", "blue", "small", 4)], seed=-1)


class OracleVerifier:
    """Stand-in verifier that knows the scene: p_T = 0.9 for true claims, 0.05 otherwise."""

    name = "oracle"

    def __init__(self, scene):
        self.scene = scene

    def verify(self, image, claims):
        return [(0.9, 0.05) if W.claim_truth(self.scene, c) else (0.05, 0.9) for c in claims]


# --- decomposer -------------------------------------------------------------------------------


def test_grammar_decomposer_splits_caption_into_existence_size_position_claims():
    caption = "there is a large red circle at the top left . there is a small blue square at the center ."
    assert C.make_agent("decomposer", "grammar", None).decompose(caption) == [
        "there is a red circle", "the red circle is large", "the red circle is at the top left",
        "there is a blue square", "the blue square is small", "the blue square is at the center",
    ]


def test_grammar_decomposer_of_a_full_caption_gives_exactly_the_scene_facts():
    decomposer = C.make_agent("decomposer", "grammar", None)
    for seed in W.split_seeds("test", 30):
        scene = W.generate_scene(seed)
        assert decomposer.decompose(W.caption(scene)) == [f.text for f in W.scene_facts(scene)]


def test_shapes_lm_decomposer_matches_grammar_reference(shapes_lm):
    decomposer = C.make_agent("decomposer", "shapes-lm", shapes_lm)
    seeds = W.split_seeds("test", 12)
    exact = sum(decomposer.decompose(W.caption(W.generate_scene(s))) == W.decompose(W.caption(W.generate_scene(s)))
                for s in seeds)
    assert exact >= 0.9 * len(seeds)


def _fake_lm_rewriter(monkeypatch, output: str) -> C.ShapesLMRewriter:
    """The demo LM's rewriter with generation replaced by a fixed answer (the LM itself is not needed)."""
    monkeypatch.setattr(C.generation, "generate_text", lambda lm, prompt, n, add_special_tokens=False: output)
    return C.ShapesLMRewriter(lm=None)


def test_shapes_lm_rewrite_that_restates_a_dropped_claim_is_replaced_by_the_grammar_rewrite(monkeypatch):
    caption = "there is a large red circle at the top left . there is a small blue square at the center ."
    keep = ["there is a red circle", "the red circle is large", "the red circle is at the top left"]
    drop = ["there is a blue square", "the blue square is small", "the blue square is at the center"]
    # The LM "forgets" to drop the square: its output puts the hallucination back.
    rewriter = _fake_lm_rewriter(monkeypatch, caption)
    out = rewriter.rewrite(caption, keep, drop)
    assert out == "there is a large red circle at the top left ."
    assert out == W.rewrite(caption, keep)
    assert "3 claim(s)" in rewriter.note and "there is a blue square" in rewriter.note
    # An invented object counts too, even if nothing was dropped from it.
    rewriter = _fake_lm_rewriter(monkeypatch, "there is a large red circle at the top left . there is a green triangle .")
    assert rewriter.rewrite(caption, keep, drop) == "there is a large red circle at the top left ."
    assert "there is a green triangle" in rewriter.note


def test_shapes_lm_rewrite_that_only_removes_is_kept_and_unchecked_mode_returns_it_verbatim(monkeypatch):
    caption = "there is a large red circle at the top left . there is a small blue square at the center ."
    keep = ["there is a red circle", "the red circle is large", "there is a blue square"]
    drop = ["the red circle is at the top left", "the blue square is small", "the blue square is at the center"]
    # Dropping more than asked (here the square) is a coverage loss, not a hallucination: kept as written.
    rewriter = _fake_lm_rewriter(monkeypatch, "there is a large red circle .")
    assert rewriter.rewrite(caption, keep, drop) == "there is a large red circle ."
    assert rewriter.note == ""
    rewriter = _fake_lm_rewriter(monkeypatch, caption)
    rewriter.checked = False
    assert rewriter.rewrite(caption, keep, drop) == caption and rewriter.note == ""


def test_shapes_lm_rewriter_never_states_a_claim_that_was_not_kept(shapes_lm):
    """On hallucinated captions with their false claims dropped, the (checked) demo LM rewriter's output
    parses into kept claims only, and it keeps the LM's own text whenever that text is faithful."""
    import random

    rewriter = C.make_agent("rewriter", "shapes-lm", shapes_lm)
    rng = random.Random(7)
    lm_kept = 0
    for seed in W.split_seeds("test", 16):
        scene = W.generate_scene(seed)
        caption = W.caption(W.hallucinate(scene, rng))
        claims = W.caption_claims(scene, caption)
        keep = [c.text for c in claims if c.truth]
        drop = [c.text for c in claims if not c.truth]
        out = rewriter.rewrite(caption, keep, drop)
        assert set(W.decompose(out)) <= set(keep)
        lm_kept += rewriter.note == ""
    assert lm_kept >= 12  # the LM's rewrite is about 90% exact, so the grammar fallback is the exception


def test_unknown_agent_name_is_a_clear_error():
    with pytest.raises(C.CaptionError, match="Unknown decomposer"):
        C.make_agent("decomposer", "nope", None)


# --- verifier and score -------------------------------------------------------------------------


def test_verifier_probabilities_are_a_sub_distribution_and_match_one_claim_at_a_time(shapes_llava, scene):
    image = W.render(scene)
    verifier = C.make_verifier("shapes-vlm", shapes_llava)
    claims = W.decompose(W.caption(scene)) + ["there is a green triangle", "the red circle is small"]
    batched = verifier.verify(image, claims)
    for claim, (p_t, p_f) in zip(claims, batched):
        assert 0.0 <= p_t <= 1.0 and 0.0 <= p_f <= 1.0 and p_t + p_f <= 1.0 + 1e-6
        # Brute force: one unpadded forward per claim, probabilities summed by hand.
        inputs = shapes_llava.processor(images=image, text=W.vlm_question_prompt(claim), return_tensors="pt")
        with shapes_llava.session():
            probs = shapes_llava.model(**inputs).logits[0, -1].softmax(-1)
        vocab = shapes_llava.tokenizer.get_vocab()
        assert p_t == pytest.approx(float(probs[vocab["yes"]]), abs=1e-5)
        assert p_f == pytest.approx(float(probs[vocab["no"]]), abs=1e-5)


def test_verifier_refuses_a_vocabulary_without_yes_and_no(tiny_llava):
    with pytest.raises(C.CaptionError, match="no single token"):
        C.make_verifier("vlm-yesno", tiny_llava)


def test_hallucination_score_is_minus_log_of_the_clamped_margin():
    assert C.hallucination_score(1.0, 0.0) == pytest.approx(0.0)
    assert C.hallucination_score(0.5 + math.exp(-2) / 2, 0.5 - math.exp(-2) / 2) == pytest.approx(2.0)
    assert C.hallucination_score(0.3, 0.6, eps=1e-3) == pytest.approx(-math.log(1e-3))


# --- pipeline ---------------------------------------------------------------------------------


def test_planted_false_claim_is_dropped_and_true_claims_kept(scene, monkeypatch, shapes_llava):
    planted = W.caption(scene) + " there is a small green triangle at the bottom right ."
    monkeypatch.setattr(C.pipeline, "verifier_of", lambda params, vlm: OracleVerifier(scene))
    params = C.CorrectionParams(caption=planted, decomposer="grammar", rewriter="grammar", ground=False,
                                scene_seed=None)
    result = C.correct_caption(shapes_llava, W.render(scene), params)
    assert result.dropped == ["there is a green triangle", "the green triangle is small",
                              "the green triangle is at the bottom right"]
    assert result.kept == W.decompose(W.caption(scene))
    assert result.corrected == W.caption(scene)
    assert [d.op for d in result.diff] == ["same", "removed"]


def test_demo_pipeline_caption_states_only_kept_claims_and_none_dropped(shapes_vlm):
    for seed in W.split_seeds("test", 4):
        scene = W.generate_scene(seed)
        absent = next((c, s) for c in W.COLOURS for s in W.SHAPES if scene.find(c, s) is None)
        planted = W.caption(scene) + f" there is a small {absent[0]} {absent[1]} at the center ."
        params = C.CorrectionParams(caption=planted, decomposer="grammar", rewriter="grammar", ground=False,
                                    scene_seed=seed, pi=0.7)
        result = C.correct_caption(shapes_vlm, W.render(scene), params)
        stated = set(W.decompose(result.corrected))
        assert stated <= set(result.kept) and not stated & set(result.dropped)
        assert all(c.flagged == (c.score > 0.7) for c in result.claims)
        assert [c.truth for c in result.claims][-3:] == [False, False, False]


def test_threshold_only_changes_flags_not_probabilities(scene, monkeypatch, shapes_llava):
    monkeypatch.setattr(C.pipeline, "verifier_of", lambda params, vlm: OracleVerifier(scene))
    params = C.CorrectionParams(caption=W.caption(scene), decomposer="grammar", rewriter="grammar",
                                ground=False)
    verification = C.verify_caption(shapes_llava, W.render(scene), params)
    strict = C.apply_threshold(verification, C.CorrectionParams(**{**vars(params), "pi": 0.0}))
    lenient = C.apply_threshold(verification, C.CorrectionParams(**{**vars(params), "pi": 5.0}))
    assert all(c.flagged for c in strict.claims) and not any(c.flagged for c in lenient.claims)
    assert strict.corrected == "there is nothing ." and lenient.corrected == W.caption(scene)


def test_caption_without_claims_is_a_clear_error(shapes_llava, scene):
    params = C.CorrectionParams(caption="hello world", decomposer="grammar", rewriter="grammar", ground=False)
    with pytest.raises(C.CaptionError, match="no claims"):
        C.correct_caption(shapes_llava, W.render(scene), params)


def test_pi_sweep_keeps_more_claims_as_pi_grows(scene):
    verdicts = [C.ClaimVerdict(c, 0, 0, s, False) for c, s in
                zip(W.decompose(W.caption(scene)) + ["there is a green circle"], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 2.0])]
    sweep = C.pi_sweep(verdicts, scene, pis=[0.0, 0.35, 1.0, 3.0])
    assert [p.kept for p in sweep] == [0, 3, 6, 7]
    assert [p.coverage for p in sweep] == [0.0, 0.5, 1.0, 1.0]
    assert [p.factuality for p in sweep] == [1.0, 1.0, 1.0, 6 / 7]


# --- grounding --------------------------------------------------------------------------------


def test_captum_heatmap_has_the_patch_grid_shape_is_finite_and_complete(shapes_llava, scene):
    verifier = C.make_verifier("shapes-vlm", shapes_llava)
    image = W.render(scene)
    claim = "there is a red circle"
    [heatmap] = C.ground_claims(verifier, image, [claim], steps=32)
    heat = torch.tensor(heatmap)
    grid = shapes_llava.info.image_size // shapes_llava.model.config.vision_config.patch_size
    assert heat.shape == (grid, grid) and torch.isfinite(heat).all() and heat.abs().sum() > 0
    # Integrated Gradients completeness: the patches sum to margin(image) - margin(baseline).
    inputs = C.vlm_inputs(shapes_llava, [image], [verifier.question(claim)])
    with shapes_llava.session():
        full = verifier.answer_margin(shapes_llava.model(**inputs).logits[:, -1])
        inputs["pixel_values"] = torch.zeros_like(inputs["pixel_values"])
        base = verifier.answer_margin(shapes_llava.model(**inputs).logits[:, -1])
    assert float(heat.sum()) == pytest.approx(float(full - base), rel=0.1, abs=1e-3)


# --- metrics ----------------------------------------------------------------------------------


def test_metrics_equal_hand_computed_values(scene):
    # Caption: the red circle right (3 true), a wrong size for the blue square (existence + position
    # true, size false) and an absent yellow triangle (3 false): 5 of 9 claims true.
    text = ("there is a large red circle at the top left . there is a large blue square at the center . "
            "there is a small yellow triangle at the bottom right .")
    m = C.score_caption(scene, text)
    assert (m.claims, m.true_claims, m.factuality) == (9, 5, pytest.approx(5 / 9))
    assert (m.facts, m.facts_stated, m.coverage) == (6, 5, pytest.approx(5 / 6))
    assert (m.objects_mentioned, m.objects_hallucinated, m.chair_i, m.chair_s) == (3, 1, pytest.approx(1 / 3), 1.0)
    assert C.factuality([]) == 1.0 and C.coverage({"a"}, {"a", "b", "c", "d"}) == 0.25
    assert C.chair(["x", "y"], {"x", "y"}) == (0.0, 0.0)


def test_pope_scores_equal_hand_computed_values():
    # tp=2 fp=1 fn=1 tn=2
    pred = [True, True, True, False, False, False]
    truth = [True, True, False, True, False, False]
    p = C.pope(pred, truth)
    assert (p.n, p.accuracy, p.precision, p.recall) == (6, pytest.approx(4 / 6), pytest.approx(2 / 3), pytest.approx(2 / 3))
    assert p.f1 == pytest.approx(2 / 3) and p.yes_ratio == 0.5


def test_word_diff_marks_removed_and_added_words():
    spans = C.word_diff("there is a large red circle .", "there is a red circle .")
    assert [(s.op, s.text) for s in spans] == [("same", "there is a"), ("removed", "large"), ("same", "red circle .")]


# --- images -----------------------------------------------------------------------------------


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (a decompression bomb if it were decoded)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


def test_pixel_bomb_is_refused_before_decoding():
    with pytest.raises(ImageError, match="pixels"):
        open_image(_png_header_only(100_000, 100_000))


def test_non_image_upload_is_refused():
    with pytest.raises(ImageError, match="not an image"):
        open_image(b"%PDF-1.4 this is not an image")


def test_small_png_round_trips(scene):
    import io

    buf = io.BytesIO()
    W.render(scene).save(buf, format="PNG")
    assert open_image(buf.getvalue()).size == (64, 64)


# --- result and CLI ---------------------------------------------------------------------------


def test_cli_prints_a_result_that_round_trips(shapes_llava, scene, capsys):
    caption = W.caption(W.generate_scene(7))
    rc = C.cli(["--model", f"local:{shapes_llava.path}", "--lm", f"local:{shapes_llava.path}", "--seed", "7",
                "--caption", caption, "--decomposer", "grammar", "--rewriter", "grammar",
                "--verifier", "shapes-vlm", "--no-ground", "--json"])
    assert rc == 0
    result = C.CorrectionResult.from_json(capsys.readouterr().out)
    assert result.caption == caption and result.before.factuality == 1.0
    assert len(result.claims) == len(W.decompose(caption))
    assert all(c.truth for c in result.claims)


# --- figures ----------------------------------------------------------------------------------


def test_diff_html_escapes_user_text():
    from components.figures.captions import diff_html

    out = diff_html([C.DiffSpan("same", "<script>alert(1)</script>"), C.DiffSpan("removed", "a & b")])
    assert "<script>" not in out and "&lt;script&gt;" in out and "a &amp; b" in out


def test_figures_show_claims_threshold_and_patch_grid(scene, monkeypatch, shapes_llava):
    from components.figures import captions as F

    monkeypatch.setattr(C.pipeline, "verifier_of", lambda params, vlm: OracleVerifier(scene))
    params = C.CorrectionParams(caption=W.caption(scene), decomposer="grammar", rewriter="grammar",
                                ground=False, scene_seed=None)
    result = C.correct_caption(shapes_llava, W.render(scene), params)
    assert len(F.score_figure(result).data[0].y) == len(result.claims)
    assert F.sweep_figure(result).layout.xaxis.title.text.startswith("threshold π")
    result.claims[0].heatmap = [[0.0, 1.0], [-1.0, 0.5]]
    heat = F.heatmap_figure(result.claims[0], F.model_view(W.render(scene), 32))
    assert heat.data[1].z.shape == (2, 2) and list(heat.data[1].x) == [7.5, 23.5]
    assert len(F.claim_rows(result)) == len(result.claims)


# --- prompt-based agents for instruct models --------------------------------------------------

CHAT = ("{% for m in messages %}<s> USER: {{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %} ASSISTANT:{% endif %}")
VLM_CHAT = ("{% for m in messages %}USER: {% for c in m['content'] %}{% if c['type'] == 'image' %}<image> "
            "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endfor %}{% if add_generation_prompt %} ASSISTANT:{% endif %}")


def test_chat_agents_prompt_through_the_chat_template_and_parse_the_answer(shapes_llava, monkeypatch):
    monkeypatch.setattr(shapes_llava.tokenizer, "chat_template", CHAT, raising=False)
    prompts = []
    answers = iter(["The cat is black.\n- The cat sleeps.\n\n* The cat sleeps.\n- ```python",
                    "1. The mat is red.\n2. The cat lies on a mat.\n3. The dog barks loudly."])

    def fake_generate(handle, prompt, max_new_tokens=64, add_special_tokens=True):
        prompts.append((prompt, add_special_tokens))
        return next(answers)

    monkeypatch.setattr(C.generation, "generate_text", fake_generate)
    decomposer = C.make_agent("decomposer", "lm-chat", shapes_llava)
    claims = decomposer.decompose("A black cat sleeps. It lies on a red mat.")
    # one call per sentence; bullets and numbers stripped, duplicates dropped; lines that are not sentences
    # about the caption are refused and named
    assert claims == ["The cat is black.", "The cat sleeps.", "The mat is red.", "The cat lies on a mat."]
    assert "```python" in decomposer.note and "The dog barks loudly." in decomposer.note
    first, second = prompts[0][0], prompts[1][0]
    assert first.startswith("<s> USER: You list the facts") and first.endswith("ASSISTANT:- ")
    assert "Caption: A black cat sleeps." in first and "red mat" not in first and "Caption: It lies on" in second
    assert all(C.DECOMPOSE_EXAMPLES[0][1] in p for p, _ in prompts)  # the worked examples come first
    assert prompts[0][1] is False  # the template already has its BOS
    rewriter = C.make_agent("rewriter", "lm-chat", shapes_llava)
    assert rewriter.rewrite("A black cat sleeps.", ["The cat sleeps."], []) == "A black cat sleeps."
    answers = iter(["A cat sleeps."])
    assert rewriter.rewrite("A black cat sleeps.", ["The cat sleeps."], ["The cat is black."]) == "A cat sleeps."
    assert "- The cat is black." in prompts[-1][0] and prompts[-1][0].endswith("ASSISTANT:")
    assert rewriter.note == ""


def test_chat_rewriter_writes_nothing_when_nothing_is_kept_and_checks_what_it_writes(shapes_llava, monkeypatch):
    monkeypatch.setattr(shapes_llava.tokenizer, "chat_template", CHAT, raising=False)
    answers = []

    def fake_generate(handle, prompt, max_new_tokens=64, add_special_tokens=True):
        return answers.pop(0)

    monkeypatch.setattr(C.generation, "generate_text", fake_generate)
    rewriter = C.make_agent("rewriter", "lm-chat", shapes_llava)
    caption = "A black cat sleeps on a red sofa."
    # every claim dropped: no model call (answers is empty), no caption, and a note that says so
    assert rewriter.rewrite(caption, [], ["There is a cat.", "The sofa is red."]) == ""
    assert rewriter.calls(caption, [], ["There is a cat."]) == [] and "no corrected caption" in rewriter.note
    kept, dropped = ["There is a black cat.", "The cat sleeps on a sofa"], ["The sofa is red."]
    long = "A black cat sleeps on a sofa and a dog plays with a ball in the sun ."
    for answer, problem in [("", "is empty"), (long, "longer than the caption"),
                            ("A black dog sleeps.", "words the caption does not")]:
        answers.append(answer)
        assert rewriter.rewrite(caption, kept, dropped) == "There is a black cat. The cat sleeps on a sofa."
        assert problem in rewriter.note
    answers.append("A black dog sleeps.")
    rewriter.checked = False
    assert rewriter.rewrite(caption, kept, dropped) == "A black dog sleeps." and rewriter.note == ""


def test_chat_agents_refuse_a_model_without_chat_template(shapes_llava):
    with pytest.raises(C.CaptionError, match="no chat template"):
        C.make_agent("decomposer", "lm-chat", shapes_llava).decompose("there is a red circle .")


def test_generic_verifier_uses_the_processor_chat_template(shapes_llava, monkeypatch):
    monkeypatch.setattr(shapes_llava.processor, "chat_template", VLM_CHAT, raising=False)
    verifier = C.make_verifier("vlm-yesno", shapes_llava)
    prompt = verifier.question("the red circle is large")
    assert prompt.startswith("USER: <image> Is the following statement") and prompt.endswith("ASSISTANT:")
    [(p_t, p_f)] = verifier.verify(W.render(W.generate_scene(1)), ["the red circle is large"])
    assert 0 <= p_t + p_f <= 1


def test_shapes_text_separates_glued_punctuation_so_the_grammar_parses_it():
    glued = "there is a large red circle at the top left. there is a small blue square at the center."
    assert C.shapes_text(glued) == ("there is a large red circle at the top left . "
                                    "there is a small blue square at the center .")
    assert len(C.make_agent("decomposer", "grammar", None).decompose(glued)) == 6

"""AppTest of the caption-correction page: the pipeline on a demo scene, and bad inputs."""
from __future__ import annotations

import struct
import zlib

import pytest
from conftest import app_with_model

from analysis.model_access import tiny_models
from analysis.model_access.models import ModelSpec, zoo_models
from analysis.world import shapes_world as W

PAGE = "views/caption_correction.py"


@pytest.fixture(scope="module")
def shapes_llava_spec(model_root):
    folder = tiny_models.save_tiny_llava(model_root / "tiny-llava-shapes-page", words=list(W.VOCAB))
    return ModelSpec("local", str(folder))


def _errors(at) -> list[str]:
    return [e.value for e in at.error]


def _pasted(spec, text, **query):
    return app_with_model(spec, PAGE, query={"src": "scene", "seed": "20000003", "cap": "paste", "text": text,
                                             "dec": "grammar", "rew": "grammar", **query})


def test_page_runs_pipeline_on_a_demo_scene_with_ground_truth(shapes_llava_spec):
    scene = W.generate_scene(20000003)
    absent = next((c, s) for c in W.COLOURS for s in W.SHAPES if scene.find(c, s) is None)
    text = W.caption(scene) + f" there is a small {absent[0]} {absent[1]} at the center ."
    at = _pasted(shapes_llava_spec, text, pi="10", ground="1")
    assert not at.exception and not _errors(at)
    table = at.dataframe[0].value
    assert list(table["claim"]) == W.decompose(text)
    assert list(table["ground truth"]).count("false") == 3
    assert len(at.get("plotly_chart")) >= 4  # metrics, scores, heatmap, sweep
    assert any("What am I looking at?" in c.value for c in at.caption)
    assert at.query_params["pi"] == "10.0" and at.query_params["dec"] == "grammar"


def test_page_with_the_demo_models_runs_from_its_defaults():
    if "shapes-vlm" not in zoo_models():
        pytest.skip("demo model shapes-vlm is not built")
    at = app_with_model(ModelSpec("zoo", "shapes-vlm"), PAGE, timeout=180)
    assert not at.exception and not _errors(at)
    assert len(at.dataframe[0].value) > 0 and at.metric


def test_a_language_model_opens_the_page_on_the_demo_vlm():
    """Opened on the default language model (a new visitor's first click from Home), the page shows the demo
    VLM's pipeline with one line saying why (before: a red "needs a vision-language model" above a button)."""
    if not {"shapes-lm", "shapes-vlm"} <= set(zoo_models()):
        pytest.skip("needs the demo zoo")
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, timeout=180)
    assert not at.exception and not _errors(at), _errors(at)
    assert any("needs a vision" in i.value.replace("\\", "") for i in at.info)
    assert at.session_state["model_spec"] == ModelSpec("zoo", "shapes-vlm")
    assert len(at.dataframe[0].value) > 0 and at.metric


def test_caption_without_claims_gives_a_clear_message(shapes_llava_spec):
    at = _pasted(shapes_llava_spec, "what a lovely day", ground="0")
    assert not at.exception
    assert any("found no claims" in e for e in _errors(at))


def test_non_image_upload_gives_a_clear_message(shapes_llava_spec):
    at = app_with_model(shapes_llava_spec, PAGE, query={"src": "upload"})
    at.file_uploader(key="cap_upload").set_value(("photo.png", b"this is plain text, not a picture", "image/png"))
    at.run()
    assert not at.exception
    assert any("not an image" in e for e in _errors(at))


def test_pixel_bomb_upload_is_refused_before_decoding(shapes_llava_spec):
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    bomb = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 9_000, 9_000, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))
    at = app_with_model(shapes_llava_spec, PAGE, query={"src": "upload"})
    at.file_uploader(key="cap_upload").set_value(("bomb.png", bomb, "image/png"))
    at.run()
    assert not at.exception
    assert any("not decoded" in e and "decompression bomb" in e for e in _errors(at))


def test_moving_pi_to_zero_drops_every_claim_without_reverifying(shapes_llava_spec, monkeypatch):
    scene = W.generate_scene(20000003)
    at = _pasted(shapes_llava_spec, W.caption(scene), pi="10", ground="0")
    assert not at.exception and "dropped" not in "".join(at.dataframe[0].value["verdict"])
    from analysis import captions as C

    def no_verify(*args, **kwargs):
        raise AssertionError("verification must come from the cache when only pi changes")

    monkeypatch.setattr(C, "verify_caption", no_verify)
    monkeypatch.setattr(C.pipeline, "verify_caption", no_verify)
    at.slider(key="cap_pi").set_value(0.0).run()
    assert not at.exception and not _errors(at)
    assert set(at.dataframe[0].value["verdict"]) == {"hallucinated (dropped)"}
    assert "there is nothing ." in at.markdown[-1].value or any("nothing" in m.value for m in at.markdown)
    assert at.query_params["pi"] == "0.0"


def test_rejected_lm_rewrite_is_replaced_and_the_page_says_so(shapes_llava_spec, monkeypatch):
    """The demo LM's rewrite is checked: one that restates dropped claims is replaced by the grammar
    rewrite, and the page shows why (generation is faked so the LM 'forgets' to drop anything)."""
    if "shapes-lm" not in zoo_models():
        pytest.skip("demo model shapes-lm is not built")
    from analysis import captions as C

    scene = W.generate_scene(20000003)
    text = W.caption(scene)
    monkeypatch.setattr(C.generation, "generate_text", lambda lm, prompt, n, add_special_tokens=False: text)
    at = _pasted(shapes_llava_spec, text, rew="shapes-lm", lm="zoo:shapes-lm", pi="0", ground="0")
    assert not at.exception and not _errors(at)
    notes = [i.value for i in at.info]
    assert any("rewrite stated" in n and "grammar rewrite is shown instead" in n for n in notes), notes
    table = at.dataframe[0].value
    kept = [c for c, v in zip(table["claim"], table["verdict"]) if v == "kept"]
    assert len(kept) < len(table)  # something was dropped, so the rewriter ran


def _scene_png(seed: int = 20000003) -> bytes:
    import io

    buf = io.BytesIO()
    W.render(W.generate_scene(seed)).save(buf, format="PNG")
    return buf.getvalue()


def _gate(at) -> str:
    """The label of the step the page asks about ("" when it asks nothing)."""
    notes = [i.value for i in at.info if "not started on its own" in i.value]
    return notes[0].split("**")[1] if notes else ""


def _press(at):
    next(b for b in at.button if b.label.startswith("Run it")).click().run()
    assert not at.exception and not _errors(at), (at.exception, _errors(at))
    return at


@pytest.fixture
def every_step_asks(monkeypatch):
    """Every estimated step counts as long (the page tests otherwise start everything at once), and the
    steps the page hands to the runner count their calls: nothing may run before its button is pressed.
    The tiny VLM's own caption and LM answers are noise, so the demo models' answers stand in for them."""
    import functools

    from analysis import captions as C
    from components import runs

    monkeypatch.setattr(runs, "ASK_ABOVE_S", 0.0)
    runs.run_store().clear()
    calls = {}
    for name in ("caption_upload", "correct_scene", "correct_upload"):
        real = getattr(C, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            if _name == "caption_upload":  # what the demo VLM says (the tiny one's caption is noise)
                return C.GeneratedCaption(text=W.caption(W.generate_scene(20000003)))
            return _real(*args, **kwargs)

        monkeypatch.setattr(C, name, functools.wraps(real)(counted))  # same name: the same estimator
    real_verify = C.pipeline.verify_caption

    def verified(*args, **kwargs):  # inside the one run: verification, done again only when it must be
        calls["verify"] = calls.get("verify", 0) + 1
        return real_verify(*args, **kwargs)

    monkeypatch.setattr(C.pipeline, "verify_caption", verified)

    def trained_answer(lm, prompt, max_new_tokens=64, add_special_tokens=True):
        """What the demo LM answers (the tiny VLM's own random LM says nothing useful)."""
        caption = prompt.split(" : ")[1].split(" drop")[0].removesuffix(" =")
        return " ; ".join(W.decompose(caption)) if " decompose " in prompt else caption

    monkeypatch.setattr(C.generation, "generate_text", trained_answer)
    # the tiny VLM's vocabulary is Shapes World's, so the demo LM agents accept its captions
    return calls


OWN_LM = "the VLM's own language model"


def test_scene_correction_waits_for_its_run_button(shapes_llava_spec, every_step_asks):
    """The page's one run (decompose, verify, rewrite: analysis/captions) shows its estimate and a Run
    button; nothing is computed before the press, and the result follows it."""
    at = _pasted(shapes_llava_spec, W.caption(W.generate_scene(20000003)), dec="shapes-lm", rew="shapes-lm",
                 lm=OWN_LM, pi="0", ground="0")
    assert not at.exception and not _errors(at)
    assert _gate(at) == "Correcting the caption" and not at.dataframe and not every_step_asks
    _press(at)
    assert not _gate(at) and len(at.dataframe[0].value) > 0
    assert every_step_asks == {"correct_scene": 1, "verify": 1}


def test_upload_steps_wait_for_their_run_buttons(shapes_llava_spec, every_step_asks):
    """An uploaded image's caption, then its correction (runs keyed by the image's bytes), ask the same way;
    moving π asks for the rewrite only (the verification is kept inside the analysis)."""
    at = app_with_model(shapes_llava_spec, PAGE, query={"src": "upload", "cap": "vlm", "dec": "shapes-lm",
                                                        "rew": "shapes-lm", "lm": OWN_LM, "pi": "0", "ground": "0"})
    at.file_uploader(key="cap_upload").set_value(("scene.png", _scene_png(), "image/png")).run()
    assert not at.exception and not _errors(at)
    assert _gate(at) == "Captioning" and not every_step_asks
    assert not [t for t in at.text_area if "generated" in t.label]
    _press(at)
    assert _gate(at) == "Correcting the caption" and every_step_asks == {"caption_upload": 1}
    assert [t for t in at.text_area if "generated" in t.label]
    _press(at)
    assert not _gate(at) and len(at.dataframe[0].value) > 0
    assert every_step_asks == {"caption_upload": 1, "correct_upload": 1, "verify": 1}
    done = dict(every_step_asks)
    at.slider(key="cap_pi").set_value(0.05).run()  # another rewrite; caption and verification are kept
    assert _gate(at) == "Correcting the caption" and every_step_asks == done
    _press(at)
    assert not _gate(at) and every_step_asks == {**done, "correct_upload": 2}  # no second verification
    at.slider(key="cap_pi").set_value(0.0).run()  # back: that result is stored, nothing is asked or run
    assert not _gate(at) and len(at.dataframe[0].value) > 0 and every_step_asks == {**done, "correct_upload": 2}

"""AppTest: the SAE-V page with an SAE saved by sae-lens (not trained here), a data folder with bad rows,
the exports, and steering side by side (issue 33)."""
from __future__ import annotations

import pytest

from analysis import sae_v
from analysis.model_access.models import ModelSpec
from conftest import app_with_model, table_with
from sae_lens_factory import save_outside_sae, write_pair_folder
from test_sae_page import _errors, _url

PAGE = "views/sae_features.py"


def _back_on_own_model(at, spec: ModelSpec):
    """A model with no SAE of its own opens this page on the demo VLM (components/presets.settle_model); the
    visitor who brings an SAE from elsewhere takes their model back with the sidebar's button, which keeps it
    on this page."""
    from components.model_picker import short_local

    own = short_local(spec)  # the app's name for it (local:tiny-llava)
    if at.session_state["model_spec"] != own:
        at = at.sidebar.button(key="picker_back").click().run()
    assert not at.exception, at.exception
    assert at.session_state["model_spec"] == own
    return at


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    old = sae_v.types.CACHE_ROOT
    sae_v.types.CACHE_ROOT = tmp_path_factory.mktemp("sae-page-cache")
    yield
    sae_v.types.CACHE_ROOT = old


@pytest.fixture(scope="module")
def outside(model_root):
    return str(save_outside_sae(model_root / "page-outside-sae", d_in=32, hook="blocks.1.hook_resid_post"))


@pytest.fixture(scope="module")
def pairs(model_root):
    return str(write_pair_folder(model_root / "page-pairs"))


def test_an_sae_saved_by_sae_lens_is_loaded_from_the_page(tiny_llava_dir, cache, outside, pairs):
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"data": pairs})
    assert not at.exception, at.exception
    at = _back_on_own_model(at, ModelSpec("local", str(tiny_llava_dir)))
    at.text_input(key="sae_outside_path").set_value(outside).run()
    at.button(key="sae_outside_go").click().run()
    assert not at.exception, at.exception
    assert _url(at, "sae") == outside
    assert at.selectbox(key="sae_pick").value == outside
    assert "from elsewhere" in at.selectbox(key="sae_pick").format_func(outside)
    table = table_with(at, "omega")
    assert set(table["feature"]) <= set(range(24)) and len(table) >= 1
    # the summary says where the SAE is from (as a visitor reads it: captions are Markdown-escaped)
    assert any("sae-lens folder" in c.value.replace("\\", "") for c in at.caption)


def test_an_sae_that_does_not_fit_the_model_is_one_message(tiny_llava_dir, cache, model_root):
    wrong = save_outside_sae(model_root / "page-wrong-width", d_in=48, hook="blocks.1.hook_resid_post")
    at = _back_on_own_model(app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE),
                            ModelSpec("local", str(tiny_llava_dir)))
    at.text_input(key="sae_outside_path").set_value(str(wrong)).run()
    at.button(key="sae_outside_go").click().run()
    assert not at.exception, at.exception
    assert _errors(at) == ["This SAE reads 48-wide vectors (cfg.json d_in), but layer 1 of "
                           f"local:{tiny_llava_dir.name} is 32-wide: it was made for another model."]
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"sae": str(wrong)})  # a link
    assert not at.exception, at.exception
    assert len(_errors(at)) == 1 and "48-wide" in _errors(at)[0]


def test_a_data_folder_with_bad_rows_is_ranked_with_each_row_reported(tiny_llava_dir, cache, outside, pairs):
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE,
                        query={"sae": outside, "data": pairs, "view": "ranking", "thr": "0"})
    assert not at.exception, at.exception
    assert not _errors(at)
    assert any("3 of 10 rows were left out" in w.value for w in at.warning)
    left_out = table_with(at, "why")
    assert dict(zip(left_out["row"], left_out["why"])) == {
        4: "image 'gone.png' is missing", 6: "empty caption",
        8: "'img7.png' is not an image that can be read (PNG, JPEG, GIF, BMP or WebP expected)."}
    assert len(table_with(at, "score s_i")) == 7
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Rows used / read"] == "7 / 10"
    assert "ROC AUC (s_i)" in metrics and "Precision: corrupted among removed" in metrics  # a label column


def test_the_ranking_exports_the_list_and_the_kept_rows_in_the_data_format(tiny_llava_dir, cache, outside, pairs):
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE,
                        query={"sae": outside, "data": pairs, "view": "ranking", "keep": "0.5"})
    assert not at.exception, at.exception
    buttons = {b.proto.label: b.proto for b in at.get("download_button")}
    assert {"Ranked list (CSV)", "Ranked list (JSONL)", "Kept 50% in your format (captions.kept.jsonl)"} <= set(buttons)
    # the exported files themselves are checked in tests/model/test_sae_data.py (write_exports, kept_subset)


def test_your_data_chosen_in_the_page_goes_into_the_link(tiny_llava_dir, cache, outside, pairs):
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"sae": outside})
    at.text_input(key="sae_data_path").set_value(pairs).run()
    at.button(key="sae_data_go").click().run()
    assert not at.exception, at.exception
    assert _url(at, "data") == pairs and at.selectbox(key="sae_data").value == pairs
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"sae": outside, "data": "/etc"})
    assert not at.exception, at.exception
    assert any("'/etc' is not data this server can read" in e for e in _errors(at)), _errors(at)


def test_steering_shows_both_outputs_side_by_side_with_changes_marked(tiny_llava_dir, cache, outside, pairs):
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE,
                        query={"sae": outside, "data": pairs, "view": "feature", "feature": "3", "steer": "3=400"})
    assert not at.exception, at.exception
    assert at.text_input(key="sae_steer_feature").value == "3=400"
    run = [b for b in at.button if b.label.startswith("Run: Generating with and without steering")]
    assert run, [b.label for b in at.button]
    at = run[0].click().run()
    assert not at.exception, at.exception
    html = [m.value for m in at.markdown if "font-family:monospace;white-space:pre-wrap" in m.value]
    assert len(html) == 2  # unsteered | steered
    assert any(m.value == "**Unsteered**" for m in at.markdown)
    assert any(m.value.startswith("**Steered** (feature 3 at 400, added)") for m in at.markdown)
    assert "<mark" in html[1]  # strength 400 changes the output: the changed tokens are marked
    assert any("steered tokens differ from the unsteered output" in c.value for c in at.caption)


def test_a_checkpoint_whose_fold_rescales_its_codes_says_so(tiny_llava_dir, cache, model_root, pairs):
    """A TopK checkpoint with decoder-norm rescaling and a saved scale s = 0.37: sae-lens's fold makes its codes
    1/s = 2.703× the checkpoint's own; the page states the factor (issue 51)."""
    from sae_lens_factory import save_sae_lens

    folder = str(save_sae_lens(model_root / "page-topk-rescaled", "topk-rescaled", "expected_average_only_in", d_in=32))
    at = app_with_model(ModelSpec("local", str(tiny_llava_dir)), PAGE, query={"data": pairs, "sae": folder})
    assert not at.exception, at.exception
    notes = [i.value for i in at.info if "training-time codes" in i.value]
    assert len(notes) == 1 and "2.703× the checkpoint's own training-time codes" in notes[0], [i.value for i in at.info]

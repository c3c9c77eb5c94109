"""The Residual stream page on the demo LM and a tiny model: every view renders from one run, shows the
numbers its analysis computed, and bad input gets one line, never a traceback."""
from __future__ import annotations

import pytest

from analysis.model_access.models import ModelSpec, zoo_models
from conftest import app_with_model, metric_starting, table_with

PAGE = "views/residual_stream.py"
HAS_ZOO = {"shapes-lm", "shapes-vlm"} <= set(zoo_models())
needs_zoo = pytest.mark.skipif(not HAS_ZOO, reason="needs the demo zoo")


def _ok(at) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@needs_zoo
def test_lens_view_ends_at_the_models_logits_and_explains_itself():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE)
    _ok(at)
    assert metric_starting(at, "Last layer vs the model's logits").value == "0.0e+00"
    rows = table_with(at, "KL to final (nats)").to_dict("records")
    assert len(rows) == 5 and rows[-1]["KL to final (nats)"] == 0.0 and rows[-1]["target rank (1 = top)"] == 1
    on_top = metric_starting(at, "Target on top from state")  # needle-0's answer, from state 1 on
    assert on_top.value == f"{next(r['state'] for r in rows if all(x['target rank (1 = top)'] == 1 for x in rows[r['state']:]))} on"
    assert len(at.get("plotly_chart")) == 3  # lens grid, per-layer curves, logit attribution
    assert any("final norm and unembedding" in e.value for e in list(at.caption) + list(at.markdown))
    assert at.query_params["view"] == ["lens"] or at.query_params["view"] == "lens"


@needs_zoo
def test_patching_view_shows_exact_and_attribution_side_by_side():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, query={"view": "patching", "pair": "max-0",
                                                                    "components": "attention,residual"})
    _ok(at)
    rows = table_with(at, "share at the last token").to_dict("records")
    assert rows[0]["position"] == 7 and rows[0]["share there"] == pytest.approx(1.0, abs=1e-3)  # the largest number
    assert len(at.get("plotly_chart")) == 3  # residual, attention output, the agreement scatter
    assert "r = " in str(at.get("plotly_chart")[0].proto.spec)


@needs_zoo
def test_side_by_side_of_two_prompts_and_a_refused_pair_of_models():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, query={"view": "side", "pair": "colour-0"})
    _ok(at)
    assert [m.label for m in at.metric][:2] == ["clean prompt", "corrupted prompt"]
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE,
                        query={"view": "side", "side": "model", "other_model": "zoo:shapes-vlm"})
    assert not at.exception
    assert len(at.error) == 1 and "link's other model" in at.error[0].value and "different vocabularies" in \
        at.error[0].value


@needs_zoo
def test_all_pairs_view_lists_every_offered_pair():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, query={"view": "pairs"})
    _ok(at)
    rows = table_with(at, "subject's last token").to_dict("records")
    assert len(rows) == 9 and all(r["clean diff"] > 0 > r["corrupted diff"] for r in rows)
    # each pair's own r (exact vs attribution over its cells) beside the pooled r; the median of them in the title
    from analysis.model_access.models import load_model
    from analysis.residual import ResidualParams, pair_sweep
    import numpy as np

    sweep = pair_sweep(load_model(ModelSpec("zoo", "shapes-lm")), ResidualParams())
    own = [float(np.corrcoef(np.ravel(r.exact), np.ravel(r.attribution))[0, 1]) for r in sweep.runs]
    assert [r["r (exact vs attribution, this pair)"] for r in rows] == pytest.approx(own, abs=1e-3)
    assert sweep.median_correlation == pytest.approx(float(np.median(own)), abs=1e-9)
    assert f"median of each pair's own r = {np.median(own):.2f}" in str(at.get("plotly_chart")[0].proto.spec)


def test_bad_own_pairs_and_missing_lenses_are_one_line(tiny_llama_dir):
    spec = ModelSpec("local", str(tiny_llama_dir))
    at = app_with_model(spec, PAGE, query={"view": "patching", "pair": "own", "prompt": "w1 w2 w3", "corrupt": "w1 w2"})
    assert not at.exception and len(at.error) == 1 and "same number" in at.error[0].value
    at = app_with_model(spec, PAGE, query={"lens": "tuned"})  # a link's lens this model has none of: said, logit shown
    _ok(at)
    assert any("link asks for the tuned lens" in w.value for w in at.warning)
    assert metric_starting(at, "Last layer vs the model's logits").value == "0.0e+00"
    at = app_with_model(spec, PAGE)  # a tiny random model: its generic pairs still run through the logit lens
    assert not at.exception and metric_starting(at, "Last layer vs the model's logits").value == "0.0e+00"


@needs_zoo
def test_choosing_your_own_pair_shows_no_error_before_the_prompts_are_typed():
    """Before: a red "needs both prompts", then "This link's settings are out of range" (no link was used)."""
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE)
    _ok(at)
    at.selectbox(key="rs_pair").set_value("own").run()
    _ok(at)
    assert not at.warning, [w.value for w in at.warning]
    assert any("Type a clean prompt" in i.value for i in at.info)
    at.text_area(key="rs_prompt").input("<s> max : 59 63 15 43 75 72 =").run()
    _ok(at)  # one of two typed: still no error
    at.text_area(key="rs_corrupt").input("<s> max : 59 63 15 43 71 72 =").run()
    _ok(at)
    assert metric_starting(at, "The model predicts").value == "'75'"


@needs_zoo
def test_side_by_side_offers_only_models_that_share_the_vocabulary(tiny_llama_dir):
    """shapes-lm's vocabulary is its own (shapes-vlm's and SmolLM2's differ): no other model is offered, and the
    page says why; on shapes-vlm, shapes-vlm-weak (same tokenizer) is."""
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, query={"view": "side", "side": "model"})
    _ok(at)
    assert at.selectbox(key="rs_other_model").options == [""]
    assert any("shares zoo:shapes-lm" in i.value.replace("\\", "") for i in at.info)
    at = app_with_model(ModelSpec("zoo", "shapes-vlm"), PAGE)
    assert at.selectbox(key="rs_other_model").options == ["zoo:shapes-vlm-weak"]


def test_the_tuned_lens_is_offered_only_where_one_exists(tiny_llama_dir):
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE)
    _ok(at)
    assert at.get("button_group")[0].proto.options and \
        [o.content for o in at.get("button_group")[0].proto.options] == ["Logit lens"]
    assert any("no tuned lens exists" in c.value for c in at.caption)


@needs_zoo
def test_generate_view_shows_the_commitment_strip_of_each_generated_token():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, query={"view": "generate", "pair": "colour-0",
                                                                    "new_tokens": "8", "lens": "tuned"})
    _ok(at)
    rows = table_with(at, "logit: first top-1 (state)").to_dict("records")
    assert [r["token"] for r in rows] == ["blue", "circle", ";", "the", "blue", "circle", "is", "small"]
    # the colour word is on top only after the last layer (state 4), the next word from state 1
    assert [r["logit: first top-1 (state)"] for r in rows] == ["3", "1", "1", "1", "3", "1", "3", "2"]
    assert [r["tuned: first top-1 (state)"] for r in rows][:4] == ["3", "0", "1", "0"]
    assert metric_starting(at, "States read over the whole vocabulary").value.endswith("of 32")
    assert len(at.get("plotly_chart")) == 1
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, query={"view": "generate", "new_tokens": "999"})
    assert not at.exception and len(at.error) == 1 and "at most 64" in at.error[0].value


def _texts(at) -> list[list[str]]:
    """The token chips of the generated text and the branch, as the page draws them (unescaped)."""
    import html
    import re

    body = next(h.proto.body for h in at.get("html") if 'class="rs-tok"' in h.proto.body)
    blocks = body.split("font-weight:600")[1:]
    return [[html.unescape(t) for t in re.findall(r'class="rs-tok"[^>]*>([^<]*)</span>', b)] for b in blocks]


@needs_zoo
def test_the_generated_text_shows_every_token_and_a_chosen_branch_regenerates_from_it():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, query={"view": "generate", "pair": "colour-0",
                                                                    "new_tokens": "8"})
    _ok(at)
    text = "blue circle ; the blue circle is small".split()
    assert _texts(at) == [text]  # all 8 generated tokens under "Generated text (8 tokens)"
    assert any("Generated text (8 tokens)" in h.proto.body for h in at.get("html"))
    at.selectbox(key="rs_branch_at").select(0).run()
    _ok(at)
    options = at.radio(key="rs_branch_token_0").options
    assert options[0] == "'blue' · 1 (generated)" and options[1] == "'green' · 3.37e-06"
    green = at.session_state["rs_branch_token_0"]  # the generated token is chosen until another is taken
    at.radio(key="rs_branch_token_0").set_value(31).run()  # 'green', the runner-up
    _ok(at)
    branched = "green circle ; the green circle is small".split()
    assert green != 31 and _texts(at) == [text, branched]
    rows = table_with(at, "P (branch)").to_dict("records")
    assert [r["branch"] for r in rows] == branched and [r["same"] for r in rows] == [False] + [True] * 3 + [False] + [True] * 3
    p = metric_starting(at, "P(branch) from token 0")
    assert p.value == "2.16e-06" and "first difference at token 0" in p.delta
    assert at.query_params["branch_at"] in ("0", ["0"]) and at.query_params["branch_token"] in ("31", ["31"])
    # the link alone reproduces the branch
    again = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, query={
        "view": "generate", "pair": "colour-0", "new_tokens": "8", "branch_at": "0", "branch_token": "31"})
    _ok(again)
    assert _texts(again) == [text, branched]
    assert table_with(again, "P (branch)").to_dict("records") == rows


@needs_zoo
@pytest.mark.parametrize("at_, token", [("8", "31"), ("0", "99999"), ("x", "31"), ("0", "")])
def test_a_bad_branch_in_the_link_is_the_link_settings_message(at_, token):
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, query={
        "view": "generate", "pair": "colour-0", "new_tokens": "8", "branch_at": at_, "branch_token": token})
    assert not at.exception
    assert len(at.error) == 1 and at.error[0].value.startswith("This link's settings are out of range")
    assert len(_texts(at)) == 1  # the generated text, no branch


@needs_zoo
def test_a_saved_analysis_keeps_the_branch(tmp_path, monkeypatch):
    from analysis.hosting.store import AnalysisStore
    from analysis.residual import Generation

    monkeypatch.setenv("MODEL_INSPECTOR_STORE", str(tmp_path / "store.db"))
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, query={
        "view": "generate", "pair": "colour-0", "new_tokens": "8", "branch_at": "4", "branch_token": "31"})
    at.session_state["share_residual_open"] = True
    at.run()
    _ok(at)
    next(b for b in at.button if b.label == "Save").click().run()
    _ok(at)
    saved = AnalysisStore(tmp_path / "store.db").list()
    assert len(saved) == 1 and (saved[0].params["branch_at"], saved[0].params["branch_token"]) == (4, 31)
    result = Generation.from_dict(saved[0].result)
    assert result.branch.at == 4 and result.branch.token_id == 31 and result.branch.tokens[0] == "green"
    assert result.branch.main_ids == result.token_ids[4:] and result.alternative_ids[4][0] == result.token_ids[4]
    assert [r["branch"] for r in saved[0].tables["branch"]] == result.branch.tokens
    assert "branch_at=4" in saved[0].url and "branch_token=31" in saved[0].url


@needs_zoo
def test_patching_view_lists_what_attribution_and_atp_star_miss():
    from analysis import residual
    from analysis.model_access.models import load_model

    query = {"view": "patching", "pair": "max-0", "components": "heads,queries", "methods": "exact,attribution,atp*"}
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE, query=query)
    _ok(at)
    rows = table_with(at, "exact top 5 %").to_dict("records")
    params = residual.ResidualParams(pair="max-0", components=["heads", "queries"],
                                     methods=["exact", "attribution", "atp*"])
    expected = residual.patch(load_model(ModelSpec("zoo", "shapes-lm")), params).false_negatives
    assert [(r["component"], r["estimate"], r["missed"], r["which (exact share)"]) for r in rows] == [
        (residual.COMPONENTS.label(f.component), residual.METHODS.label(f.method), f.count,
         ", ".join(f"{m} ({e:+.3f})" for m, e in zip(f.missed, f.effects)) or "none") for f in expected]
    assert len(rows) == 4
    assert any("every offered pair" in b.label for b in at.button)  # the sweep runs when asked


def test_a_model_without_a_tuned_lens_is_offered_one_to_train(tiny_llama_dir, tmp_path, monkeypatch):
    """The offer: an estimate on its button (the cost gate), the training on a tiny model, its held-out report,
    the lens stored under the weights hash, and the Tuned lens choice offered on the next run."""
    from analysis.residual import translators

    monkeypatch.setattr(translators, "USER_LENS_ROOT", tmp_path / "lenses")
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE)
    _ok(at)
    assert any("Train a tuned lens" in i.value for i in at.info)
    assert not [b for b in at.button if "Training a tuned lens" in b.label]  # no Run button until asked for
    at.toggle(key="rs_train_lens_on").set_value(True).run()
    _ok(at)
    offer = [b for b in at.button if "Training a tuned lens" in b.label]
    assert len(offer) == 1 and "(about " in offer[0].label, [b.label for b in at.button]
    offer[0].click().run()
    _ok(at)
    assert any(s.value.startswith("Trained in") for s in at.success), [s.value for s in at.success]
    rows = table_with(at, "tuned lens").to_dict("records")
    assert len(rows) == 3 and rows[-1]["tuned lens"] == 0.0 and rows[-1]["logit lens: mean KL (nats)"] == 0.0
    stored = list((tmp_path / "lenses").iterdir())
    assert len(stored) == 1 and (stored[0] / translators.META).is_file()
    at.run()
    _ok(at)
    assert [o.content for o in at.get("button_group")[0].proto.options] == ["Logit lens", "Tuned lens"]
    assert not any("Train a tuned lens" in i.value for i in at.info)


@needs_zoo
def test_lens_view_warns_where_the_logit_lens_is_far_and_shows_both_lenses():
    """shapes-lm's stored held-out report: the logit lens is 5.40 nats from the output at state 0 (above 5), under
    1.92 after; both lenses' grids side by side on request."""
    import json

    from analysis.residual.translators import META, folder_for

    at = app_with_model(ModelSpec("zoo", "shapes-lm"), PAGE)
    _ok(at)
    logit = next(iter(json.loads((folder_for("shapes-lm") / META).read_text())["held_out_kl_nats"].values()))["logit"]
    far = [w.value for w in at.warning if "far from the model's output" in w.value]
    assert len(far) == 1 and f"at state 0: mean KL {logit[0]:.1f} nats on held-out text" in far[0], far
    charts = len(at.get("plotly_chart"))
    at.toggle(key="rs_lens_pair").set_value(True).run()
    _ok(at)
    assert len(at.get("plotly_chart")) == charts + 2
    assert [m.value for m in at.markdown if m.value in ("**Logit lens**", "**Tuned lens**")] == ["**Logit lens**",
                                                                                                 "**Tuned lens**"]

"""Presets for live talks: 2-4 per panel, each a permalink that sets every control, and each shows the
finding its sentence promises on the demo zoo (numbers read from the page itself)."""
from __future__ import annotations

import re

import pytest

from analysis.framework import panels
from analysis.framework import presets as P
from analysis.model_access.models import ModelSpec, zoo_models
from analysis.framework.settings import labelled, url_name
from components.registry import PANELS
from components.view import url_fields
from conftest import app_with_model, metric_starting, table_with, zoo_model_ready

PAGE_OF = {p.url_path: f"views/{p.page}" for p in PANELS}
ANALYSIS_PANELS = [p for p in PANELS if p.paper]
HAS_ZOO = {"shapes-lm", "shapes-vlm", "shapes-vlm-weak"} <= set(zoo_models())


ANALYSIS_OF = {a.url_path: a for a in panels.analyses()}


def _url_names(panel: str) -> set[str]:
    """The URL names the panel's page reads: its fields' (Params and view state)."""
    return set(url_fields(ANALYSIS_OF[panel]))


def test_every_analysis_panel_offers_two_to_four_presets():
    for panel in ANALYSIS_PANELS:
        presets = P.for_panel(panel.url_path)
        assert 2 <= len(presets) <= 4, (panel.title, len(presets))
        assert len({p.name for p in presets}) == len(presets)
    assert {p.panel for p in P.PRESETS} <= set(PAGE_OF)


def test_preset_values_are_controls_their_page_reads_from_the_url():
    for preset in P.PRESETS:
        names = _url_names(preset.panel)
        unknown = set(preset.values()) - names
        assert not unknown, f"{preset.panel}/{preset.name}: the page does not read {sorted(unknown)}"
        assert preset.model.startswith("zoo:")


def test_a_preset_link_sets_every_setting_of_its_panel():
    """Presets are Params values: the link holds every setting the page reads, so a setting added to the
    Params later is pinned by every preset (at its default) with no edit to the preset. (A method's
    setting whose default differs between the methods of its family, e.g. each decomposer's token count,
    is left to the method that runs unless the preset sets it.)"""
    for preset in P.PRESETS:
        analysis = ANALYSIS_OF[preset.panel]
        own = {url_name(f) for f in labelled(analysis.params) if url_name(f)}
        assert own <= set(preset.values()) <= set(url_fields(analysis)), preset.name


def _percent(text: str) -> float:
    return float(text.strip().rstrip("%")) / 100


# --- what each preset must show (read from the rendered page) -------------------------------------------

def _accuracy_rows(at) -> list[dict]:
    """The sharpness page's accuracy table: its section is shown on demand, one section at a time."""
    at.segmented_control(key="sh_chapter").set_value("Accuracy vs n").run(timeout=600)
    assert not at.exception, at.exception
    return table_with(at, "n").to_dict("records")


def _dispersion(at):
    rows = _accuracy_rows(at)
    small, large = rows[0], rows[-1]
    assert small["n"] == 4 and large["n"] == 128
    assert large["softmax accuracy"] <= small["softmax accuracy"] - 0.3  # accuracy falls with n
    weight = [c for c in large if c.startswith("softmax max-item weight L0H3")]
    assert weight and large[weight[0]] < small[weight[0]] - 0.3  # the retrieval head disperses


def _adaptive(at):
    rows = _accuracy_rows(at)
    small, large = rows[0], rows[-1]
    assert large["n"] == 128
    assert large["adaptive accuracy"] <= small["adaptive accuracy"] - 0.3  # adaptive θ does not stop it
    assert abs(large["adaptive accuracy"] - large["softmax accuracy"]) <= 0.15
    weight = [c for c in large if c.startswith("adaptive max-item weight L")][0]
    assert large[weight] < small[weight] - 0.3


def _real_dispersion(at):
    rows = _accuracy_rows(at)
    by_n = {r["n"]: r for r in rows}
    assert [r["n"] for r in rows] == [2, 4, 8, 16]
    assert by_n[4]["softmax accuracy"] >= 2 * by_n[4]["chance"]  # a task the model can do
    weight = [c for c in rows[0] if c.startswith("softmax answer-item weight L")][0]
    assert weight == "softmax answer-item weight L24H4", weight  # the retrieval head found
    assert by_n[2][weight] >= 0.8 and by_n[16][weight] <= 0.1  # it disperses as n grows
    assert by_n[16]["adaptive accuracy"] < by_n[16]["softmax accuracy"]  # adaptive θ everywhere costs accuracy


def _lemma(at):
    assert any(s.value == 2.0 for s in at.slider if s.label.startswith("Logit spread"))


def _kv_accuracy(at) -> dict[str, float]:
    frame = table_with(at, "policy")
    acc_col = next(c for c in frame.columns if "accuracy" in c.lower())
    return {str(r["policy"]): r[acc_col] for r in frame.to_dict("records")}


def _needle_streaming(at):
    acc = _kv_accuracy(at)
    full = next(v for k, v in acc.items() if k.lower().startswith("full"))
    streaming = next(v for k, v in acc.items() if "streaming" in k.lower())
    h2o = next(v for k, v in acc.items() if "h2o" in k.lower())
    assert _num(streaming) < _num(full) and _num(h2o) == _num(full), acc
    morph = next(v for k, v in acc.items() if k == "MorphKV")
    assert _num(morph) == _num(full), acc


def _long_rows(at) -> dict[str, dict]:
    return {str(r["policy"]): r for r in table_with(at, "item recall").to_dict("records")}


def _morph_long_wins(at):  # "keeps 8 of the 12 claims where H2O and SnapKV keep 3 and StreamingLLM 4", flat memory
    rows = _long_rows(at)
    claims = {k: round(12 * r["item recall"]) for k, r in rows.items()}
    assert (claims["MorphKV"], claims["H2O"], claims["SnapKV"], claims["StreamingLLM"]) == (8, 3, 3, 4), claims
    assert rows["MorphKV"]["cache KiB (last step)"] == 96 and rows["Full cache"]["cache KiB (last step)"] == 262


def _morph_long_loses(at):  # "MorphKV keeps 3 ... fewer than StreamingLLM (6), H2O and SnapKV (5)"
    claims = {k: round(12 * r["item recall"]) for k, r in _long_rows(at).items()}
    assert (claims["MorphKV"], claims["StreamingLLM"], claims["H2O"], claims["SnapKV"]) == (3, 6, 5, 5), claims


def _num(value) -> float:
    return _percent(value) if isinstance(value, str) else float(value)


def _shuffle_fails(at):
    assert _percent(metric_starting(at, "Tokens recovered").value) == 1.0


def _noise_defeats(at):
    assert _percent(metric_starting(at, "Tokens recovered").value) <= 0.2


def _real_vocabulary(at):
    assert _percent(metric_starting(at, "Tokens recovered").value) == 1.0
    assert float(metric_starting(at, "Fewer than exhaustive").value.rstrip("×").replace(",", "")) >= 100


def _cascade_blocks(at):
    assert any("Breakable" in w.value for w in at.warning) or any("Breakable" in s.value for s in at.success)


def _caption_facts(at) -> tuple[float, float, float, float]:
    fact, cover = metric_starting(at, "Factuality"), metric_starting(at, "Coverage")
    after_f, after_c = float(fact.value), float(cover.value)
    return after_f - float(fact.delta), after_f, after_c - float(cover.delta), after_c


def _position_dropped(at):
    claims = table_with(at, "claim")
    dropped = claims[claims["claim"] == "the yellow triangle is at the top middle"]
    assert len(dropped) == 1
    before, after, _, _ = _caption_facts(at)
    assert after > before


def _invented_objects(at):
    before, after, _, _ = _caption_facts(at)
    assert before == 0.0 and after == 1.0


def _strict(at):
    before_f, after_f, before_c, after_c = _caption_facts(at)
    assert after_f >= before_f and after_c < before_c


def _cross_modal_list(at):
    frame = table_with(at, "omega")
    cross = int(metric_starting(at, "Cross-modal").value)
    assert 10 <= cross <= 0.15 * len(frame), cross  # "a few dozen features fire on both"
    omega = frame.sort_values("omega", ascending=False)["omega"].head(cross)
    assert omega.median() > 0.9, omega.tolist()  # "most with omega near 1"
    assert (frame["modality"] == "text-only").sum() > len(frame) / 2  # "most are text-only" (of the live ones)


def _cross_modal_feature(at):
    top = metric_starting(at, "Top-30 tokens").value
    text, image = (int(x) for x in top.split("/"))
    assert text >= 5 and image >= 5, top  # fires on caption words and on image patches


def _ranking_other_scene(at):
    kinds = {r["kind"]: r for r in table_with(at, "mean rank").to_dict("records")}
    clean, other, swapped = (kinds[k]["mean rank"] for k in ("clean", "other_scene", "swapped"))
    assert other > clean + 50, kinds  # another scene's caption sinks (300 pairs: ranks 1-300)
    assert abs(swapped - clean) < 30, kinds  # a swap ranks like a clean pair


def _steer_middle_right(at):
    run = [b for b in at.button if b.label.startswith("Run: Generating with and without steering")]
    if run:  # not precomputed: steering runs when asked
        at = run[0].click().run()
    outputs = [m.value for m in at.markdown if "white-space:pre-wrap" in m.value]
    assert len(outputs) == 2, outputs  # unsteered | steered, side by side
    plain, steered = (re.sub(r"<[^>]+>", "", html) for html in outputs)
    assert "at the bottom left" in plain and "middle right" not in plain
    assert "at the middle right" in steered and "<mark" in outputs[1]  # the place changed, and is marked


def _needle_found(at):  # token 15 in the embeddings, the last token from layer 1, L0H3 restores 0.73
    rows = table_with(at, "share at the last token").to_dict("records")
    assert rows[0]["position"] == 15 and rows[0]["token"] == "84" and rows[0]["share there"] >= 0.99
    assert all(r["position"] == 19 and r["share at the last token"] >= 0.99 for r in rows[1:])
    heads = table_with(at, "head").to_dict("records")
    assert (heads[0]["layer"], heads[0]["head"]) == (0, "H3") and round(heads[0]["share (exact)"], 2) == 0.73


def _tuned_colour(at):  # layer 2: logit 'circle', yellow 80th, 7.6 nats; tuned 'red', yellow 2nd, 1.3 nats; layer 3
    from analysis.model_access.models import ModelSpec, load_model
    from analysis.residual import ResidualParams, inspect

    rows = table_with(at, "target rank (1 = top)").to_dict("records")
    assert (rows[2]["top token"], rows[2]["target rank (1 = top)"], round(rows[2]["KL to final (nats)"], 1)) == ("red", 2, 1.3)
    assert rows[3]["top token"] == "yellow" and round(rows[3]["P(yellow)"], 2) == 0.91
    logit = inspect(load_model(ModelSpec.parse("zoo:shapes-lm")), ResidualParams(pair="colour-1")).lens
    assert logit.top_tokens[2][-1][0] == "circle" and logit.target_rank[2][-1] == 79  # 80th: 79 tokens above it
    assert round(logit.kl[2][-1], 1) == 7.6 and logit.top_tokens[3][-1][0] == "blue"


def _real_capital(at):  # ' France' through layer 23, the last token from 24, L23H4 restores 0.93; r = 0.99
    rows = table_with(at, "share at the last token").to_dict("records")
    assert all(r["token"] == " France" and r["share there"] >= 0.99 for r in rows[:24])
    assert all(r["share at the last token"] >= 0.98 for r in rows[24:])
    heads = table_with(at, "head").to_dict("records")
    assert (heads[0]["layer"], heads[0]["head"]) == (23, "H4") and abs(heads[0]["share (exact)"] - 0.93) < 0.006
    assert any("Residual stream: share" in str(c.proto.spec) and "r = 0.99" in str(c.proto.spec) for c in at.get("plotly_chart"))


def _real_tuned(at):  # tuned: Paris 5th at 25, 3rd at 27, 2nd at 29, ' capital' from 25, 11,664th at 10; logit: 92nd, 34th
    from analysis.model_access.models import ModelSpec, load_model
    from analysis.residual import ResidualParams, inspect

    rows = table_with(at, "target rank (1 = top)").to_dict("records")
    on_top = metric_starting(at, "Target on top from state")  # only at the output
    assert on_top.value == "30 on" and "first on top at state 30" in on_top.proto.delta
    assert [rows[s]["target rank (1 = top)"] for s in (25, 27, 29)] == [5, 3, 2]
    assert all(rows[s]["top token"] == " capital" for s in range(25, 30)) and rows[10]["target rank (1 = top)"] == 11664
    banner = next(i.value for i in at.info if P.get("residual-stream", "real-tuned").title in i.value)
    assert "5th at state 25" in banner and not re.search(r"\blayers? \d", banner)  # the cards' word: "state", not "layer"
    logit = inspect(load_model(ModelSpec.parse("zoo:smollm2-135m-instruct")), ResidualParams(pair="capital-france")).lens
    assert next(i for i, r in enumerate(logit.target_rank) if r[-1] == 0) == 30
    assert [logit.target_rank[s][-1] + 1 for s in (10, 25, 27)] == [3384, 92, 34]


CHECKS = {
    ("attention-sharpness", "dispersion"): _dispersion,
    ("attention-sharpness", "adaptive-temperature"): _adaptive,
    ("attention-sharpness", "lemma"): _lemma,
    ("kv-cache", "needle-streaming"): _needle_streaming,
    ("kv-cache", "morphkv"): _morph_long_wins,
    ("kv-cache", "morphkv-loses"): _morph_long_loses,
    **({("kv-cache", "real-recall"): _needle_streaming} if P.real_model_in_zoo() else {}),
    **({("attention-sharpness", "real-retrieval-head"): _real_dispersion} if P.real_model_in_zoo() else {}),
    ("prompt-reconstruction", "shuffle-fails"): _shuffle_fails,
    ("prompt-reconstruction", "noise-defeats"): _noise_defeats,
    **({("prompt-reconstruction", "real-vocabulary"): _real_vocabulary} if P.real_model_in_zoo() else {}),
    ("prompt-reconstruction", "cascade-contiguous"): _cascade_blocks,
    ("caption-correction", "position-dropped"): _position_dropped,
    ("caption-correction", "invented-objects"): _invented_objects,
    ("caption-correction", "strict-threshold"): _strict,
    ("residual-stream", "needle-found"): _needle_found,
    ("residual-stream", "tuned-colour"): _tuned_colour,
    **({("residual-stream", "real-capital"): _real_capital, ("residual-stream", "real-tuned"): _real_tuned}
       if P.real_model_in_zoo() else {}),
    ("sae-features", "cross-modal-list"): _cross_modal_list,
    ("sae-features", "cross-modal-feature"): _cross_modal_feature,
    ("sae-features", "ranking-other-scene"): _ranking_other_scene,
    ("sae-features", "steer-middle-right"): _steer_middle_right,
}


def test_every_preset_has_a_check():
    assert set(CHECKS) == {(p.panel, p.name) for p in P.PRESETS}


@pytest.mark.skipif(not HAS_ZOO, reason="needs the demo zoo")
@pytest.mark.parametrize("preset", P.PRESETS, ids=lambda p: f"{p.panel}/{p.name}")
def test_preset_link_opens_its_view_and_shows_its_finding(preset):
    """A new session opening only `?model=...&preset=name`: the page fills in every control, keeps the
    preset's values in the URL (so the link it shows is the permalink), and shows the finding."""
    if not zoo_model_ready(preset.model):
        pytest.skip(f"{preset.model} is not converted on this machine (python -m analysis.zoo build --only ...)")
    at = app_with_model(None, PAGE_OF[preset.panel], query={"model": preset.model, "preset": preset.name},
                        timeout=600)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    written = {k: at.query_params[k] for k in at.query_params}
    written = {k: v[0] if isinstance(v, list) and len(v) == 1 else v for k, v in written.items()}
    for key, value in preset.query().items():
        assert written.get(key) == value, f"{key}: preset {value!r}, page wrote {written.get(key)!r}"
    assert any(preset.title in i.value for i in at.info)
    CHECKS[(preset.panel, preset.name)](at)


@pytest.mark.skipif(not HAS_ZOO, reason="needs the demo zoo")
def test_clicking_a_preset_button_resets_the_controls_and_switches_the_model():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"), "views/prompt_reconstruction.py",
                        query={"perm": "shuffle_dims", "layer": "1", "sweeps": "0", "exhaustive": "0"})
    assert not at.exception
    at.button(key="preset_prompt-reconstruction_noise-defeats").click().run()
    assert not at.exception
    preset = P.get("prompt-reconstruction", "noise-defeats")
    assert at.query_params["perm"] == ["none"] or at.query_params["perm"] == "none"
    assert at.selectbox(key="inv_perturb").value == "gaussian_noise"
    assert at.number_input(key="inv_layer").value == int(preset.values()["layer"])
    assert any(preset.title in i.value for i in at.info)
    # a preset for another model switches the session's model
    cap = P.get("caption-correction", "position-dropped")
    at.switch_page("views/caption_correction.py").run()
    at.button(key=f"preset_caption-correction_{cap.name}").click().run()
    assert at.session_state["model_spec"] == ModelSpec("zoo", "shapes-vlm")


@pytest.mark.skipif(not HAS_ZOO, reason="needs the demo zoo")
def test_home_page_lists_every_preset_as_a_link():
    at = app_with_model(ModelSpec("zoo", "shapes-lm"))
    assert not at.exception
    links = [e for e in at.get("page_link")]
    labels = [e.proto.label for e in links]
    for preset in P.PRESETS:
        assert preset.title in labels, preset.title


def test_a_toggle_is_as_wide_as_its_label_not_a_fixed_field_width():
    """A toggle's label sits beside it on one line: at a number field's fixed width it was cut to
    'Check the…' (caption correction's agent settings)."""
    import dataclasses

    from analysis.framework.settings import setting
    from components.params_form import widget

    @dataclasses.dataclass
    class Owner:
        checked: bool = setting(True, label="Check the rewrite", url="chk", cli="chk")

    calls = []

    class Container:
        def __getattr__(self, name):
            return lambda label, **kw: calls.append((name, label, kw)) or kw.get("value")

    field = dataclasses.fields(Owner)[0]
    widget(Container(), field, Owner, key="k", value=True, width=135)
    assert calls[0][0] == "toggle" and calls[0][2]["width"] == "content"

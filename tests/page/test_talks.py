"""Talk mode (#48): every shipped talk opens from its link, every step from a stored result (no Run button,
nothing computed), its big number is the step's reading of that stored result, and next / previous walk it.

The number is checked against the stored entry read straight from analysis/precomputed/ (precompute.lookup),
and, where the preset's finding quotes it, against the finding's own figure."""
from __future__ import annotations

import pytest

from analysis import talks
from analysis.framework import panels, precompute
from analysis.model_access.models import ModelSpec, load_model
from components import talk as T
from conftest import app_with_model, zoo_model_ready

TALKS = talks.all_talks()
STEPS = [(t.name, i) for t in TALKS for i in range(len(t.steps))]


def _ready(t: talks.Talk) -> bool:
    return all(zoo_model_ready(s.preset_value().model) for s in t.steps)


def _open(name: str, step: int):
    at = app_with_model(None, query={"talk": name, "step": str(step + 1)}, timeout=120)
    assert not at.exception, at.exception
    return at


def _number(at) -> str:
    html = " ".join(h.proto.body for h in at.get("html"))
    assert 'data-testid="talk-number"' in html, "no highlighted number on the screen"
    return html.split('data-testid="talk-number">', 1)[1].split("<", 1)[0]


@pytest.fixture(scope="module")
def handles():
    cache = {}
    return lambda label: cache.get(label) or cache.setdefault(label, load_model(ModelSpec.parse(label)))


def test_every_step_resolves_to_a_stored_entry_and_its_number(handles):
    """The rule of #48: a shipped talk never waits for compute. Each step's run, as its page makes it, is a
    stored precomputed entry, and the step's number is the reading of exactly that entry."""
    checked = 0
    for t in TALKS:
        for step in t.steps:
            model = step.preset_value().model
            if not zoo_model_ready(model):
                continue
            run = T.planned_run(step, handles(model))
            key = run.key()
            if run.shipped is not None:  # the SAE-V page's feature store: files committed with the demo SAE
                from analysis import sae_v

                assert sae_v.SAE_ROOT in run.shipped.parents, run.shipped
                stored = sae_v.load_store(run.shipped)
            else:
                stored = precompute.lookup(key.kind, key.model, key.params, key.extra, run.handle.path,
                                           helpers={n: (h.spec.label, h.path) for n, h in run.models.items()})
            assert stored is not None, f"{t.name}: '{step.title}' has no stored result ({key.kind})"
            now = T.show_step(step, run.handle)
            assert not now.missing, now.missing
            reading = talks.readings.READINGS[step.reading]
            assert now.number == reading.value(stored, run.params, T.state_of(step))
            checked += 1
    assert checked >= 19
    assert {s.panel for t in TALKS for s in t.steps} >= {a.url_path for a in panels.analyses() if a.page}


@pytest.mark.parametrize("preset,reading,quoted", [
    ("needle-streaming", "kv.accuracy", "0%"),  # "the answer is wrong"
    ("morphkv", "kv.cache_kib", "96.0 KiB"),  # "MorphKV's cache stays at 96 KiB"
    ("morphkv-loses", "kv.recall", "25%"),  # "MorphKV keeps 3 of the 12 claims"
    ("dispersion", "sharpness.head_weight", "0.53"),  # "only 0.53 among 128"
    ("dispersion", "sharpness.accuracy", "56%"),  # "accuracy falls from 100 % to 56 %"
    ("needle-found", "residual.best_head", "0.73"),  # "head L0H3 alone restores 0.73"
    ("tuned-colour", "residual.first_on_top", "3"),
    ("invented-objects", "captions.factuality_before", "0.00"),  # "factuality goes from 0 to 1"
    ("cross-modal-list", "sae.cross_modal", "36"),  # the page's 'Cross-modal' card
    ("ranking-other-scene", "sae.other_scene_rank", "216"),  # the ranking table's mean rank, 215.7 (clean 123.4)
    ("steer-middle-right", "sae.steer_changed", "2"),  # 'bottom left' -> 'middle right'
])
def test_a_steps_number_is_the_one_its_preset_quotes(handles, preset, reading, quoted):
    step = next(s for t in TALKS for s in t.steps if s.preset == preset and s.reading == reading)
    now = T.show_step(step, handles(step.preset_value().model))
    assert now.text == quoted


@pytest.mark.parametrize("name,index", STEPS)
def test_every_step_of_every_talk_opens_with_its_number_and_no_run_button(name, index):
    t = talks.load(name)
    if not _ready(t):
        pytest.skip("a real model of this talk is not converted here")
    at = _open(name, index)
    step = t.steps[index]
    assert not at.error, [e.value for e in at.error]
    assert not [b for b in at.button if "Run" in b.label], "a talk step offers a Run button"
    assert f"step {index + 1} of {len(t.steps)}" in at.caption[0].value
    now = T.shown(step)
    assert _number(at) == now.text
    assert not at.sidebar.children, "the sidebar (model picker) is drawn in a talk"


def test_next_and_previous_walk_the_talk():
    at = _open("six-findings", 0)
    assert at.button(key="talk_prev").disabled
    at.button(key="talk_next").click().run()
    assert at.query_params["step"] == ["2"] or at.query_params["step"] == "2"
    assert "step 2 of 6" in at.caption[0].value
    at.button(key="talk_prev").click().run()
    assert "step 1 of 6" in at.caption[0].value


def test_an_unknown_talk_is_one_line_listing_the_talks():
    at = _open("no-such-talk", 0)
    assert "There is no talk 'no-such-talk'" in at.error[0].value and "six-findings" in at.error[0].value


def test_a_step_out_of_range_opens_the_nearest_step():
    at = app_with_model(None, query={"talk": "kv-cache", "step": "99"}, timeout=120)
    assert not at.exception and "step 4 of 4" in at.caption[0].value


@pytest.mark.parametrize("name", [t.name for t in TALKS])
def test_the_html_export_holds_every_step_and_asks_no_other_host(name):
    import html as H
    import re

    t = talks.load(name)
    if not _ready(t):
        pytest.skip("a real model of this talk is not converted here")
    page = T.export_html(t)
    body = page.split("</script></head>", 1)[1]  # after the inlined plotly.js
    assert re.findall(r"https?://", body) == [], "the export names another host"
    assert not re.search(r"""(src|href)\s*=\s*['"]?(?!data:|#)""", body), "the export loads a file"
    assert body.count("<details><summary>The researcher's note</summary>") == len(t.steps)
    for step in t.steps:
        assert H.escape(step.narration) in body
        assert f"<td>{H.escape(T.shown(step).text)}</td>" in body, step.title


def test_the_first_and_last_step_show_the_link_and_its_qr_code(monkeypatch):
    from components import talk_screen
    from qr_reader import read_qr

    drawn = []  # the PNG each screen's st.image shows, read back below (tests/qr_reader.py)
    monkeypatch.setattr(talk_screen, "qr_png", lambda text, draw=talk_screen.qr_png: drawn.append(draw(text)) or
                        drawn[-1])
    t = talks.load("kv-cache")
    for index, shows in ((0, True), (1, False), (len(t.steps) - 1, True)):
        drawn.clear()
        at = _open("kv-cache", index)
        codes = [c.value for c in at.code]
        assert (codes == ["/?talk=kv-cache"]) is shows, codes
        assert (len(at.get("image")) == 1) is shows
        assert (len(at.get("download_button")) == 1) is shows
        assert [read_qr(png) for png in drawn] == codes  # the QR code holds the link shown beside it



def test_a_caption_step_shows_the_number_its_page_shows():
    """Caption correction's step is matched among the stored runs (its page generates the caption first):
    the page opened on the same preset shows the same factuality."""
    from conftest import metric_starting

    step = talks.load("caption-correction").steps[0]
    at = app_with_model(ModelSpec.parse(step.preset_value().model), page="views/caption_correction.py",
                        query={"preset": step.preset}, timeout=180)
    assert not at.exception
    assert metric_starting(at, "Factuality").value == T.shown(step).text

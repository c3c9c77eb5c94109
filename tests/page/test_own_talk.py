"""Make your own talk (#48): in the gallery a speaker picks saved analyses, orders them, writes a sentence each
and a title, and saves the talk in the store as its owner; `?talk=<id>` presents it from the saved figures; a
step whose analysis this instance lacks is named (the others still show); a bad id is one line. Every text a
speaker or a saver typed is escaped."""
from __future__ import annotations

import re

import pytest

from analysis.framework.uploads import owner_key
from analysis.hosting.store import AnalysisStore, SavedAnalysis
from analysis.model_access.models import ModelSpec
from components import own_talk
from analysis.talks.own import OwnTalk
from conftest import app_with_model

FIGURE = {"data": [{"type": "bar", "x": ["a", "b"], "y": [3, 4]}], "layout": {"title": {"text": "demo"}}}


@pytest.fixture()
def store(tmp_path, monkeypatch):
    path = tmp_path / "store.db"
    monkeypatch.setenv("MODEL_INSPECTOR_STORE", str(path))
    return AnalysisStore(path)


def _seed(store) -> tuple[str, str]:
    with_figure = store.save(SavedAnalysis(title="KV <b>run</b>", panel="kv", model="zoo:shapes-lm",
                                           figures=[{"name": "fig", "figure": FIGURE}], note="budget 16"))
    with_table = store.save(SavedAnalysis(title="Lens run", panel="residual", model="zoo:shapes-lm",
                                          tables={"ranks": [{"layer": 3, "rank": 1}]}))
    return with_figure, with_table


def _talk(store, steps: list[tuple[str, str, str]], title: str = "My talk") -> str:
    talk = OwnTalk(title, tuple(own_talk.OwnStep(*s) for s in steps))
    return store.save(SavedAnalysis(title=title, panel=own_talk.PANEL, model="", params=talk.params()))


def _open(talk_id: str, step: int = 1):
    at = app_with_model(None, query={"talk": talk_id, "step": str(step)})
    assert not at.exception, at.exception
    return at


def _narration(at) -> str:
    html = " ".join(h.proto.body for h in at.get("html"))
    return html.split('data-testid="talk-narration">', 1)[1].split("<", 1)[0]


def test_a_speaker_builds_orders_and_saves_a_talk(store, tiny_llama_dir):
    first, second = _seed(store)
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), page="views/saved_analyses.py")
    assert not at.exception
    at.text_input(key="talk_build_title").set_value("Cache <script>x</script> *talk*")
    at.multiselect(key="talk_build_steps").set_value([first, second]).run()
    at.text_input(key=f"talk_build_sentence_{first}").set_value("The cache <i>forgets</i>.")
    at.text_input(key=f"talk_build_sentence_{second}").set_value("The lens reads it early.")
    at.button(key=f"talk_build_up_{second}").click().run()  # the lens first
    assert at.multiselect(key="talk_build_steps").value == [second, first]
    at.button(key="talk_build_save").click().run()
    assert not at.exception
    talks = [a for a in store.list() if a.panel == own_talk.PANEL]
    assert len(talks) == 1
    saved = talks[0]
    assert saved.title == "Cache <script>x</script> *talk*" and saved.owner == owner_key("ip:local")
    assert saved.params == {"steps": [
        {"analysis": second, "title": "Lens run", "sentence": "The lens reads it early."},
        {"analysis": first, "title": "KV <b>run</b>", "sentence": "The cache <i>forgets</i>."}]}
    notice = at.success[0].value
    assert f"?talk={saved.id}" in notice and "<script>" not in notice and "*talk*" not in notice
    at.button(key="talk_build_save").click().run()  # a second click on the same talk: no second copy
    assert len([a for a in store.list() if a.panel == own_talk.PANEL]) == 1
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), page="views/saved_analyses.py")
    assert any("Cache &lt;script&gt;" in m.value for m in at.markdown)  # listed under Talks, escaped
    assert f"/?talk={saved.id}" in [b.proto.url for b in at.get("link_button")]
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), page="views/saved_analyses.py",
                        query={"id": saved.id})  # its own page: present it, or delete it (its owner only)
    assert f"/?talk={saved.id}" in [b.proto.url for b in at.get("link_button")]
    at.button(key="confirm_delete").click().run()
    assert store.get(saved.id) is None


def test_a_step_without_a_sentence_or_a_talk_without_a_title_is_not_saved(store, tiny_llama_dir):
    first, _ = _seed(store)
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), page="views/saved_analyses.py")
    at.multiselect(key="talk_build_steps").set_value([first]).run()
    at.button(key="talk_build_save").click().run()
    assert "Give the talk a title" in at.error[0].value
    at.text_input(key="talk_build_title").set_value("T").run()
    at.button(key="talk_build_save").click().run()
    assert "Write a sentence for step 1" in at.error[0].value
    assert not [a for a in store.list() if a.panel == own_talk.PANEL]


def test_a_saved_talk_opens_from_its_link_step_by_step(store):
    first, second = _seed(store)
    talk_id = _talk(store, [(first, "KV <b>run</b>", "The cache <i>forgets</i>."), (second, "Lens run", "Early.")])
    at = _open(talk_id)
    assert "step 1 of 2" in at.caption[0].value and at.subheader[0].value == "KV &lt;b&gt;run&lt;\\/b&gt;"
    assert _narration(at) == "The cache &lt;i&gt;forgets&lt;/i&gt;."
    assert len(at.get("plotly_chart")) == 1 and not at.error and not at.warning
    assert not at.sidebar.children
    assert [c.value for c in at.code] == [f"/?talk={talk_id}"]  # the read-only link and its QR code
    at.button(key="talk_next").click().run()
    assert "step 2 of 2" in at.caption[0].value and _narration(at) == "Early."
    assert at.dataframe[0].value["rank"].tolist() == [1]  # no figure: its first table
    link = [b.proto.url for b in at.get("link_button")]
    assert f"/saved-analyses?id={second}" in link  # explore this: the saved analysis


def test_a_missing_step_is_named_and_the_others_still_show(store):
    first, _ = _seed(store)
    talk_id = _talk(store, [(first, "KV run", "Here."), ("gone12345ab", "Deleted <b>one</b>", "Gone.")])
    at = _open(talk_id, 1)
    assert len(at.get("plotly_chart")) == 1 and not at.error
    warning = at.warning[0].value
    assert "Step 2 (“Deleted &lt;b&gt;one&lt;\\/b&gt;”) is not on this instance" in warning
    assert "gone12345ab" in warning and "<b>" not in warning
    at = _open(talk_id, 2)
    assert "This step cannot be shown. Step 2" in at.error[0].value
    assert not at.get("plotly_chart") and "step 2 of 2" in at.caption[0].value


@pytest.mark.parametrize("asked,shown", [("nope1234567", "'nope1234567'"), ("<script>x", "'that name'")])
def test_a_bad_talk_id_is_one_line(store, asked, shown):
    first, _ = _seed(store)  # a saved analysis is not a talk either
    for name in (asked, first):
        at = _open(name)
        assert len(at.error) == 1
        text = at.error[0].value
        assert "There is no talk" in text and "No saved talk of this instance has that id either" in text
        assert "<script>" not in text
    assert shown in _open(asked).error[0].value


def test_the_export_of_a_saved_talk_holds_each_sentence_and_names_a_missing_step(store):
    first, second = _seed(store)
    talk = OwnTalk("T", (own_talk.OwnStep(first, "KV", "One <b>."), own_talk.OwnStep("gone", "X", "Two.")), "id")
    page = own_talk.export_html(talk, store)
    body = page.split("</script></head>", 1)[1]
    assert re.findall(r"https?://", body) == []
    assert "One &lt;b&gt;." in body and "its saved analysis &#x27;gone&#x27; is not in this gallery" in body


def test_what_a_speaker_or_a_saver_typed_is_shown_as_text(store):
    """A Markdown link, a remote image, HTML and emphasis in the talk's title, a step's title and sentence, and
    a missing step's title: no element of either screen would render them."""
    evil = "[click](https://evil.example/a) ![x](https://evil.example/i.png) <b>bold</b> **big**"
    first, _ = _seed(store)
    talk_id = _talk(store, [(first, evil, evil), ("gone12345ab", evil, evil)], title=evil)
    for step in (1, 2):
        at = _open(talk_id, step)
        shown = [e.value for kind in ("caption", "markdown", "subheader", "warning", "error")
                 for e in getattr(at, kind)]
        assert shown and not [s for s in shown if "](" in s or "<b>" in s or "**big**" in s], shown
        html = " ".join(h.proto.body for h in at.get("html"))
        assert "<b>bold</b>" not in html and (step == 2 or "&lt;b&gt;bold&lt;/b&gt;" in html)

"""The public instance's page rules in AppTest (#39): a gallery where only the saver may delete, saves
that are rate-limited and idempotent, one view's several analyses counting once, and training that
an anonymous visitor cannot start. The server-level half: tests/service/test_public_server.py."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from analysis.framework import config as cfg
from analysis.model_access.models import zoo_models
from analysis.hosting.store import AnalysisStore, SavedAnalysis
from analysis.framework.uploads import owner_key
from conftest import ROOT

PUBLIC = ROOT / "deploy" / "public.toml"
ME = owner_key("ip:local")  # AppTest has no connection: every session is the visitor "local"
pytestmark = pytest.mark.skipif("shapes-lm" not in zoo_models(), reason="needs the demo zoo")


def use_instance(monkeypatch, tmp_path, text: str) -> None:
    """This process serves the configuration `text` (a variant of the public example), with its own store
    and fresh rate limits; the fixture that calls it clears the limits again after its test."""
    from components import hosting, limits

    path = tmp_path / "instance.toml"
    path.write_text(text)
    monkeypatch.setenv(cfg.CONFIG_ENV, str(path))
    monkeypatch.setenv("MODEL_INSPECTOR_STORE", str(tmp_path / "analyses.db"))
    hosting._LIMITER.clear()
    limits.clear()


@pytest.fixture()
def instance(monkeypatch, tmp_path):
    """The public example with its gallery writable (where saving and deleting exist at all)."""
    from components import limits

    use_instance(monkeypatch, tmp_path, PUBLIC.read_text().replace("writable = false", "writable = true"))
    yield tmp_path
    limits.clear()


def app(page: str, query: dict | None = None, timeout: float = 300) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.run()
    at.switch_page(page)
    at.run()
    return at


SHARE_PAGE = """
import streamlit as st
from components.share import share_bar
share_bar("demo", title="Demo", params={"n": 3}, result={"values": [3, 4]}, model="zoo:shapes-lm",
          tables={"rows": [{"x": "a", "y": 3}]})
"""


def share() -> AppTest:
    at = AppTest.from_string(SHARE_PAGE, default_timeout=60)
    at.session_state["share_demo_open"] = True
    at.run()
    return at


def save(at: AppTest, title: str) -> str:
    at.text_input(key="share_demo_title").set_value(title)
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    return " ".join(s.value for s in at.success) + " | " + " | ".join(e.value for e in at.error)


def test_only_the_saver_is_offered_delete(instance):
    store = AnalysisStore(instance / "analyses.db")
    mine = store.save(SavedAnalysis(title="mine", panel="kv", model="m", owner=ME))
    theirs = store.save(SavedAnalysis(title="theirs", panel="kv", model="m", owner=owner_key("ip:203.0.113.9")))
    old = store.save(SavedAnalysis(title="from before owners", panel="kv", model="m"))
    for saved_id, offered in ((mine, True), (theirs, False), (old, False)):
        at = app("views/saved_analyses.py", {"id": saved_id})
        assert not at.exception
        assert bool([b for b in at.button if b.key == "confirm_delete"]) is offered, saved_id
    at = app("views/saved_analyses.py", {"id": mine})
    at.button(key="confirm_delete").click().run()
    assert store.get(mine) is None and store.get(theirs) is not None


def test_a_save_retried_after_a_lost_confirmation_is_not_duplicated(instance):
    """Pressing Save again (the same view, title and note), in the same tab or a new one: one saved analysis."""
    at = share()
    first = save(at, "Retried")
    again = save(at, "Retried")
    in_a_new_tab = save(share(), "Retried")
    store = AnalysisStore(instance / "analyses.db")
    assert store.count() == 1
    saved_id = store.list()[0].id
    assert all(f"saved-analyses?id={saved_id}" in text for text in (first, again, in_a_new_tab))
    save(at, "Another title")
    assert store.count() == 2


def test_saves_are_rate_limited_per_visitor(instance):
    """The public example takes 6 saves a minute from one visitor (before: 60 in 7.8 s); new tabs share it."""
    results = [save(share(), f"save {i}") for i in range(7)]
    assert all("Saved" in r for r in results[:6]), results
    assert "You have saved 6 analyses in the last minute" in results[6].replace("\\", ""), results[6]
    assert AnalysisStore(instance / "analyses.db").count() == 6


def test_a_title_with_a_nul_character_is_refused_with_one_line(instance):
    shown = save(share(), "bad\x00title").replace("\\", "")
    assert "contains a NUL character" in shown and AnalysisStore(instance / "analyses.db").count() == 0


def test_one_prompt_reconstruction_view_counts_as_one_run(instance, computations, monkeypatch):
    """A non-default view starts several analyses (the attack, the sweeps): before, each counted and one
    view spent the visitor's whole budget; now the view counts once (checked by breaking: with no mark
    per script run, the view counts once per analysis)."""
    from analysis.framework import cost
    from components import limits, runs

    monkeypatch.setattr(runs, "ASK_ABOVE_S", cost.LIMIT_S)  # as on a server: long sections wait for a click
    at = app("views/prompt_reconstruction.py", {"seed": "7"})
    assert not at.exception, [e.value for e in at.exception]
    assert len(computations) >= 2, computations
    visits = limits.RUNS._starts["ip:local"]
    assert len(visits) == 1, (computations, list(visits))
    assert not [w for w in at.warning if "in the last minute" in w.value]


@pytest.mark.skipif("shapes-vlm" not in zoo_models(), reason="needs the demo VLM")
def test_an_anonymous_visitor_cannot_start_training(instance, computations, monkeypatch):
    """The public example trains for signed-in visitors only (and not at all where the gallery is
    read-only): the form's button says so, and nothing runs."""
    at = app("views/sae_features.py", {"model": "zoo:shapes-vlm"})
    assert not at.exception
    at.button(key="sae_train_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Training is for signed-in visitors on this instance" in " ".join(w.value for w in at.warning)
    assert "train" not in computations


@pytest.mark.skipif("shapes-vlm" not in zoo_models(), reason="needs the demo VLM")
def test_the_sae_page_offers_no_server_folder_and_no_outside_sae_on_a_public_instance(instance):
    """The public example reads no server folder and fetches nothing from the Hub: the SAE page does not
    offer a box that can only be refused (nor say where the server's folders are)."""
    at = app("views/sae_features.py", query={"model": "zoo:shapes-vlm"})
    assert not at.exception, [e.value for e in at.exception]
    labels = [e.label for e in at.expander] + [w.label for w in at.text_input]
    assert not any("from elsewhere" in label or "Folder on this server" in label for label in labels), labels
    assert any("Your own data" in e.label for e in at.expander)  # uploads stay offered

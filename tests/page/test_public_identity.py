"""Names that cannot be borrowed (#50): with the shared access token the typed name is a label, never an
identity. Limits and ownership count the visitor's address (an IPv6 address by its /64), so another token
holder who types "alice" cannot delete her analysis, and a new name is no fresh rate budget."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from analysis.framework import config as cfg
from analysis.framework.uploads import owner_key
from analysis.hosting.store import AnalysisStore, SavedAnalysis
from conftest import ROOT
from test_public_pages import PUBLIC, app, instance, save, use_instance  # noqa: F401  (a fixture)

TOKEN = "s3cret-token"


@pytest.fixture()
def token_instance(monkeypatch, tmp_path):
    from components import limits

    monkeypatch.setenv(cfg.TOKEN_ENV, TOKEN)
    use_instance(monkeypatch, tmp_path, PUBLIC.read_text().replace("writable = false", "writable = true").replace(
        'mode = "none"', 'mode = "token"'))
    yield tmp_path
    limits.clear()


SHARE_PAGE = """
import streamlit as st
from components.share import share_bar
share_bar("demo", title="Demo", params={"n": 3}, result={"values": [3, 4]}, model="zoo:shapes-lm")
"""


def signed_in_share(name: str) -> AppTest:
    at = AppTest.from_string(SHARE_PAGE, default_timeout=60)
    at.session_state["share_demo_open"] = True
    at.session_state["_mi_user"] = {"name": name, "via": "token"}
    at.run()
    return at


def test_a_typed_name_owns_nothing_and_cannot_delete_anothers_analysis(token_instance):
    store = AnalysisStore(token_instance / "analyses.db")
    hers = store.save(SavedAnalysis(title="alice's", panel="kv", model="m", saved_by="alice",
                                    owner=owner_key("ip:203.0.113.9")))
    by_name = store.save(SavedAnalysis(title="owned by the name", panel="kv", model="m", saved_by="alice",
                                       owner=owner_key("user:alice")))
    for saved_id in (hers, by_name):
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
        at.session_state["_mi_user"] = {"name": "alice", "via": "token"}
        at.query_params["id"] = saved_id
        at.run()
        at.switch_page("views/saved_analyses.py")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert not [b for b in at.button if b.key == "confirm_delete"], saved_id
    at = signed_in_share("alice")
    save(at, "mine")
    mine = [s for s in store.list() if s.title == "mine"][0]
    assert mine.saved_by == "alice" and mine.owner == owner_key("ip:local")  # the name is a label


def test_a_new_name_is_no_fresh_rate_budget(token_instance):
    results = [save(signed_in_share(f"name {i}"), f"save {i}") for i in range(7)]
    assert all("Saved" in r for r in results[:6]), results
    assert "in the last minute" in results[6], results[6]


@pytest.mark.parametrize("addresses,same", [
    ([f"2001:db8:1:2::{i:x}" for i in range(1, 9)], True),  # eight addresses of one /64: one visitor
    (["2001:db8:1:2::1", "2001:db8:1:3::1"], False),  # two /64s: two visitors
    (["::ffff:203.0.113.9", "203.0.113.9"], True),  # an IPv4-mapped address is that IPv4 address
    (["203.0.113.9", "203.0.113.10"], False),
])
def test_visitors_are_counted_by_address_and_ipv6_by_its_64(monkeypatch, token_instance, addresses, same):
    from components import hosting

    ids = set()
    for address in addresses:
        monkeypatch.setattr(hosting, "_peer", lambda a=address: a)
        ids.add(hosting.visitor_id())
    assert (len(ids) == 1) is same, ids

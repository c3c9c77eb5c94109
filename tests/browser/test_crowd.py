"""A crowd on one server: several browser sessions open different panels at the same moment.

Every page must finish with no exception and show the same numbers a single user sees. Two of the
users ask for settings nothing has precomputed, so their analyses really run side by side on the
shared model (its lock is taken per chunk, first come first served).
"""
from __future__ import annotations

import sys
import threading
import time

import pytest

from analysis.model_access.models import zoo_models

from analysis.framework.paths import ROOT
sys.path.insert(0, str(ROOT / "benchmarks"))
import crowd_bench  # noqa: E402

pytestmark = pytest.mark.skipif(not {"shapes-lm", "shapes-vlm"} <= set(zoo_models()), reason="needs the demo zoo")

USERS = [
    ("kv-cache", "?context=48&budget=16&snap_window=4&morph_window=4&examples=1"),  # computed live, not precomputed
    ("attention-sharpness", "?ns=4,8&samples=4"),  # computed live
    ("prompt-reconstruction", ""),
    ("sae-features", "?model=zoo:shapes-vlm"),
    ("caption-correction", "?model=zoo:shapes-vlm"),
]


def _visit(browser, base, users, healthy_at):
    """crowd_bench.crowd in the process's Chromium: each user in a browser context of its own, all at once."""
    pages = [crowd_bench.new_page(browser) for _ in users]
    try:
        return crowd_bench.visit(pages, base, users, healthy_at)
    finally:
        for page in pages:
            page.context.close()


def _one_at_a_time(browser, users, env, protocol_users):
    """A fresh server where each user comes alone, after the previous one has finished; then the
    benchmark's protocol-level users (websocket clients, no browser) open `protocol_users` the same
    way. Returns (browser pages, protocol pages)."""
    proc, base, healthy_at = crowd_bench.start_server(env)
    try:
        pages = [_visit(browser, base, [user], healthy_at)[0] for user in users]
        go = threading.Barrier(1)  # one user at a time: nobody to wait for
        seen = [crowd_bench.protocol_user(base, path, query, go) for path, query in protocol_users]
        return pages, seen
    finally:
        crowd_bench.stop_server(proc)


def test_crowd_of_sessions_sees_no_exception_and_the_same_numbers(chromium, app_server, tmp_path):
    """The crowd on the process's app server (tests/conftest.py: no other test asks for the two live
    settings, so they are computed here, side by side; the rest are precomputed views), then each user
    alone on a fresh server (nothing cached there), all in the process's Chromium."""
    env = {"MODEL_INSPECTOR_STORE": str(tmp_path / "analyses.db"),
           "MODEL_INSPECTOR_ROOTS": str(ROOT / "analysis" / "zoo" / "models"),
           "MODEL_INSPECTOR_ASK_ABOVE_S": "inf"}  # this machine's speed is not the subject here
    together = _visit(chromium.browser, app_server.base, USERS, time.perf_counter())
    for page in together:
        assert not page["exceptions"], (page["page"], page["exceptions"])
        assert not page["errors"], (page["page"], page["errors"])
        assert page["charts"] >= 1, page["page"]
    alone, protocol = _one_at_a_time(chromium.browser, USERS, env, USERS[2:4])
    assert all(p["numbers"] for p in together[:3])  # the computed views show metric cards
    for crowd_page, single in zip(together, alone):
        assert not single["exceptions"], single["page"]
        assert crowd_page["numbers"] == single["numbers"], crowd_page["page"]
    # the benchmark's protocol-level users (websocket clients, no browser) see what a browser shows
    assert len(protocol) == 2
    for seen, single in zip(protocol, alone[2:4]):
        assert not seen["exceptions"] and not seen["errors"], seen["page"]
        assert seen["numbers"] and seen["numbers"] == single["numbers"], seen["page"]
        assert seen["charts"] == single["charts"], seen["page"]

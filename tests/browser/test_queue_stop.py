"""Two users on one server, in a browser: the second is told it is queued behind the first (and for
what), and the first stops its long run with the Stop button, which leaves its page usable.

User A opens attention sharpness with settings nothing has precomputed and that take a while (long
prompts, many of them: each forward holds the shared model for a second or more). User B then opens
KV-cache eviction with its own uncached settings; its run waits for A's forward and must show
"Queued: the shared model is busy with “Running the retrieval prompts … on zoo:shapes-lm”". A then
presses Stop: its page must say the run was stopped, offer to run it again instead of restarting it,
and keep working, while B's run finishes on the freed model.
"""
from __future__ import annotations

import re
import sys

import pytest

from analysis.model_access.models import zoo_models

from analysis.framework.paths import ROOT
sys.path.insert(0, str(ROOT / "benchmarks"))
import crowd_bench  # noqa: E402

pytestmark = pytest.mark.skipif("shapes-lm" not in zoo_models(), reason="needs the demo zoo")

LONG = "attention-sharpness?ns=256,512&samples=320"  # 7 rules x 2 n x 5 batches of 64 prompts of 260-516 tokens
OTHER = "kv-cache?context=48&budget=12&snap_window=4&morph_window=4&examples=1"  # not test_crowd's
HOLDER = "Running the retrieval prompts"
TIMEOUT_MS = 240_000


def _exceptions(page) -> list[str]:
    return page.locator("[data-testid='stException']").all_inner_texts()


def test_a_waiting_user_sees_the_queue_and_stop_ends_a_long_run(chromium, app_server):
    """On the process's app server (tests/conftest.py; no other test asks for these two settings, so both
    runs are computed here), in two browser sessions of the process's Chromium."""
    from playwright.sync_api import expect

    base = app_server.base
    a, b = crowd_bench.new_page(chromium.browser), crowd_bench.new_page(chromium.browser)
    try:
        a.goto(f"{base}/{LONG}", wait_until="commit")
        stop = a.get_by_role("button", name=re.compile(r"(^|\s)Stop$"))
        expect(stop).to_be_visible(timeout=TIMEOUT_MS)  # A's long run has started
        expect(a.get_by_text(HOLDER).first).to_be_visible(timeout=TIMEOUT_MS)  # its progress bar

        b.goto(f"{base}/{OTHER}", wait_until="commit")
        queued = b.get_by_text(re.compile(r"Queued: the shared model is busy with “" + HOLDER))
        expect(queued).to_be_visible(timeout=TIMEOUT_MS)
        assert "on zoo:shapes-lm" in queued.inner_text()

        stop.click()
        expect(a.get_by_text(re.compile(r"Stopped\..*" + HOLDER + r".*was stopped after \d+ s"))).to_be_visible(
            timeout=TIMEOUT_MS)
        again = a.get_by_role("button", name=re.compile(r"Run it again"))
        expect(again).to_be_enabled(timeout=TIMEOUT_MS)
        crowd_bench.settle(a, TIMEOUT_MS)
        # Not restarted: the page is idle, shows the stop note and the button to run it again, no error (the
        # model-free lemma is now one of the result's later sections, so a stopped page draws no figure)
        expect(a.get_by_text(re.compile(r"Stopped\."))).to_be_visible()
        assert a.get_by_role("button", name=re.compile(r"(^|\s)Stop$")).count() == 0
        assert a.get_by_role("button", name=re.compile(r"Run it again")).count() == 1
        assert not _exceptions(a), _exceptions(a)

        # The page still works: another control change reruns it without restarting the stopped run.
        a.get_by_role("slider").first.press("ArrowRight")
        crowd_bench.settle(a, TIMEOUT_MS)
        expect(a.get_by_text(re.compile(r"Stopped\."))).to_be_visible()
        assert not _exceptions(a), _exceptions(a)

        # B got the model once A let go, and finished.
        crowd_bench.settle(b, TIMEOUT_MS)
        expect(queued).to_have_count(0)
        assert not _exceptions(b), _exceptions(b)
        assert b.locator("[data-testid='stMetric']").count() >= 3
    finally:
        a.context.close()
        b.context.close()

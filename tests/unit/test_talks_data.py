"""Talks are data (#48): every shipped talk loads and is checked; a mistake in one is a one-line TalkError
that names the talk, the step and what is wrong."""
from __future__ import annotations

import dataclasses

import pytest

from analysis import talks
from analysis.talks import Step, Talk, TalkError, check

GOOD = Step("kv-cache", "needle-streaming", "Keep only the newest words", "The fact is gone.", "kv.accuracy")


def test_shipped_talks_cover_every_panel_with_presets_and_six_findings():
    names = {t.name for t in talks.all_talks()}
    assert {"kv-cache", "attention-sharpness", "prompt-reconstruction", "residual-stream", "caption-correction",
            "sae-features", "six-findings"} <= names
    six = talks.load("six-findings")
    assert len(six.steps) == 6 and len({s.panel for s in six.steps}) == 5
    real = [s for t in talks.all_talks() for s in t.steps if s.preset_value().model == "zoo:smollm2-135m-instruct"]
    assert len(real) >= 4  # steps on the real SmolLM2 where its presets exist


@pytest.mark.parametrize("change,message", [
    ({"panel": "nowhere"}, "no page 'nowhere'"),
    ({"preset": "nope"}, "has no preset 'nope' (it has: needle-streaming"),
    ({"reading": "kv.nothing"}, "no reading 'kv.nothing'"),
    ({"narration": ""}, "one sentence"),
    ({"narration": "Two sentences. Not one."}, "one sentence"),
    ({"title": " "}, "title must not be empty"),
])
def test_a_wrong_step_is_one_line_naming_talk_and_step(change, message):
    bad = Talk("demo", "Demo", "A talk.", steps=(GOOD, dataclasses.replace(GOOD, **change)))
    with pytest.raises(TalkError) as err:
        check(bad)
    assert message in str(err.value) and "talk 'demo', step 2" in str(err.value)


def test_a_bad_talk_name_or_no_steps_is_refused():
    with pytest.raises(TalkError, match="lower-case"):
        check(Talk("Bad Name", "t", "s.", steps=(GOOD,)))
    with pytest.raises(TalkError, match="no steps"):
        check(Talk("empty", "t", "s."))
    assert check(Talk("fine", "t", "s.", steps=(GOOD,))).name == "fine"


def test_an_unknown_talk_lists_the_talks_and_never_echoes_markup():
    with pytest.raises(TalkError, match="six-findings"):
        talks.load("nope")
    with pytest.raises(TalkError) as err:
        talks.load("<script>")
    assert "<script>" not in str(err.value)

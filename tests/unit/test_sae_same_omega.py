"""'Is omega the same?' is decided once (rules.same_omega, issue 40 item 6): by the rule's omega computation and
the settings it reads, never by the rule's name."""
from __future__ import annotations

from analysis import sae_v


def test_rules_that_compute_the_same_omega_share_it():
    official, normalised = sae_v.score_rule("official"), sae_v.score_rule("normalised")
    assert sae_v.same_omega(official, normalised)  # another s_i, the same omega
    assert sae_v.same_omega(official, sae_v.score_rule("official", cooccur_threshold=0.5))  # s_i's threshold only
    assert not sae_v.same_omega(official, sae_v.score_rule("all-shared"))
    assert not sae_v.same_omega(official, sae_v.score_rule("official", top=20))
    assert not sae_v.same_omega(normalised, sae_v.score_rule("official", omega_top=3))
    assert not sae_v.same_omega(official, sae_v.score_rule("official", minimum=4))

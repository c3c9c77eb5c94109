"""Figure builders of the prompt-reconstruction panel, on hand-made results (no model needed)."""
from __future__ import annotations

from analysis import inversion as inv
from components.figures import inversion as F


def fake_attack(tokens=("<b>hi</b>", "a&b")) -> inv.AttackResult:
    rows = [inv.TokenRecovery(position=i, true_id=i, true_token=t, recovered_token=t if i == 0 else "<x>",
                              recovered_id=i if i == 0 else 9, correct=i == 0, distance=1e-4 if i == 0 else 3.0,
                              rank=1 if i == 0 else 0, evaluations=16 * (i + 1), gradient_steps=0, certified=i == 0,
                              matched_row=i, seconds=0.01)
            for i, t in enumerate(tokens)]
    return inv.AttackResult(params=inv.AttackParams(prompt="x"), model="m", layers=2, vocab_size=100, hidden_size=8,
                            tokens=rows, accuracy=0.5, evaluations=48, proposal_forwards=2, gradient_steps=0,
                            calibration_evaluations=128, epsilon=1e-3, numerical_epsilon=1e-3, state_l1=10.0,
                            seconds=0.02)


def assert_labelled(fig):
    assert fig.layout.title.text
    for axis in ("xaxis", "yaxis"):
        assert getattr(fig.layout, axis).title.text, axis


def test_token_html_escapes_user_text_and_marks_wrong_tokens():
    page = F.tokens_html(fake_attack())
    assert "<b>hi</b>" not in page and "&lt;b&gt;hi&lt;/b&gt;" in page
    assert "a&amp;b" in page and "&lt;x&gt;" in page
    assert F.BAD in page and F.GOOD in page


def test_attack_figures_are_titled_and_show_epsilon_and_exhaustive_reference():
    result = fake_attack()
    dist, rank = F.distance_figure(result), F.rank_figure(result)
    assert_labelled(dist)
    assert_labelled(rank)
    assert any(tr.y[0] == result.numerical_epsilon for tr in dist.data if tr.type == "scatter")
    assert any(tr.y[0] == result.vocab_size for tr in rank.data if tr.type == "scatter")
    assert F.token_rows(result)[1]["rank of true token"] is None


def test_sweep_and_speed_figures_plot_every_point():
    layers = inv.LayerSweep(inv.AttackParams(), [inv.LayerPoint(l, 1.0, 10, 0.1) for l in range(3)])
    noise = inv.NoiseSweep(inv.AttackParams(), [inv.NoisePoint(d, s, 1.0 - s / 3, 5)
                                                for d in ("none", "shuffle_dims") for s in (0.0, 1.0, 3.0)])
    for fig in (F.layer_figure(layers), F.noise_figure(noise)):
        assert_labelled(fig)
    assert len(F.noise_figure(noise).data) == 2
    attack = fake_attack()
    cmp = inv.SpeedComparison(attack=attack, exhaustive=attack, measured_positions=1, positions=2,
                              exhaustive_evaluations_total=200, exhaustive_seconds_total=4.0,
                              identical_on_measured=True, evaluation_ratio=200 / 48, time_ratio=200.0)
    fig = F.speed_figure(cmp)
    assert "extrapolated" in fig.layout.annotations[1].text
    assert list(fig.data[0].y) == [48, 200]


def test_cascade_figure_shades_each_partys_positions():
    views = [inv.party_view(p, [0, 1, 0, 1], 10) for p in range(2)]
    result = inv.CascadeResult(params=inv.CascadeParams(parties=2), model="m", vocab_size=10,
                               tokens=["a", "b", "c", "d"], token_ids=[1, 2, 3, 4], assignment=[0, 1, 0, 1],
                               parties=views, largest_gap=1, brute_force_ran=True, recovered=[1, 2, 9, None],
                               attacker_accuracy=0.5, evaluations=110, seconds=0.1, verdict="Breakable")
    fig = F.cascade_figure(result)
    assert_labelled(fig)
    assert fig.data[0].z[0] == (1.0, 0.0, 1.0, 0.0) or list(fig.data[0].z[0]) == [1.0, 0.0, 1.0, 0.0]
    assert fig.data[0].text[0][0] == "a ✓" and fig.data[0].text[0][2] == "c ✗"
    assert F.cascade_rows(result)[1]["largest gap (unseen run)"] == 1

"""Prompt reconstruction: methods own their settings (registry), and the CLI turns every bad
number into one `error:` line and a non-zero exit (never a traceback)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from conftest import app_with_model

from analysis import inversion as inv
from analysis.__main__ import main
from analysis.model_access.models import ModelSpec
from analysis.framework.registry import SettingsError
from analysis.framework.settings import setting

PAGE = "views/prompt_reconstruction.py"


def run_cli(capsys, argv: list[str]) -> tuple[int, str]:
    """Exit code and stderr of `python -m analysis ARGV`, run in-process (argparse exits via SystemExit)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def assert_one_error_line(code: int, err: str, *needles: str) -> None:
    assert code != 0, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]


# --- the classes hold and check their own settings ------------------------------------------------


def test_defences_check_their_own_settings_with_a_message_for_the_user():
    with pytest.raises(SettingsError, match="Quantisation bits must be at least 1"):
        inv.Quantise(bits=0)
    with pytest.raises(SettingsError, match="whole number"):
        inv.Quantise(bits=2.5)
    with pytest.raises(SettingsError, match="at most 32"):
        inv.Quantise(bits=33)
    with pytest.raises(SettingsError, match="Noise σ .* must be at least 0"):
        inv.GaussianNoise(sigma=-0.1)
    with pytest.raises(SettingsError, match="finite"):
        inv.GaussianNoise(sigma=math.nan)
    assert inv.Quantise(bits=1).bits == 1 and inv.GaussianNoise(sigma=0.0).sigma == 0.0


def test_quantise_at_one_bit_is_two_levels_and_zero_noise_changes_nothing():
    states = torch.linspace(-1.0, 3.0, 12).reshape(3, 4)
    gen = torch.Generator().manual_seed(0)
    one_bit = inv.Quantise(bits=1).apply(states, gen)
    assert sorted(set(one_bit.flatten().tolist())) == [-1.0, 3.0]  # lo and hi, step (hi - lo) / (2^1 - 1)
    assert torch.equal(inv.GaussianNoise(sigma=0.0).apply(states, gen), states)


def test_orders_and_attack_params_check_their_settings():
    with pytest.raises(SettingsError, match="Gradient steps must be at least 1"):
        inv.GradientOrder(steps=0)
    assert inv.HybridOrder(steps=0).steps == 0  # hybrid without its gradient phase is allowed
    ms = inv.method_settings
    bad = [dict(layer=-1), dict(positions=-2), dict(seed=-1), dict(first_batch=0), dict(max_batch=4),
           dict(methods=ms(sigma=-1.0)), dict(methods=ms(bits=0)), dict(order="gradient", methods=ms(steps=0)), dict(order="nope"), dict(defences=["rot13"]),
           dict(methods={"rot13": {}}), dict(methods={"quantise": {"sigma": 1.0}})]
    for settings in bad:
        with pytest.raises(SettingsError):
            inv.AttackParams(prompt="w1", **settings).validate()
    inv.AttackParams(prompt="w1").validate()
    inv.AttackParams(prompt="w1", methods=ms(steps=0)).validate()  # hybrid, its gradient phase off
    with pytest.raises(SettingsError, match="Attacking party must be at most 1"):
        inv.CascadeParams(prompt="w1", parties=2, attacker=2).validate()


def test_labels_come_from_the_classes():
    assert inv.defence_label("quantise") == inv.Quantise.label
    assert inv.defence_label("none") == inv.NO_DEFENCE_LABEL
    assert inv.defence_names("permutation") == ["none", "shuffle_positions", "shuffle_dims", "shuffle_both"]
    assert inv.defence_names("perturbation") == ["none", "gaussian_noise", "quantise"]
    assert inv.ORDERS.label("hybrid") == inv.HybridOrder.label
    assert list(inv.SHARDINGS) == ["round_robin", "blocks"]


@dataclass
class ToyFlip(inv.Defence):
    """Reverses the hidden dimensions: a permutation, so sorted-vector matching still wins."""

    name: ClassVar[str] = "toy_flip"
    label: ClassVar[str] = "toy: reversed hidden dimensions"
    kind: ClassVar[str] = "permutation"
    moves_dims: ClassVar[bool] = True

    def apply(self, states, gen):
        return states.flip(1)


def test_a_registered_toy_defence_appears_in_the_page_and_runs(tiny_llama_dir):
    inv.DEFENCES.register(ToyFlip)
    try:
        at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), page=PAGE,
                            query={"prompt": "w3 w17 w42 w8", "perm": "toy_flip", "sweeps": "0", "exhaustive": "0"})
        assert not at.exception, at.exception
        box = at.selectbox(key="inv_perm")
        assert ToyFlip.label in box.options, box.options
        assert box.value == "toy_flip"
        assert next(m.value for m in at.metric if m.label == "Tokens recovered") == "100%"
    finally:
        inv.DEFENCES.unregister("toy_flip")
    assert "toy_flip" not in inv.defence_names("permutation")


@pytest.mark.parametrize("query, message, key, nearest", [
    ({"noise": "-2"}, "Noise σ (× state std) must be at least 0.0, got -2.0.", "inv_sigma", 0.0),
    ({"bits": "0"}, "Quantisation bits must be at least 1, got 0.", "inv_bits", 1),
    ({"gradient_steps": "-1"}, "Gradient steps must be at least 0, got -1.", "inv_steps", 0),
])
def test_page_shows_the_class_message_for_a_bad_url_value(tiny_llama_dir, query, message, key, nearest):
    """The link's value goes through the CLI's validation (the class's own message); the control shows the
    nearest allowed value and the page goes on with it."""
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), page=PAGE,
                        query={"prompt": "w3 w17 w42", "sweeps": "0", "exhaustive": "0", **query})
    assert not at.exception, at.exception
    errors = " ".join(e.value.replace("\\", "") for e in at.error)  # as read: messages are shown escaped
    assert message in errors and "out of range" in errors
    assert at.number_input(key=key).value == nearest
    assert next(m.value for m in at.metric if m.label == "Tokens recovered") == "100%"


# --- the command line ---------------------------------------------------------------------------


@pytest.mark.parametrize("extra, needle", [
    (["--defence", "quantise", "--bits", "0"], "Quantisation bits must be at least 1"),
    (["--bits", "0"], "Quantisation bits must be at least 1"),
    (["--defence", "quantise", "--bits", "40"], "at most 32"),
    (["--defence", "gaussian_noise", "--noise", "-1"], "must be at least 0"),
    (["--noise", "nan"], "--noise: cannot read 'nan' as Noise σ (× state std)"),
    (["--layer", "-1"], "Layer must be at least 0"),
    (["--seed", "-3"], "Defence seed must be at least 0"),
    (["--positions", "-1"], "Positions must be at least 0"),
    (["--order", "gradient", "--gradient-steps", "0"], "Gradient steps must be at least 1"),
    (["--bits", "four"], "--bits: cannot read 'four' as Quantisation bits"),
    (["--defence", "rot13"], "invalid choice"),
])
def test_invert_cli_out_of_range_is_one_error_line(capsys, extra, needle):
    # Checked before any model loads: the model named here does not exist.
    code, err = run_cli(capsys, ["invert", "--model", "local:/nonexistent", "--prompt", "w1 w2", *extra])
    assert_one_error_line(code, err, needle)


def test_invert_cli_errors_that_need_the_model_are_one_line_too(capsys, tiny_gpt2_dir):
    model = f"local:{tiny_gpt2_dir}"
    code, err = run_cli(capsys, ["invert", "--model", model, "--prompt", "w1 w2", "--layer", "99"])
    assert_one_error_line(code, err, "out of range")
    code, err = run_cli(capsys, ["invert", "--model", model, "--prompt", "   "])
    assert_one_error_line(code, err, "empty")
    code, err = run_cli(capsys, ["invert", "--model", "local:/nonexistent", "--prompt", "w1"])
    assert_one_error_line(code, err)


# --- methods own their settings: a new one reaches the analysis; old saved analyses still open ------------

OLD_FLAT = ('{"prompt": "w3 w17 w42", "layer": 2, "defences": ["gaussian_noise"], "noise": 2.0, "bits": 5, '
            '"order": "hybrid", "exhaustive": false, "positions": 0, "seed": 0, "max_tokens": 64, '
            '"first_batch": 16, "max_batch": 1024, "gradient_steps": 3}')  # the layout shipped before issue 30


def test_an_old_flat_saved_analysis_still_opens(tiny_llama):
    params = inv.AttackParams.from_json(OLD_FLAT)
    assert params.methods == {"gaussian_noise": {"sigma": 2.0}, "quantise": {"bits": 5}, "hybrid": {"steps": 3},
                              "gradient": {"steps": 3}}
    assert inv.make_defence(params, "gaussian_noise").sigma == 2.0 and inv.make_order(params).steps == 3
    result = inv.reconstruct(tiny_llama, params)
    old = result.to_dict()
    old["params"] = json.loads(OLD_FLAT)  # a saved result of the old layout: its params flat
    again = inv.AttackResult.from_dict(old)
    assert again.params == params and again.tokens == result.tokens


@dataclass
class ToyRoll(inv.Order):
    """The vocabulary in order, rolled by its own setting: a new order with a new setting."""

    name: ClassVar[str] = "toy_roll"
    label: ClassVar[str] = "toy: vocabulary rolled"
    offset: int = setting(0, label="Toy roll offset", low=0, high=100)
    seen: ClassVar[list] = []

    def proposals(self, ctx):
        ToyRoll.seen.append(self.offset)
        yield torch.arange(len(ctx.vocabulary)).roll(-self.offset)


def test_a_new_orders_setting_reaches_the_analysis_from_the_url(tiny_llama_dir):
    inv.ORDERS.register(ToyRoll)
    ToyRoll.seen.clear()
    try:
        at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), page=PAGE,
                            query={"prompt": "w3 w17 w42", "order": "toy_roll", "offset": "7", "sweeps": "0",
                                   "exhaustive": "0"})
        assert not at.exception, at.exception
        assert at.number_input(key="inv_offset").value == 7 and not at.number_input(key="inv_offset").disabled
        assert at.number_input(key="inv_bits").disabled  # quantisation is not chosen
        assert ToyRoll.seen and set(ToyRoll.seen) == {7}
        assert at.query_params["offset"] == "7"
    finally:
        inv.ORDERS.unregister("toy_roll")


def test_the_orders_settings_reach_the_attack_from_the_cli(capsys, tiny_gpt2_dir):
    code = main(["invert", "--model", f"local:{tiny_gpt2_dir}", "--prompt", "w5 w6 w7 w8", "--layer", "1",
                 "--gradient-steps", "3", "--gradient-min-vocab", "0", "--gradient-after", "0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["params"]["methods"]["hybrid"] == {"steps": 3, "gradient_min_vocab": 0,
                                                                 "gradient_after": 0}
    assert set(t["gradient_steps"] for t in out["tokens"]) <= {0, 3}
    code = main(["invert", "--model", f"local:{tiny_gpt2_dir}", "--prompt", "w5 w6 w7 w8", "--layer", "1",
                 "--order", "gradient", "--gradient-steps", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and [t["gradient_steps"] for t in out["tokens"]] == [3, 3, 3, 3] and out["accuracy"] == 1.0

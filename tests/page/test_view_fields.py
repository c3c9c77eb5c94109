"""A setting added to a panel's Params (one labelled field) reaches all five surfaces with no other edit:
the page (a control, its value in the run), the URL (read and mirrored, clamped with the one-line
message), the command line (a flag), the presets (every preset's link pins it) and the hostile-URL test
(its cases are the fields). The field is added in a temporary subclass that the panel declares for the
test (`ANALYSIS.params`), the one place every surface reads."""
from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import app_with_model

from analysis import kv
from analysis.framework import presets as P
from analysis.framework.errors import SettingsError
from analysis.model_access.models import ModelSpec
from analysis.framework.settings import setting
from components import runs
from components.view import url_fields

PAGE = "views/kv_cache.py"
SMALL = {"context": "64", "budget": "24", "snap_window": "4", "morph_window": "4"}


@dataclasses.dataclass
class Probed(kv.KvParams):
    probe: int = setting(3, label="Probe setting", low=1, high=9, help="A setting only this test adds.")


@pytest.fixture
def probed(monkeypatch):
    monkeypatch.setattr(kv, "ANALYSIS", dataclasses.replace(kv.ANALYSIS, params=Probed))
    yield
    runs.run_store().clear()


@pytest.fixture
def seen_params():
    """The settings every run of the page was asked with (a source that serves nothing)."""
    seen: list[dict] = []

    def record(key, handle, params, models=None):
        seen.append(json.loads(key.params))
        return None

    runs.add_source(record)
    yield seen
    runs.remove_source(record)


def test_the_new_setting_is_a_control_whose_link_value_reaches_the_run(probed, seen_params, tiny_llama_dir):
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, query={**SMALL, "probe": "7"}, timeout=600)
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    control = at.number_input(key="kv_probe")
    assert control.label == "Probe setting" and control.value == 7
    assert at.query_params["probe"] in ("7", ["7"])  # the URL mirrors it
    assert any(p.get("probe") == 7 for p in seen_params)  # the analysis got it
    control.set_value(5).run(timeout=600)
    assert at.query_params["probe"] in ("5", ["5"])
    assert any(p.get("probe") == 5 for p in seen_params)


def test_a_link_out_of_the_new_settings_range_gets_its_one_line_message(probed, tiny_llama_dir):
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), PAGE, query={**SMALL, "probe": "99"})
    assert not at.exception, at.exception
    assert at.number_input(key="kv_probe").value == 9  # the nearest allowed value
    assert any("Probe setting must be at most 9" in e.value for e in at.error), [e.value for e in at.error]


def test_the_new_setting_is_a_command_line_flag(probed):
    import importlib

    cli = importlib.import_module("analysis.kv.cli")  # the module (the package exports its `cli` function)

    assert "--probe" in cli.parser().format_help()
    params = cli.params_from(cli.parser().parse_args(["--probe", "4", "--budget", "16"]))
    assert isinstance(params, Probed) and params.probe == 4 and params.budget == 16
    with pytest.raises(SettingsError, match="Probe setting"):
        kv.validate_params(cli.params_from(cli.parser().parse_args(["--probe", "0"])))


def test_every_preset_link_pins_the_new_setting(probed):
    presets = P.for_panel(kv.ANALYSIS.url_path)
    assert presets
    for preset in presets:
        values = preset.values()
        assert values["probe"] == "3", preset.name  # its default: the link reproduces the view
        assert values["budget"] == str(preset.params.budget)  # and the preset's own values stay its own


def test_the_hostile_url_cases_include_the_new_setting(probed):
    from test_hostile_urls import url_names

    assert "probe" in url_fields(kv.ANALYSIS)
    assert "probe" in url_names(PAGE)


def test_without_the_subclass_there_is_no_such_setting():
    """The check above is the subclass's doing (the fixture is undone)."""
    assert "probe" not in url_fields(kv.ANALYSIS)
    assert all("probe" not in p.values() for p in P.for_panel(kv.ANALYSIS.url_path))

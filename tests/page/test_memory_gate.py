"""The cost gate's memory budget and its long-run confirmation on a page (#50, #47): a run whose estimated
peak passes `limits.max_run_mb` is refused with the limit named and nothing starts; one that fits runs;
a run estimated above ten minutes shows what it will do and its Run button waits for a tick."""
from __future__ import annotations

import pytest
from conftest import app_with_model

from analysis.framework import config as cfg
from analysis.model_access.models import ModelSpec

KV_QUERY = {"context": "40", "budget": "17", "snap_window": "4", "morph_window": "4", "examples": "1"}


def _config(tmp_path, monkeypatch, limits: str):
    from components import hosting, limits as lim

    path = tmp_path / "instance.toml"
    path.write_text(f"[limits]\n{limits}\n")
    monkeypatch.setenv(cfg.CONFIG_ENV, str(path))
    hosting._LIMITER.clear()
    lim.clear()


def _notes(at) -> str:
    return " ".join(str(e.value) for kind in ("warning", "info", "error") for e in getattr(at, kind))


def test_a_run_over_the_memory_cap_is_refused_with_the_limit_named(tiny_llama_dir, tmp_path, monkeypatch,
                                                                    computations):
    _config(tmp_path, monkeypatch, "max_run_mb = 1")
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), "views/kv_cache.py", query=KV_QUERY, timeout=120)
    assert not at.exception, at.exception
    notes = _notes(at)
    assert "MB of memory at its peak on this machine; this instance runs analyses of up to 1 MB each, so it " \
           "was not started" in notes, notes
    assert computations == [] and not at.get("plotly_chart")
    assert not [b for b in at.button if b.label.startswith("Run it")], "no button starts a refused run"


def test_a_run_within_the_memory_cap_runs(tiny_llama_dir, tmp_path, monkeypatch, computations):
    _config(tmp_path, monkeypatch, "max_run_mb = 4000\nserver_mb = 1000000")
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), "views/kv_cache.py", query=KV_QUERY, timeout=120)
    assert not at.exception, at.exception
    assert "analyze" in computations and "of memory" not in _notes(at)


def test_a_run_past_the_servers_budget_is_refused(tiny_llama_dir, tmp_path, monkeypatch, computations):
    _config(tmp_path, monkeypatch, "server_mb = 100")  # this test process alone holds more than that
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), "views/kv_cache.py", query=KV_QUERY, timeout=120)
    assert not at.exception, at.exception
    assert "this server's budget is 100 MB" in _notes(at) and computations == []


def test_a_run_above_ten_minutes_asks_for_a_tick_that_says_what_it_will_do(tiny_llama_dir, monkeypatch,
                                                                          computations):
    from components import runs

    monkeypatch.setattr(runs, "ASK_ABOVE_S", 0.0)  # every run asks
    monkeypatch.setattr(runs, "CONFIRM_ABOVE_S", 0.0)  # and counts as longer than ten minutes
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), "views/kv_cache.py", query=KV_QUERY, timeout=120)
    assert not at.exception, at.exception
    notes = _notes(at)
    assert "This is a long run" in notes and "other analyses on this model wait behind it" in notes, notes
    run = next(b for b in at.button if b.label.startswith("Run it"))
    assert run.disabled, "a run above ten minutes is not one click away"
    assert "–" in run.label or "under a second" in run.label or "up to" in run.label  # a range, not one number
    assert computations == []
    tick = next(c for c in at.checkbox if c.label.startswith("I understand"))
    tick.check().run()
    run = next(b for b in at.button if b.label.startswith("Run it"))
    assert not run.disabled
    run.click().run()
    assert not at.exception, at.exception
    assert "analyze" in computations and len(at.get("plotly_chart")) >= 1  # the headline heatmap
    # the other figures are in later sections, shown one at a time behind a segmented control
    at.segmented_control(key="kv_chapter").set_value("KL and needle survival").run()
    assert not at.exception, at.exception
    assert computations.count("analyze") == 1 and len(at.get("plotly_chart")) >= 3


def test_a_shorter_long_run_is_one_click(tiny_llama_dir, monkeypatch, computations):
    from components import runs

    monkeypatch.setattr(runs, "ASK_ABOVE_S", 0.0)
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)), "views/kv_cache.py", query=KV_QUERY, timeout=120)
    assert not [c for c in at.checkbox if c.label.startswith("I understand")]
    run = next(b for b in at.button if b.label.startswith("Run it"))
    assert not run.disabled
    run.click().run()
    assert "analyze" in computations

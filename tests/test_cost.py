"""Cost estimates: the work counted from the settings is the work done; the time is close to measured;
a view does not start long work on page load."""
from __future__ import annotations

import time

import pytest
import torch
from conftest import app_with_model

from analysis import cost
from analysis import kv_eviction as kv
from analysis import sharpness as S
from analysis.models import ModelSpec, load_model, zoo_models

KV_SMALL = kv.KvParams(context=48, budget=16, snap_window=4, morph_window=4, new_tokens=4)
JOBS = [
    (kv.analyze, KV_SMALL),
    (kv.budget_sweep, kv.KvParams(context=48, budget=16, snap_window=4, morph_window=4, examples=2)),
    (kv.analyze, kv.KvParams(prompt="a b c d e f g h i j k l", budget=8, snap_window=2, morph_window=2, sinks=2,
                             new_tokens=6)),
    (S.size_sweep, S.SweepParams(ns=[2, 4, 8], samples=5, batch=2)),
]


class CallCounter:
    """Counts forward calls and tokens of a language model with a pre-hook (a reference count)."""

    def __init__(self, lm):
        self.calls = self.tokens = 0
        self._handle = lm.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        x = kwargs.get("input_ids")
        x = x if x is not None else (args[0] if args else kwargs["inputs_embeds"])
        self.calls += 1
        self.tokens += x.shape[0] * x.shape[1]

    def close(self):
        self._handle.remove()


@pytest.mark.parametrize("fn,params", JOBS, ids=[f"{f.__name__}-{i}" for i, (f, _) in enumerate(JOBS)])
def test_counted_work_equals_the_forwards_the_analysis_runs(tiny_llama, fn, params):
    work = cost.estimate_work(fn, tiny_llama, params)
    counter = CallCounter(tiny_llama.language_model)
    try:
        fn(tiny_llama, params)
    finally:
        counter.close()
    assert (work.calls, work.tokens) == (counter.calls, counter.tokens)


def test_estimate_grows_with_the_settings(tiny_llama):
    small = cost.estimate_work(S.size_sweep, tiny_llama, S.SweepParams(ns=[4, 8], samples=8))
    double = cost.estimate_work(S.size_sweep, tiny_llama, S.SweepParams(ns=[4, 8], samples=16))
    assert double.tokens == 2 * small.tokens
    longer = cost.estimate_work(kv.analyze, tiny_llama,
                                kv.KvParams(context=96, budget=16, snap_window=4, morph_window=4))
    assert longer.calls > cost.estimate_work(kv.analyze, tiny_llama, KV_SMALL).calls


def test_unknown_analysis_has_no_estimate(tiny_llama):
    assert cost.estimate(lambda h, p: None, tiny_llama, KV_SMALL) is None


def _models():
    out = [("tiny-llama", None)]
    if "shapes-lm" in zoo_models():
        out.append(("shapes-lm", ModelSpec("zoo", "shapes-lm")))
    return out


@pytest.mark.parametrize("name,spec", _models(), ids=[m[0] for m in _models()])
def test_estimate_is_close_to_the_measured_time(name, spec, tiny_llama):
    """Two model sizes. The README's benchmark checks 2x on a 0.5 B model; on the shared test machine,
    whose load changes between the calibration and the run, the bound here is 3x."""
    handle = tiny_llama if spec is None else load_model(spec)
    torch.set_num_threads(torch.get_num_threads())
    ratios = []
    for fn, params in (JOBS[0], JOBS[3]):
        fn(handle, params)  # first call: lazy imports and allocations
        cost._calibrated.pop(id(handle.language_model), None)
        estimate = cost.estimate(fn, handle, params)
        t0 = time.perf_counter()
        fn(handle, params)
        measured = time.perf_counter() - t0
        ratios.append(measured / estimate.seconds)
    assert all(1 / 3 <= r <= 3 for r in ratios), ratios


def test_long_work_waits_for_a_click_then_runs(tiny_llama_dir, monkeypatch):
    from components import runs

    monkeypatch.setattr(runs, "ASK_ABOVE_S", 0.0)  # every run counts as long
    spec = ModelSpec("local", str(tiny_llama_dir))
    query = {"context": "40", "budget": "17", "snap_window": "4", "morph_window": "4", "examples": "1"}
    at = app_with_model(spec, "views/kv_cache.py", query=query, timeout=120)
    assert not at.exception, at.exception
    assert not at.get("plotly_chart"), "nothing is computed before the click"
    notes = " ".join(i.value for i in at.info)
    assert "would take about" in notes and "not started on its own" in notes
    run = next(b for b in at.button if b.label.startswith("Run it"))
    run.click().run()
    assert not at.exception, at.exception
    assert len(at.get("plotly_chart")) >= 3
    # The budget sweep is on demand: a button, not computed with the page.
    assert any(b.label.startswith("Run") for b in at.button)

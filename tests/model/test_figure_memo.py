"""Figures are built once per (result object, settings) and reused by reruns and other sessions."""
from __future__ import annotations

import gc
import threading
from dataclasses import dataclass

import plotly.graph_objects as go

from analysis import kv
from components.figures import kv as kv_figures
from components.figures.memo import MAX_PER_BUILDER, shared_figure


@dataclass
class Box:  # unhashable, mutable: like the analysis results
    values: list


calls: list[int] = []


@shared_figure
def bars(box: Box, title: str = "") -> go.Figure:
    calls.append(1)
    return go.Figure(go.Bar(y=list(box.values)), layout={"title": title})


def test_the_same_result_and_settings_give_the_same_figure_object_built_once():
    calls.clear()
    box = Box([1, 2, 3])
    first = bars(box, title="a")
    assert bars(box, title="a") is first and len(calls) == 1
    other = bars(box, title="b")
    assert other is not first and other.layout.title.text == "b" and len(calls) == 2


def test_an_equal_looking_new_result_is_drawn_from_its_own_values():
    """Keyed by identity, and the entry keeps its arguments alive: a new object never gets a dead
    object's id (and so its figure)."""
    calls.clear()
    # what the process held before this test is set aside from the collector (gc.freeze): each collection
    # below then walks only this loop's objects, not every model and module earlier tests left in memory
    # (200 full collections took 56 s late in a serial run of the suite, 0.4 s alone)
    gc.collect()
    gc.freeze()
    try:
        for i in range(200):
            box = Box([i])
            fig = bars(box)
            assert list(fig.data[0].y) == [i]
            del box, fig
            gc.collect()
    finally:
        gc.unfreeze()
    assert bars.cache_len() <= MAX_PER_BUILDER


def test_memoised_builders_draw_what_the_plain_function_draws(tiny_llama_dir):
    from analysis.model_access.models import ModelSpec, load_model

    handle = load_model(ModelSpec("local", str(tiny_llama_dir)))
    result = kv.analyze(handle, kv.KvParams(context=32, budget=12, new_tokens=4, policies=kv.policy_settings(snap_window=4, morph_window=4)))
    for name in ("memory_figure", "step_metric_figure"):
        memo = getattr(kv_figures, name)
        plain = memo.__wrapped__
        assert memo(result).to_dict() == plain(result).to_dict()
        assert memo(result) is memo(result)


def test_many_threads_get_one_correct_figure_each():
    boxes = [Box([i, i + 1]) for i in range(8)]
    seen: dict[int, list] = {}

    def draw(i: int) -> None:
        seen[i] = [list(bars(boxes[i]).data[0].y) for _ in range(20)]

    threads = [threading.Thread(target=draw, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(all(v == [i, i + 1] for v in seen[i]) for i in range(8))

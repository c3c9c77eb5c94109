"""The one number a talk step points at: named readings of a stored result.

A reading turns the result a preset's page computed into the number that page shows for it (the same
formula as the page's metric card), so the number on the talk's screen is the page's:

    READINGS["kv.accuracy"].value(result, params, state)   # 0.0: StreamingLLM lost the needle

`params` is the Params value the page ran, `state` the view state the preset pins (layer, head, ...).
A reading names the result kinds it reads (`kinds`): a talk whose step points a reading at another
panel's run is refused when the talk is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Reading:
    name: str
    label: str  # what the number is, in words the room follows
    kinds: tuple[str, ...]  # the runs it reads ("analyze", "attack", ...)
    value: Callable[[Any, Any, dict], float | None]
    fmt: str = "{:.2f}"  # how the page writes it

    def text(self, number: float | None) -> str:
        return "n/a" if number is None else self.fmt.format(number)


def _kv_accuracy(result, params, state):
    return result.run(params.policy).accuracy


def _kv_recall(result, params, state):
    return result.run(params.policy).recall


def _kv_cache_kib(result, params, state):
    run = result.run(params.policy)
    return run.cache_bytes[-1] / 1024 if run.cache_bytes else None


def _recovered(result, params, state):
    return result.accuracy


def _fewer(result, params, state):
    return len(result.tokens) * result.vocab_size / max(result.evaluations, 1)


def _head_weight(rule: str) -> Callable:
    def value(result, params, state):  # the preset's head, at the largest n measured
        layer, head = state.get("layer", 0), state.get("head", 0)
        return result.points[-1].run(rule).with_sink.target_weight[layer][head]
    return value


def _accuracy_at_largest(rule: str) -> Callable:
    return lambda result, params, state: result.points[-1].run(rule).accuracy


def _after(name: str) -> Callable:
    return lambda result, params, state: getattr(result.after, name) if result.after is not None else None


def _before(name: str) -> Callable:
    return lambda result, params, state: getattr(result.before, name) if result.before is not None else None


def _best_head(result, params, state):
    grid = result.grid("heads", "exact") or result.grid("heads", "attribution")
    return grid.peak()[2] if grid is not None else None


def _first_on_top(result, params, state):
    """The first state (0: the embeddings) whose lens has the target on top at the last position."""
    return next((i for i, ranks in enumerate(result.lens.target_rank) if ranks[-1] == 0), None)


def _cross_modal(result, params, state):
    return result.summary()["cross_modal"]


def _image_top(result, params, state):
    return result.features[state.get("feature", 0)].n_image_top


def _mean_rank(kind: str) -> Callable:
    def value(result, params, state):  # the ranking table's "mean rank" of that kind of pair (1: the best score)
        ranks = [r.rank for r in result.rows if r.kind == kind]
        return round(sum(ranks) / len(ranks), 1) if ranks else None
    return value


def _steer_changed(result, params, state):
    return sum(result.steered.changed)


READINGS: dict[str, Reading] = {r.name: r for r in (
    Reading("kv.accuracy", "Key-value accuracy of the chosen policy", ("analyze",), _kv_accuracy, "{:.0%}"),
    Reading("kv.recall", "Claims the chosen policy's answer keeps", ("long_response",), _kv_recall, "{:.0%}"),
    Reading("kv.cache_kib", "Cache the chosen policy holds at the end (KiB)", ("long_response",), _kv_cache_kib,
            "{:.1f} KiB"),
    Reading("inversion.recovered", "Tokens of the prompt recovered", ("attack",), _recovered, "{:.0%}"),
    Reading("inversion.fewer", "Times fewer guesses than trying every word", ("attack",), _fewer, "{:,.0f}×"),
    Reading("sharpness.head_weight", "The head's weight on the right item, most items", ("sweep",),
            _head_weight("softmax"), "{:.2f}"),
    Reading("sharpness.accuracy", "Right answers with the most items", ("sweep",), _accuracy_at_largest("softmax"),
            "{:.0%}"),
    Reading("sharpness.adaptive_accuracy", "Right answers with the most items, adaptive temperature", ("sweep",),
            _accuracy_at_largest("adaptive θ"), "{:.0%}"),
    Reading("captions.factuality", "Share of the corrected caption's claims that are true", ("correct",),
            _after("factuality"), "{:.2f}"),
    Reading("captions.factuality_before", "Share of the original caption's claims that are true", ("correct",),
            _before("factuality"), "{:.2f}"),
    Reading("captions.coverage", "Share of the picture's facts the corrected caption still states", ("correct",),
            _after("coverage"), "{:.2f}"),
    Reading("residual.best_head", "Share of the answer one head brings back", ("patch",), _best_head, "{:.2f}"),
    Reading("residual.first_on_top", "First layer where the lens reads the answer on top", ("inspect",),
            _first_on_top, "{:d}"),
    Reading("sae.cross_modal", "Features that fire on both caption words and picture patches", ("store",),
            _cross_modal, "{:d}"),
    Reading("sae.image_top", "Picture patches among the feature's 30 strongest places", ("store",), _image_top,
            "{:d}"),
    Reading("sae.other_scene_rank", "Average place of another scene's caption among all pairs (1: the best match)",
            ("rank",), _mean_rank("other_scene"), "{:.0f}"),
    Reading("sae.steer_changed", "Words of the caption that change when one feature is pushed", ("steer",),
            _steer_changed, "{:d}"),
)}

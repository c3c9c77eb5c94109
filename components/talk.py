"""Talk mode: `?talk=NAME` presents a talk (analysis/talks/) one step per screen, from stored results only.

    present()            # app.py, when the link names a talk: the sidebar and every control hidden

A step is a preset of one page. Its result is found the way that page finds it: the page's own View
turns the preset's values into its Params (`params_of`) and names its run (`run`), here with a stand-in
page that records the run instead of starting it (`planned_run`); the result is then read from the
results shipped with the app (analysis/precomputed/, `stored_result`) and never computed: a step with
no stored result says so in one line. The step's number is its reading of that result
(analysis/talks/readings.py), drawn large with the page's figure for it, the narration above and the
preset's finding (the researcher's note) folded below.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import re
from dataclasses import dataclass
from typing import Any, Callable

import streamlit as st

from analysis.framework.settings import field_default, parse_text, url_name
from analysis.model_access.models import ModelHandle, ModelSpec
from analysis.talks import Step, Talk
from analysis.talks.readings import READINGS
from components import runs
from components.talk_screen import STYLE, audience_copy, controls, requested, step_index  # noqa: F401 (app.py)
from components.view import View, params_fields, state_fields


# --- which run a step's page makes, and its stored result ---------------------------------------------


@dataclass
class Run:
    kind: str
    fn: Callable
    handle: ModelHandle
    params: Any
    models: dict
    kwargs: dict
    shipped: Any = None  # a folder of results shipped as files (the SAE-V page's feature store), read as is

    def key(self) -> runs.RunKey:
        return runs.run_key(self.kind, self.handle, self.params, self.models, **self.kwargs)


class _Planned(Exception):
    def __init__(self, run: Run) -> None:
        self.run = run


class _Values:
    def __init__(self, values: dict) -> None:
        self.values = values


class PlanPage:
    """What a View's `params_of` and `run` read of a page, filled from a preset's link; `run` records."""

    def __init__(self, view: View, handle: ModelHandle, values: dict[str, str]) -> None:
        self.view, self.handle, self.analysis = view, handle, view.analysis
        self.containers: dict[str, Any] = {}
        # the first screen's containers a view's `run` may draw into (components/view.py Page): none in a plan
        self.headline_choice = self.headline = self.headline_controls = None
        self.form = _Values(self._read(params_fields(self.analysis), values, view.defaults(self)))
        self.state = _Values(self._read(state_fields(self.analysis), values, {}))

    @staticmethod
    def _read(fields, values: dict[str, str], defaults: dict) -> dict:
        out = {}
        for f, owner in fields:
            name = url_name(f)
            if not name:  # the page draws (and its link holds) only the fields with a URL name
                continue
            out[f.name] = (parse_text(f, values[name], owner) if name in values
                           else defaults.get(f.name, field_default(f)))
        return out

    @property
    def values(self) -> dict:
        return {**self.form.values, **self.state.values}

    def control(self, name: str, container: Any = None, *, default: Any = dataclasses.MISSING, **_: Any) -> Any:
        pinned = self.state.values.get(name)
        return default if pinned is None and default is not dataclasses.MISSING else pinned

    def link_value(self, name: str, *, default: Any = dataclasses.MISSING, **_: Any) -> Any:
        return self.control(name, default=default)

    def set_link(self, **_: Any) -> None:
        pass

    def mirror(self) -> None:
        pass

    def run(self, kind: str, fn: Callable, params: Any, *, label: str = "", stop: bool = True,
            handle: ModelHandle | None = None, models: dict | None = None, on_demand: bool = False,
            optional: bool = False, **kwargs: Any) -> Any:
        raise _Planned(Run(kind, fn, handle or self.handle, params, models or {}, kwargs))


def view_of(panel: str) -> View:
    """The View of the page at URL path `panel` (components/views/)."""
    import components.views as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    for cls in _subclasses(View):
        if getattr(cls, "panel", None) and cls.panel and cls().analysis.url_path == panel:
            return cls()
    raise LookupError(f"no view for the page '{panel}'")


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


# Pages whose Params come out of an earlier run (caption correction checks a caption the weak captioner
# writes first): their controls cannot be planned without drawing them, so the step's run is the stored
# entry of that page's kind whose every setting equals the link's, for the same scene and helper model.
MATCHED = {"caption-correction": ("correct", "lm", ("text",))}  # page -> (run kind, helper keyword, not compared)


def matched_run(step: Step, handle: ModelHandle) -> Run:
    from analysis.framework import precompute
    from analysis.framework.settings import url_values

    kind, helper, skip = MATCHED[step.panel]
    preset, state = step.preset_value(), state_of(step)
    want = {k: v for k, v in preset.values().items() if k not in skip}
    cls = view_of(step.panel).analysis.params
    found = []
    for _, entry in precompute.entries():
        if entry.kind != kind or entry.model != preset.model or entry.helpers.get(helper, {}).get("model") != \
                state.get(helper):
            continue
        params = cls.from_json(entry.params)
        have = url_values(params)
        if getattr(params, "scene_seed", None) == state.get("seed") and \
                all(have.get(k, v) == v for k, v in want.items()):
            found.append((entry, params))
    if len(found) != 1:
        raise LookupError(f"{len(found)} stored runs of the page '{step.panel}' match the preset '{step.preset}'")
    entry, params = found[0]
    models = {helper: _handle(state[helper])}
    return Run(kind, precompute._resolve(entry.function), handle, params, models, {})


# The SAE-V page draws its SAE and data pickers before it has Params (which SAEs there are depends on the files
# of this instance), so its plan is written here with the calls the page makes: the feature store shipped with
# the demo SAE for the list and a feature's page, the ranking's and the steering's params for the others
# (tests/page/test_talks.py holds each plan to a stored entry: a page that changes its keys fails it).
def sae_run(step: Step, handle: ModelHandle) -> Run:
    from analysis import sae_v

    analysis = view_of(step.panel).analysis
    values = step.preset_value().values()
    state = PlanPage._read(state_fields(analysis), values, {})
    shipped = {f.name: f for f in sae_v.available_saes(handle) if sae_v.SAE_ROOT in f.parents}
    name = state["sae"]
    if name not in shipped or state["data"]:
        raise LookupError(f"the preset '{step.preset}' reads the SAE '{name}', which is not shipped with this app")
    if state["view"] == "ranking":
        params = sae_v.choose(handle, name, "", sae_v.RankParams, layer=-1, rule=state["rule"], by=state["by"],
                              rules=sae_v.rule_settings(cooccur_threshold=state["thr"]))
        return Run("rank", sae_v.rank, handle, params, {}, {})
    if state["view"] == "feature" and step.preset.startswith("steer") and handle.kind == "vlm":
        features = sae_v.parse_steer([t for t in state["steer"].replace(" ", "").split(",") if t])
        params = sae_v.choose(handle, name, "", sae_v.SteerParams, layer=-1, features=features,
                              image=f"pair:{state['spair']}", mode=state["mode"], positions=state["at"],
                              max_new_tokens=state["tokens"], prompt=state["sprompt"])
        return Run("steer", sae_v.steer, handle, params, {}, {})
    if state["view"] in ("list", "feature"):
        params = sae_v.choose(handle, name, "", layer=-1)
        return Run("store", sae_v.load_store, handle, params, {}, {}, shipped=shipped[name])
    raise LookupError(f"a talk cannot show the SAE-V view '{state['view']}' of the preset '{step.preset}'")


PLANNED = {"sae-features": sae_run}  # pages whose plan is written out (page -> planner)


def planned_run(step: Step, handle: ModelHandle) -> Run:
    """The run the step's page makes for its preset (recorded, not started)."""
    if step.panel in MATCHED:
        return matched_run(step, handle)
    if step.panel in PLANNED:
        return PLANNED[step.panel](step, handle)
    view = view_of(step.panel)
    page = PlanPage(view, handle, step.preset_value().values())
    params = view.params_of(page, page.form.values)
    try:
        view.run(page, params)
    except _Planned as planned:
        return planned.run
    raise LookupError(f"the page '{step.panel}' makes no run for the preset '{step.preset}'")


def stored_result(run: Run) -> Any | None:
    """The run's result as shipped with the app (analysis/precomputed/, or a shipped feature store), or None:
    never computed here."""
    if run.shipped is not None:
        from analysis.sae_v import STORE_FILE

        return _shipped_store(str(run.shipped), (run.shipped / STORE_FILE).stat().st_mtime)
    return runs.precomputed(run.key(), run.handle, run.params, run.models)


@functools.lru_cache(maxsize=4)
def _shipped_store(folder: str, stamp: float) -> Any:
    from analysis import sae_v

    return sae_v.load_store(folder)


def state_of(step: Step) -> dict:
    """The view state the preset pins (layer, head, ...), by field name."""
    preset = step.preset_value()
    return {k: (v() if callable(v) else v) for k, v in preset.state.items()}


@dataclass
class Shown:
    """One step, ready to draw: its result and number, or why it has none."""

    step: Step
    result: Any = None
    number: float | None = None
    text: str = ""
    params: Any = None
    missing: str = ""  # why the step has no stored result


def show_step(step: Step, handle: ModelHandle) -> Shown:
    reading = READINGS[step.reading]
    run = planned_run(step, handle)
    if run.kind not in reading.kinds:
        return Shown(step, missing=f"the reading '{step.reading}' reads {', '.join(reading.kinds)} runs, and this "
                                   f"page makes a '{run.kind}' run")
    result = stored_result(run)
    if result is None:
        return Shown(step, missing="its result is not among the results shipped with the app "
                                   "(python scripts/warm.py stores it)")
    number = reading.value(result, run.params, state_of(step))
    return Shown(step, result, number, reading.text(number), run.params)


# --- the figure that goes with each reading -------------------------------------------------------------


def _figures() -> dict[str, Callable[[Any, Any, dict], Any]]:
    from components.figures import captions as CF, inversion as IF, kv as KF, kv_long as LF, residual as RF
    from components.figures import sae as AF, sharpness as SF

    def heads(state):
        return state.get("layer", 0), state.get("head", 0)

    return {
        "kv.accuracy": lambda r, p, s: KF.retained_heatmap(r, *heads(s)),
        "kv.recall": lambda r, p, s: LF.memory_figure(r),
        "kv.cache_kib": lambda r, p, s: LF.memory_figure(r),
        "inversion.recovered": lambda r, p, s: IF.distance_figure(r),
        "inversion.fewer": lambda r, p, s: IF.rank_figure(r),
        "sharpness.head_weight": lambda r, p, s: SF.size_figure(r, *heads(s), s.get("sink", True)),
        "sharpness.accuracy": lambda r, p, s: SF.accuracy_figure(r),
        "sharpness.adaptive_accuracy": lambda r, p, s: SF.accuracy_figure(r),
        "captions.factuality": lambda r, p, s: CF.metrics_figure(r.before, r.after),
        "captions.factuality_before": lambda r, p, s: CF.metrics_figure(r.before, r.after),
        "captions.coverage": lambda r, p, s: CF.sweep_figure(r),
        "residual.best_head": lambda r, p, s: RF.patch_figure(r, "heads"),
        "residual.first_on_top": lambda r, p, s: RF.lens_curves(r),
        "sae.cross_modal": lambda r, p, s: AF.feature_scatter(r),
        "sae.image_top": lambda r, p, s: AF.top_tokens_figure(r.features[s.get("feature", 0)]),
        "sae.other_scene_rank": lambda r, p, s: AF.score_distribution_figure(r),
        "sae.steer_changed": lambda r, p, s: AF.steering_figure(r),
    }


def figure_of(shown: Shown) -> Any:
    return _figures()[shown.step.reading](shown.result, shown.params, state_of(shown.step))


# --- presenting -----------------------------------------------------------------------------------------

def explore_link(step: Step) -> str:
    """The step's full page, as its preset's permalink."""
    from urllib.parse import urlencode

    return f"/{step.panel}?{urlencode(step.preset_value().query())}"


def _handle(label: str) -> ModelHandle:
    """The step's model from the app's one cache of loaded models (the picker's: a model is never held twice)."""
    from components.model_picker import shared_model

    return shared_model(ModelSpec.parse(label))


def shown(step: Step) -> Shown:
    """The step's stored result and number (one line of why not, when it has none)."""
    from analysis.model_access.models import ModelLoadError

    try:
        handle = _handle(step.preset_value().model)
    except ModelLoadError as exc:
        return Shown(step, missing=f"its model could not be loaded here ({exc})")
    try:
        return show_step(step, handle)
    except LookupError as exc:  # the page or its stored run is not on this instance
        return Shown(step, missing=str(exc))


def present() -> None:
    """The talk the link names, one step per screen (the sidebar and every control hidden)."""
    from analysis.talks import TalkError, load
    from components.hosting import escape_markdown

    st.html(STYLE)
    name = requested() or ""
    try:
        talk = load(name)
    except TalkError as exc:
        if not _present_own(name):
            st.error(f"{exc} No saved talk of this instance has that id either.", icon=":material/slideshow:")
        return
    k = step_index(talk)
    step = talk.steps[k]
    st.caption(f"{escape_markdown(talk.title)} · step {k + 1} of {len(talk.steps)}")
    st.subheader(escape_markdown(step.title), anchor=False)
    with st.spinner("Opening the step's stored result ..."):
        now = shown(step)
    if now.missing:
        st.error(f"This step cannot be shown: {escape_markdown(now.missing)}.", icon=":material/error:")
    else:
        draw(now)
    controls(len(talk.steps), k, explore_link(step))
    audience_copy(talk, k, lambda link: export_html(talk, link))


def _present_own(name: str) -> bool:
    """A talk a speaker made from the gallery (components/own_talk.py), when the link names one."""
    from analysis.hosting.store import StoreError
    from analysis.talks import TalkError
    from components import hosting, own_talk
    from components.share import get_store

    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):  # the store's ids; anything else names no saved talk
        return False
    try:
        store = get_store()
        talk = own_talk.find(store, name)
    except (StoreError, TalkError) as exc:
        st.error(f"The saved talk '{name}' cannot be opened: {hosting.visible_markdown(str(exc))}",
                 icon=":material/error:")
        return True
    if talk is None:
        return False
    own_talk.present(talk, store)
    return True


def draw(now: Shown) -> None:
    from html import escape

    step = now.step
    st.html(f'<p class="talk-narration" data-testid="talk-narration">{escape(step.narration)}</p>')
    left, right = st.columns([1, 2], vertical_alignment="center")
    left.html(f'<div class="talk-number" data-testid="talk-number">{escape(now.text)}</div>'
              f'<div class="talk-label">{escape(READINGS[step.reading].label)}</div>')
    import plotly.graph_objects as go

    fig = go.Figure(figure_of(now))  # a copy: the page's figures are shared between sessions (figures/memo.py)
    fig.update_layout(height=340, margin=dict(l=10, r=10, t=40, b=10))
    right.plotly_chart(fig, key=f"talk_fig_{step.panel}_{step.preset}_{step.reading}")
    preset = step.preset_value()
    with st.expander("The researcher's note"):
        from components.hosting import escape_markdown

        st.markdown(f"**{escape_markdown(preset.title)}** ({escape_markdown(preset.model)}). "
                    f"{escape_markdown(preset.finding)}")


# --- the audience's copy: one offline HTML file, a read-only link and its QR code --------------------------


def export_html(talk: Talk, link: str = "") -> str:
    """Every step of the talk in one self-contained HTML file (analysis/hosting/export.py's report: plotly.js
    inlined, every text escaped): the narration and the page's plain sentence, the number, the figure, and the
    researcher's note folded."""
    from analysis.hosting.export import ReportSection, html_report
    from components import plain

    sections = []
    for k, step in enumerate(talk.steps, 1):
        now = shown(step)
        heading = f"{k}. {step.title}"
        page = plain.sentence(view_of(step.panel).panel)
        if now.missing:
            sections.append(ReportSection(heading, f"{step.narration} This step cannot be shown: {now.missing}."))
            continue
        fig = figure_of(now)
        sections.append(ReportSection(
            heading, f"{step.narration} {page}".strip(), figure=fig,
            table=[{"look at": READINGS[step.reading].label, "number": now.text,
                    "model": step.preset_value().model}],
            detail=step.preset_value().finding))
    return html_report(talk.title, sections, note=talk.summary, url=link)

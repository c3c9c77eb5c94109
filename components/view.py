"""A page is a declaration: `controls() -> params`, one run through the runner, `show(result)`.

Where a panel's page lives:

    views/<page>.py                 the file Streamlit runs: a docstring, one import, one call
                                    (`KvView().render()`)
    components/views/<panel>.py     the panel's `View`: intro, sections, `run`, `show`
    analysis/<panel>/params.py      its Params (`ANALYSIS.params`) and its view state (`ANALYSIS.view_state`):
                                    settings fields (analysis/framework/settings.py) with their page hints
    analysis/<panel>/presets.py     its presets: a Params value and a view-state value each (`ANALYSIS.presets`)
    components/figures/<panel>.py   its figures

`render(view)` runs a page, in order:

1. the title, then the page's first screen is laid out before anything is computed: the active preset's
   finding (one line), the headline's place (filled in step 4), the intro, the preset buttons and the
   settings box (folded under a preset); then the preset bar's work (before the model gate: a preset may
   switch model), the model gate, `view.check_model(page)` (can this model run the panel at all: one line,
   and stop);
2. `params = view.controls(page)`: by default every Params field with a URL name, drawn in
   `view.sections` (a field's `group` metadata names its section; a method family's settings are in
   the group named by the Params attribute that holds them, e.g. "policies"). Fields of a group no
   section names are drawn in one last row, so a new field appears with no edit here; the groups in
   `view.later` are drawn by `show` (`page.draw(container, group)`). Each value starts from the link,
   clamped into its control; the values are mirrored to the URL, and `view.validate` runs on the
   link's own values, so a link out of range gets the CLI's one-line message and the page stops;
3. `result = view.run(page, params)`: one `page.run(kind, fn, params, label=...)`, which is
   `components.runs.cached_run` (stored and shipped results, cost estimate, Run button, progress, Stop,
   queue) with an analysis error shown as one line;
4. `view.headline(page, params, result)`: the finding first (issue #47): the metric cards and the first
   figure that carries the claim, drawn by the framework at the top of the page, under the title, so they
   are inside the first screen at 1024x768; controls that steer that figure (layer, head) go in
   `page.headline_controls`, under it. Then
   `view.show(page, params, result)`: the rest below the settings — figures, tables, "What am I looking at?" notes, share bar. The
   view state's controls (layer, head, metric) are drawn where they belong, with the range this result
   has: `page.control("layer", container, choices=..., format_func=...)`, mirrored to the URL.

A new panel: its package declares `params=`, `view_state=` and `presets=` in its ANALYSIS; its view is
a `View` subclass in components/views/<panel>.py (components/views/kv.py is the model to copy); its
page file is two lines. Everything a link may carry is a field, so the presets check and the
hostile-URL test find every URL name through `url_fields(analysis)`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import Field, dataclass
from typing import Any, Callable, ClassVar

import streamlit as st

from analysis.framework import panels
from analysis.model_access.models import ModelHandle
from analysis.framework.settings import Flat, check_settings, field_default, field_text, labelled, url_name
from components import plain
from components.common import analysis_errors, field_row, metric_row, require_model, set_url_params
from components.params_form import ParamsForm, url_value
from components.presets import preset_bar
from components.runs import cached_run

REST = "\x00rest"  # the last row: fields of a group no section names
HEADLINE_KEY = "headline"  # the headline's container: `.st-key-headline` in the page (the browser battery finds it)


@dataclass(frozen=True)
class Metric:
    """One metric card of a headline (`st.metric`'s arguments)."""

    label: str
    value: str
    delta: str | None = None
    help: str | None = None
    delta_color: str = "normal"


@dataclass(frozen=True)
class Headline:
    """What a page shows first: its metric cards and the first figure that carries the claim (a plotly
    figure, or HTML where the finding is text: the recovered tokens, the corrected caption)."""

    metrics: tuple[Metric, ...] = ()
    figure: Any = None  # a plotly figure
    key: str = ""  # the figure's widget key
    html: str = ""  # or HTML (already escaped by its figure module)
    caption: str = ""  # one line under the metrics (what the figure is of)


@dataclass(frozen=True)
class Section:
    """Where the controls of one field group go, in the order the view lists its sections."""

    group: str | tuple[str, ...] | None  # the fields whose `group` metadata is this, or one of these
    # (None: fields with no group)
    layout: str = "row"  # "row": fixed-width fields that wrap whole on a narrow page; "columns": one column
    # per field, as wide as its `span` metadata; "stack": full width, one under another; "inline": fixed-width
    # fields added to the row the container already is (a `field_row()` holding other controls)
    caption: str = ""
    when: Callable[[dict], bool] | None = None  # drawn only when this holds of the values drawn above it


def params_fields(analysis: panels.Analysis) -> list[tuple[Field, Any]]:
    """(field, owner) of every setting of a panel's Params: its own, then its methods' (`Flat`)."""
    cls = analysis.params
    if cls is None:
        return []
    return cls.flat_fields() if issubclass(cls, Flat) else [(f, cls) for f in labelled(cls)]


def state_fields(analysis: panels.Analysis) -> list[tuple[Field, Any]]:
    """(field, owner) of every control of a panel's view state."""
    cls = analysis.view_state
    return [(f, cls) for f in labelled(cls)] if cls is not None else []


def url_fields(analysis: panels.Analysis) -> dict[str, Field]:
    """{URL name: field} of everything a panel's link may carry: its Params and its view state."""
    return {url_name(f): f for f, _ in params_fields(analysis) + state_fields(analysis) if url_name(f)}


def with_defaults(params: Any, group: str) -> Any:
    """`params` with the fields of `group` at their defaults: a run that does not read them (the KV
    analysis reads no sweep setting) keeps one stored result whatever they are."""
    return dataclasses.replace(params, **{f.name: field_default(f) for f in labelled(params)
                                          if f.metadata.get("group") == group})


class Page:
    """What a view's steps share: the model, the settings' form and the view state's, the sections drawn."""

    def __init__(self, view: "View", handle: ModelHandle) -> None:
        self.view, self.handle = view, handle
        self.analysis = view.analysis
        self.form = ParamsForm(view.prefix)  # the Params' controls
        self.state = ParamsForm(view.prefix)  # the view state's controls
        self.containers: dict[str, Any] = {}  # group -> the container its section drew (`show` may add to it)
        # the first screen's containers (set by `render`): a choice of what the headline shows (residual's view),
        # the headline, the controls that steer its figure
        self.headline_choice = self.headline = self.headline_controls = None
        self.preset = None  # the active preset (components/presets.py), if the URL holds one
        self._groups: dict[str, str] = {}
        for attr, registry in getattr(self.analysis.params, "METHODS", ()):
            self._groups.update({name: attr for name in registry})

    def chapter(self, names: list[str], default: str | None = None, *, on_demand: bool = False) -> str | None:
        """Which one of the page's later sections to draw: one at a time, chosen by a segmented control
        (every section drawn at once meant 15+ plotly figures, 4-12 s of drawing in Chromium on a 2-core
        machine; st.tabs would still draw every tab). `on_demand`: none is drawn until one is chosen (None):
        the page opens on its headline alone (issue #47: drawn in <= 3 s)."""
        key = f"{self.view.prefix}chapter"
        if st.session_state.get(key) not in names:
            st.session_state.pop(key, None)
        first = None if on_demand else default if default in names else names[0]
        chosen = st.segmented_control("Show", names, default=first, key=key, required=not on_demand,
                                      width="content")
        if on_demand and chosen is None:
            st.caption("Choose a section to draw it (one at a time keeps the page quick).")
            return None
        return chosen or names[0]


    @property
    def values(self) -> dict[str, Any]:
        """Every value shown so far, settings and view state, by field name."""
        return {**self.form.values, **self.state.values}

    def group_of(self, f: Field, owner: Any) -> str | None:
        if "group" in f.metadata:
            return f.metadata["group"]
        return self._groups.get(getattr(owner, "name", None)) if owner is not self.analysis.params else None

    def fields(self, group: Any = REST) -> list[tuple[Field, Any]]:
        """The page's settings (fields with a URL name), all of them or those of one group; a group also
        holds the view-state fields that name it (view-state fields of no group are drawn by `show`)."""
        pairs = [(f, o) for f, o in params_fields(self.analysis) if url_name(f)]
        if group is REST:
            return pairs
        state = [(f, o) for f, o in state_fields(self.analysis) if url_name(f) and f.metadata.get("group")]
        return [(f, o) for f, o in pairs + state if self.group_of(f, o) == group]

    def draw(self, container: Any, group: str | tuple | None, *, layout: str = "row", defaults: dict | None = None,
             overrides: dict | None = None) -> dict[str, Any]:
        """Draw the fields of one group (or several) into `container`; {field name: value}."""
        groups = group if isinstance(group, tuple) else (group,)
        fields = [pair for g in groups for pair in self.fields(g)]
        self.containers.update({g: container for g in groups if g is not None})
        return self._draw(container, fields, layout, defaults, overrides)

    def _draw(self, container, fields, layout, defaults, overrides) -> dict[str, Any]:
        if not fields:
            return {}
        if layout == "columns":
            values = {}
            columns = container.columns([f.metadata.get("span", 1) for f, _ in fields])
            for column, pair in zip(columns, fields):
                values |= self._draw_fields(column, [pair], defaults, overrides, "stretch")
            return values
        if layout == "stack":
            return self._draw_fields(container.container(), fields, defaults, overrides, "stretch")
        if layout == "inline":
            return self._draw_fields(container, fields, defaults, overrides, None)
        with container:
            row = field_row()
        return self._draw_fields(row, fields, defaults, overrides, None)

    def _draw_fields(self, container, fields, defaults, overrides, width) -> dict[str, Any]:
        """Each field by its own form (a setting or a view-state control), in order."""
        state = self.analysis.view_state
        kw = {"width": width} if width is not None else {}
        values = {}
        for pair in fields:
            form = self.state if pair[1] is state else self.form
            values |= form.draw(container, [pair], defaults=defaults, overrides=overrides, **kw)
        return values

    def draw_sections(self, sections: tuple[Section, ...], *, defaults: dict | None = None) -> dict[str, Any]:
        """Every setting, section by section, then the fields of a group no section names in one last row;
        each section gets `view.overrides(page, values drawn above it)`."""
        def groups(section: Section) -> tuple:
            return section.group if isinstance(section.group, tuple) else (section.group,)

        placed = {g for s in sections for g in groups(s)} | set(self.view.later)
        values: dict[str, Any] = {}
        for section in (*sections, Section(REST)):
            if section.when is not None and not section.when(values):
                continue
            container = st.container()
            overrides = self.view.overrides(self, values)
            if section.group is REST:
                fields = [(f, o) for f, o in self.fields() if self.group_of(f, o) not in placed]
                values |= self._draw(container, fields, section.layout, defaults, overrides)
                continue
            if section.caption:
                container.caption(section.caption)
            values |= self.draw(container, section.group, layout=section.layout, defaults=defaults,
                                overrides=overrides)
        return values

    def control(self, name: str, container: Any = None, *, default: Any = dataclasses.MISSING,
                **overrides: Any) -> Any:
        """One control of the view state, drawn in `container` and mirrored to the URL; `default` is this
        result's (e.g. the head it found), `overrides` narrow its range or choices to this result's
        (`high=`, `choices=`) or are widget keywords."""
        f = next(f for f, _ in state_fields(self.analysis) if f.name == name)
        overrides.setdefault("width", f.metadata.get("width", "stretch"))
        defaults = {} if default is dataclasses.MISSING else {name: default}
        value = self.state.draw(container if container is not None else st.container(),
                                [(f, self.analysis.view_state)], defaults=defaults, overrides={name: overrides})[name]
        if url_name(f):
            set_url_params(**{url_name(f): field_text(f, value)})
        return value

    def link_value(self, name: str, *, default: Any = dataclasses.MISSING, **overrides: Any) -> Any:
        """What the link gives for a view-state field that has no control of its own here (clamped into
        `overrides`' range; its default, or `default`, when absent or unreadable)."""
        f = next(f for f, _ in state_fields(self.analysis) if f.name == name)
        fallback = field_default(f) if default is dataclasses.MISSING else default
        return url_value(f, self.analysis.view_state, fallback, **overrides)[1]

    def set_link(self, **values: Any) -> None:
        """Write values into the URL by field name (settings or view state): the fields name them there."""
        fields = {f.name: f for f, _ in params_fields(self.analysis) + state_fields(self.analysis)}
        set_url_params(**{url_name(fields[k]): field_text(fields[k], v) for k, v in values.items()
                          if url_name(fields[k])})

    def mirror(self) -> None:
        """Write every value shown into the URL."""
        self.form.mirror()
        self.state.mirror()

    def run(self, kind: str, fn: Callable, params: Any, *, label: str, stop: bool = True,
            handle: ModelHandle | None = None, **kwargs: Any) -> Any:
        """`fn(handle, params)` through the runner (components/runs.py) on the page's model (or `handle`:
        another model, e.g. a captioner); an analysis error is one line (and stops the page, or with
        `stop=False` gives None)."""
        with analysis_errors(stop=stop):
            return cached_run(kind, fn, handle or self.handle, params, label=label, **kwargs)
        return None


class View:
    """A panel's page; subclasses declare what differs (see the module docstring)."""

    panel: ClassVar[str]  # the panel's name in analysis/framework/panels.py's TABLE
    prefix: ClassVar[str]  # the widgets' key prefix ("kv_")
    intro: ClassVar[str] = ""  # the paragraph under the title
    intro_caption: ClassVar[str] = ""  # or a caption there instead
    sections: ClassVar[tuple[Section, ...]] = ()
    later: ClassVar[tuple[str, ...]] = ()  # groups drawn by `show`, not in the controls box
    bad_link_stops: ClassVar[bool] = True  # False: after a link's out-of-range message, run with the nearest values

    @property
    def analysis(self) -> panels.Analysis:
        return panels.load(self.panel)

    def check_model(self, page: Page) -> None:
        """Raise a UserError when the model cannot run this panel at all."""

    def defaults(self, page: Page) -> dict[str, Any]:
        """Page defaults that differ from the fields' (e.g. a shorter context on a large model)."""
        return {}

    def overrides(self, page: Page, values: dict[str, Any]) -> dict[str, dict]:
        """Per field: what this model allows (`choices`, `high`) or widget keywords, given the values drawn
        above (a method's settings greyed out unless it is chosen)."""
        return {}

    def controls(self, page: Page) -> Any:
        page.draw_sections(self.sections, defaults=self.defaults(page))  # in the Settings expander (its own border)
        return self.params_of(page, page.form.values)

    def params_of(self, page: Page, values: dict[str, Any]) -> Any:
        """The Params of these settings' values (by field name; the view state is in `page.state.values`)."""
        cls = self.analysis.params
        if issubclass(cls, Flat):
            return cls.from_flat(values)
        return cls(**{k: v for k, v in values.items() if k in {f.name for f in labelled(cls)}})

    def validate(self, page: Page, params: Any) -> None:
        """The CLI's validation of the link's own values (raises SettingsError)."""
        validate = getattr(params, "validate", None)
        validate() if validate is not None else check_settings(params)

    def run(self, page: Page, params: Any) -> Any:
        raise NotImplementedError

    def headline(self, page: Page, params: Any, result: Any) -> Headline | None:
        """The finding: metric cards and the first figure, drawn at the top of the page (None: none)."""
        return None

    def show(self, page: Page, params: Any, result: Any) -> None:
        raise NotImplementedError

    def render(self) -> None:
        render(self)


# The first screen at 1024x768 holds the title, a preset's finding, the headline's cards and the top of its figure:
# less empty space above and under the title (Streamlit's 6rem), the finding in smaller type, headline cards as wide
# as their text, not a fixed share of the row (five cards took two rows at 1024 px).
FIRST_SCREEN_CSS = """<style>
[data-testid="stMainBlockContainer"] { padding-top: 3rem; }
[data-testid="stMainBlockContainer"] h1 { padding-bottom: 0.25rem; }
.st-key-headline [data-testid="stMetricValue"] { font-size: 1.9rem; }
.st-key-preset_banner [data-testid="stAlert"] p { font-size: 0.9rem; line-height: 1.4; }
</style>"""


def draw_headline(container: Any, headline: Headline) -> None:
    """The headline's metric cards, its caption and its figure, in `container`."""
    if headline.metrics:
        with container:
            row = metric_row()  # no arrow on a zero change ("+0% vs full"), and the cards go into the share bar's record
        for m in headline.metrics:
            words = {"delta_arrow": "off"} if m.delta_color == "off" else {}  # "of 96", "24 entries/head": no change
            row.metric(m.label, m.value, m.delta, help=m.help, delta_color=m.delta_color, width="content", **words)
    if headline.caption:
        container.caption(headline.caption)
    if headline.figure is not None:
        container.plotly_chart(headline.figure, key=headline.key or None)
    if headline.html:
        container.html(headline.html)


def render(view: View) -> None:
    """Run one page (the module docstring's four steps)."""
    analysis = view.analysis
    st.html(FIRST_SCREEN_CSS)
    st.title(analysis.title)
    banner = st.container(key="preset_banner")  # the active preset's finding: the claim the headline shows
    top = st.container(key=HEADLINE_KEY)
    top_choice, top_figure, top_controls = top.container(), top.container(), top.container()
    plain.first(view)  # the plain sentence, then the intro folded as the researcher's note (components/plain.py)
    preset = preset_bar(analysis.url_path, widget_prefix=view.prefix, banner=banner)
    handle = require_model(*analysis.kinds, panel=analysis.title)
    page = Page(view, handle)
    page.headline, page.headline_controls, page.preset = top_figure, top_controls, preset
    page.headline_choice = top_choice
    with analysis_errors():
        view.check_model(page)
    # the settings below the finding; a preset's start folded (its finding is what the audience came for)
    with st.expander("Settings", expanded=preset is None, icon=":material/tune:"):
        params = view.controls(page)
    page.mirror()
    page.form.check(lambda raw: view.validate(page, view.params_of(page, {**page.form.values, **raw})),
                    stop=view.bad_link_stops)
    if analysis.view_state is not None:  # the view state's controls drawn so far: their own ranges
        page.state.check(lambda raw: check_settings(analysis.view_state(**raw)), stop=view.bad_link_stops)
    if not view.bad_link_stops:  # the nearest allowed values run: they pass the same validation first, or nothing runs
        with analysis_errors():
            view.validate(page, params)
    result = view.run(page, params)
    headline = view.headline(page, params, result)
    if headline is not None:
        draw_headline(top_figure, headline)
    view.show(page, params, result)


__all__ = ["Headline", "Metric", "Page", "Section", "View", "draw_headline", "params_fields", "render", "state_fields", "url_fields", "with_defaults"]

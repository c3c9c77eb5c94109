"""The Residual stream page: what each layer already predicts, which activations carry the answer, what
writes it, side by side. Controls: ResidualParams (analysis/residual/params.py); view state: ResidualState
(which section, how the lens grid is coloured). One run per section: `inspect`, `patch`, `side_by_side` or
`pair_sweep`."""
from __future__ import annotations

import dataclasses
import functools

import streamlit as st

from analysis import residual
from analysis.framework.errors import SettingsError
from analysis.framework.settings import parse_text
from analysis.model_access import real_models
from analysis.model_access.models import ModelSpec, ZOO_DIR, all_zoo_models, load_model, zoo_models
from analysis.residual import translators
from components.common import URL_TEXT_MAX, analysis_errors, explain, metric_row, stays_local, table
from components.hosting import escape_markdown
from components.figures import residual as F
from components.share import share_bar
from components.params_form import OUT_OF_RANGE
from components.view import Headline, Metric, Page, Section, View, state_fields


@st.cache_resource(max_entries=2, show_spinner="Loading the other model ...")
def other_model(label: str):
    return load_model(ModelSpec.parse(label))


def _own(values: dict) -> bool:
    return values.get("pair") == residual.OWN


def _other(page: Page, params: residual.ResidualParams) -> dict:
    """The other model of a side-by-side of two models, as the runner's `models` (none for two prompts)."""
    if params.side != "model":
        return {}
    linked = _refused(page).get("other_model")
    if linked:  # the page offers only models that share this vocabulary
        st.error(f"The link's other model, {escape_markdown(linked)}, cannot be read with "
                 f"{escape_markdown(page.handle.spec.label)}'s tokens "
                 "(different vocabularies, or not a zoo model here): pick one above.", icon=":material/link_off:")
        st.stop()
    if not params.other_model:
        st.info(f"No other model here shares {escape_markdown(page.handle.spec.label)}'s vocabulary, so there is none to compare "
                "with; compare two prompts instead.")
        st.stop()
    with analysis_errors(prefix="Could not load the other model: "):
        return {"other": other_model(params.other_model)}


def _weights_here(page: Page) -> None:
    """The lens and side-by-side views read the model's weights here: one line for a model on NDIF."""
    why = residual.weights_elsewhere(page.handle)
    if why:
        st.info(why, icon=":material/cloud_off:")
        st.stop()


@functools.lru_cache(maxsize=8)
def _zoo_vocabulary(name: str) -> frozenset | None:
    """A zoo model's vocabulary, from its tokenizer alone (None: not on disk yet, e.g. an unconverted real model)."""
    from transformers import AutoTokenizer

    folder = ZOO_DIR / name if name in zoo_models() else real_models.folder(name)
    if name not in zoo_models() and not real_models.is_built(name):
        return None
    return frozenset(AutoTokenizer.from_pretrained(str(folder)).get_vocab().items())


def _others(page: Page) -> list[str]:
    """The zoo models to compare with: every one but this whose vocabulary is this model's (the side by side
    reads the same tokens on both; another vocabulary can never match)."""
    mine = frozenset(page.handle.tokenizer.get_vocab().items())
    return [f"zoo:{n}" for n in all_zoo_models()
            if f"zoo:{n}" != page.handle.spec.label and _zoo_vocabulary(n) == mine] or [""]


def _others_or_linked(page: Page) -> list[str]:
    """The compatible models, and a link's own zoo model (a preset pins one): kept in the link, refused with
    one line only where the side by side of two models would read it (`_other`)."""
    linked = st.query_params.get("other_model")
    offered = [o for o in _others(page) if o]
    extra = [linked] if linked and linked.startswith("zoo:") and linked not in offered else []
    return offered + extra or [""]


def _refused(page: Page) -> dict[str, str]:
    """What the link asked for that this model is not offered (the other model, the lens), read before the page
    mirrors its controls into the URL: the page only ever writes offered values, so these came with a link."""
    if not hasattr(page, "_rs_refused"):
        offered = {"other_model": _others(page), "lens": residual.LENSES.names() if _has_tuned_lens(page) else ["logit"]}
        asked = {name: st.query_params.get(name) for name in offered}
        page._rs_refused = {k: v for k, v in asked.items() if v and v not in offered[k]}
    return page._rs_refused


def _has_tuned_lens(page: Page) -> bool:
    if not hasattr(page, "_rs_tuned"):
        if residual.weights_elsewhere(page.handle):  # a remote (NDIF) model's weights are not here to probe
            page._rs_tuned = False
            return False
        try:
            page._rs_tuned = bool(translators.for_model(page.handle))
        except residual.ResidualError:
            page._rs_tuned = False
    return page._rs_tuned


def _own_pair_typed(page: Page, params: residual.ResidualParams) -> residual.ResidualParams:
    """An own pair as typed on the page (the link's copy lags one run behind the boxes); until both prompts are
    there, one line saying so and nothing runs (not an error: nothing was typed yet)."""
    shown = page.form.values
    if shown.get("pair") != residual.OWN:
        return params
    prompt, corrupt = str(shown.get("prompt", "")), str(shown.get("corrupt", ""))
    if not (prompt.strip() and corrupt.strip()):
        st.info("Type a clean prompt and a corrupted one above (the same number of tokens); the views appear "
                "once both are there.", icon=":material/edit:")
        st.stop()
    return dataclasses.replace(params, pair=residual.OWN, prompt=prompt, corrupt=corrupt)


class ResidualView(View):
    panel = "residual"
    prefix = "rs_"
    intro = ("What each layer of the loaded model already predicts (the **logit lens**, and the **tuned lens** of "
             "Belrose et al. 2023), which activations carry the answer (**activation patching**, exact and its "
             "gradient estimate, **attribution patching**), what writes it straight into the output (**direct "
             "logit attribution**), and two prompts or two models **side by side**.")
    sections = (
        Section("pair", layout="columns"),
        Section("own", layout="stack", when=_own),
        Section("tokens"),
        Section("patching"),
        Section("side"),
        Section("generate"),
    )

    def defaults(self, page: Page) -> dict:
        return {"other_model": _others(page)[0]}

    def overrides(self, page: Page, values: dict) -> dict[str, dict]:
        """The pair's choices and the other model's are this model's: offered here, not in the field."""
        pairs = residual.pairs_for(page.handle)
        labels = {p.name: p.short for p in pairs} | {"": f"{pairs[0].short} (default)",
                                                      residual.OWN: "Your own two prompts"}
        _refused(page)
        lens = {} if _has_tuned_lens(page) else {"lens": {"choices": ["logit"]}}
        return {"pair": {"choices": ["", *[p.name for p in pairs], residual.OWN],
                         "format_func": lambda n: labels.get(n, n)},
                "other_model": {"choices": _others_or_linked(page), "widget": "select"}} | lens

    def validate(self, page: Page, params: residual.ResidualParams) -> None:
        residual.validate_params(_own_pair_typed(page, params))

    def run(self, page: Page, params: residual.ResidualParams):
        section = page.control("view", page.headline_choice, width="content")
        if section == "patching":
            return page.run("patch", residual.patch, params, label="Patching every cell")
        if section == "side":
            _weights_here(page)
            return page.run("side", residual.side_by_side, params, label="Reading both sides",
                            models=_other(page, params))
        if section == "pairs":
            return page.run("pairs", residual.pair_sweep, params, label="Patching every offered pair")
        if section == "generate":
            stays_local(page.handle, "Generating text")
            return page.run("generate", residual.generate, params, label="Generating and reading every layer")
        _weights_here(page)
        if not _has_tuned_lens(page):
            none = f"no tuned lens exists for {escape_markdown(page.handle.spec.label)} yet"
            if _refused(page).get("lens") == "tuned":
                st.warning(f"The link asks for the tuned lens, but {none}: this is the logit lens.")
            else:
                st.caption(f"Lens: {none}, so the logit lens is the one offered (train one under *Logit and tuned "
                           "lens* below).")
        return page.run("inspect", residual.inspect, params, label="Reading every layer")

    def headline(self, page: Page, params: residual.ResidualParams, result) -> Headline:
        if isinstance(result, residual.Inspection):
            return lens_headline(page, result)
        if isinstance(result, residual.Patching):
            return patching_headline(params, result)
        if isinstance(result, residual.SideBySide):
            return Headline(tuple(Metric(label, repr(side.prediction), f"P(target) {side.lens.target_prob[-1][-1]:.2f}",
                                         delta_color="off") for side, label in ((result.a, result.a_label),
                                                                                (result.b, result.b_label))),
                            F.side_figure(result), key="rs_fig_side")
        if isinstance(result, residual.Generation):
            return generation_headline(page, result)
        return Headline(figure=F.sweep_figure(result), key="rs_fig_sweep")

    def show(self, page: Page, params: residual.ResidualParams, result) -> None:
        if isinstance(result, residual.Inspection):
            show_lens(page, params, result)
        elif isinstance(result, residual.Patching):
            show_patching(page, params, result)
        elif isinstance(result, residual.SideBySide):
            show_side(page, params, result)
        elif isinstance(result, residual.Generation):
            show_generation(page, params, result)
        else:
            show_pairs(page, params, result)


def lens_headline(page: Page, seen: residual.Inspection) -> Headline:
    ranks = [r[-1] for r in seen.lens.target_rank]
    first = next((i for i, r in enumerate(ranks) if r == 0), None)
    stays = next((i for i in range(len(ranks)) if all(r == 0 for r in ranks[i:])), None)
    metrics = (Metric("The model predicts", repr(seen.prediction)),
               Metric("Target", repr(seen.target), f"P = {seen.lens.target_prob[-1][-1]:.2f} at the last layer",
                      delta_color="off"),
               Metric("Target on top from state", f"{stays} on" if stays is not None else
                      f"— the model says {seen.prediction!r}", "never on top" if first is None else
                      f"first on top at state {first}", delta_color="off"))
    colour = page.control("colour", page.headline_controls, width="content")
    page.grid = F.lens_figure(seen, colour)
    return Headline(metrics, page.grid, key="rs_fig_lens")


def show_lens(page: Page, params: residual.ResidualParams, seen: residual.Inspection) -> None:
    with page.headline_controls:
        # the check that the lens's last layer is the model's output, right under the grid: as a fourth headline
        # card it took a second row at 1024 px and pushed the grid off the first screen (real-tuned preset)
        metric_row().metric("Last layer vs the model's logits", f"{seen.lens.last_gap:.1e}", "max |difference|",
                            delta_color="off", width="content")
        explain("Each row is the residual stream after one layer (0: the embeddings), each column a token of the "
                "prompt; a cell shows the token the lens reads there as the most likely next token. The logit lens "
                "applies the model's own final norm and unembedding to every layer, so its last row is exactly the "
                "model's output; the tuned lens first maps each layer with a trained affine translator (Belrose et "
                "al. 2023). Hover a cell for its top tokens, the target's probability and rank, and the KL "
                "divergence from the final distribution (nats: 0 means identical).")
    grid = page.grid
    st.plotly_chart(F.lens_curves(seen), key="rs_fig_curves")
    table(F.last_position_rows(seen))
    dla = F.dla_figure(seen)
    st.plotly_chart(dla, key="rs_fig_dla")
    explain("Direct logit attribution: the last position's residual stream is the embeddings plus what every "
            "attention layer and MLP wrote; with the final norm's scale frozen, each part's contribution to "
            "logit(target) − logit(foil) adds up exactly to the model's own value (in the title). A head writes "
            "its slice of the attention output. Direct effects only: what a layer does through later layers is "
            "not counted here — patching measures that.")
    share_bar("residual", title=f"Residual stream ({residual.LENSES.label(params.lens)}) on {page.handle.spec.label}",
              params=params.to_dict(), result=seen, model=page.handle.spec.label,
              figures={"Lens": grid, "Logit attribution": dla}, tables={"last position": F.last_position_rows(seen)})
    show_graph(page, seen)
    show_lens_pair(page, params, seen)


FAR_NATS = 5.0  # a state whose mean KL to the output is above this: the logit lens there says little about it


def show_lens_pair(page: Page, params: residual.ResidualParams, seen: residual.Inspection) -> None:
    """Both lenses: their held-out distance to the output per state and, on request, side by side on this prompt;
    where this model has no tuned lens, the offer to train one (through the runner: estimate, progress, Stop)."""
    st.subheader("Logit and tuned lens")
    if residual.weights_elsewhere(page.handle):
        st.caption("The tuned lens needs the model's weights here; they are on NDIF.")
        return
    held = _held_out(page)
    if held is None and params.lens == "logit":  # no lens yet: this prompt's own distances
        held = {"logit": [sum(row) / len(row) for row in seen.lens.kl], "where": "over this prompt's positions"}
    if held is not None:
        _far_warning(held["logit"], held["where"])
    if not _has_tuned_lens(page):
        _offer_training(page)
        return
    if held is not None and held.get("tuned"):
        table(F.held_out_rows(held), where=st.expander(f"Both lenses on held-out text ({held['tokens']:,} tokens): "
                                                       "mean KL to the output per state"))
    if st.toggle("Both lenses side by side on this prompt", key="rs_lens_pair",
                 help="The other lens's grid beside this one (one more read of every layer)."):
        other = dataclasses.replace(params, lens="tuned" if params.lens == "logit" else "logit")
        got = page.run("inspect", residual.inspect, other, label="Reading every layer with the other lens", stop=False)
        if got is not None:
            c0, c1 = st.columns(2)
            for col, one in ((c0, seen), (c1, got)):
                col.markdown(f"**{residual.LENSES.label(one.lens.lens)}**")
                col.plotly_chart(F.lens_figure(one, "kl"), key=f"rs_fig_pair_{one.lens.lens}")


def _held_out(page: Page) -> dict | None:
    """The stored lens's held-out report (the first held-out set): per-state KL of both lenses."""
    if not _has_tuned_lens(page):
        return None
    sets = translators.for_model(page.handle).meta.get("held_out_kl_nats") or {}
    if not sets:
        return None
    label, m = next(iter(sets.items()))
    return {"logit": m["logit"], "tuned": m["tuned"], "closer": m.get("tuned_closer_share"), "tokens": m["tokens"],
            "where": f"on held-out text ({escape_markdown(label)}, {m['tokens']:,} tokens)"}


def _far_warning(logit: list[float], where: str) -> None:
    far = [i for i, v in enumerate(logit[:-1]) if v > FAR_NATS]
    if not far:
        return
    low, high = min(logit[i] for i in far), max(logit[i] for i in far)
    span = f"state {far[0]}" if len(far) == 1 else f"{len(far)} states between {far[0]} and {far[-1]}"
    kl = f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}–{high:.1f}"
    st.warning(f"The logit lens is far from the model's output at {span}: mean KL {kl} nats {where} "
               f"(above {FAR_NATS:g}). There its top tokens say little about what the model will say; the tuned "
               "lens reads those states through a translator trained to match the output.", icon=":material/warning:")


def _offer_training(page: Page) -> None:
    label = escape_markdown(page.handle.spec.label)
    st.info(f"No tuned lens is trained for {label} yet. **Train a tuned lens** here: the tuned-lens recipe (Belrose "
            "et al. 2023: an affine translator per layer from zero, SGD with Nesterov momentum, weight decay, gradient "
            "clipping) on the model's own samples, with the step size picked for this model; it is stored under the "
            "model's weights hash and offered as *Tuned lens* from then on.", icon=":material/model_training:")
    # behind a switch: a page that opens on this model shows no Run button (its first view is all precomputed)
    if not st.toggle("Train a tuned lens for this model", key="rs_train_lens_on"):
        return
    trained = page.run("train_lens", residual.train_lens, residual.ResidualParams(), label="Training a tuned lens",
                       on_demand=True, stop=False)
    if trained is None:
        return
    st.success(f"Trained in {trained.seconds:.0f} s (step size {trained.lr:g}) and stored in "
               f"{escape_markdown(trained.folder)}: pick *Tuned lens* above.", icon=":material/check_circle:")
    table(F.held_out_rows({"logit": trained.logit_kl, "tuned": trained.tuned_kl, "closer": trained.closer}))
    page.__dict__.pop("_rs_tuned", None)
    page.__dict__.pop("_rs_refused", None)


def show_graph(page: Page, seen: residual.Inspection) -> None:
    """The contribution graph of the lens's prompt (Ferrando & Voita 2024), on request: about one more forward."""
    st.subheader("Contribution graph")
    if not st.toggle("Build the contribution graph of this prompt", key="rs_graph_on",
                     help="Which attention edges and MLPs carry the prediction, from one forward (Ferrando & Voita "
                          "2024, *Information flow routes*)."):
        return
    c0, c1 = st.columns(2)
    tau = c0.slider("Threshold τ", 0.0, 0.5, 0.04, 0.01, key="rs_graph_tau",
                    help="Edges whose importance exceeds τ are kept, from the output node down.")
    last = len(seen.tokens) - 1
    position = c1.number_input("From position", 0, last, last, key="rs_graph_position",
                               help="The token whose prediction the graph explains (default: the last).")
    from analysis.residual.contributions import contribution_graph

    key = (page.handle.spec.label, seen.prompt, float(tau), int(position))
    cached = st.session_state.get("rs_graph_result")
    if cached is None or cached[0] != key:
        cached = None
        with analysis_errors(stop=False), st.spinner("Decomposing every layer's attention and MLP ..."):
            cached = (key, contribution_graph(page.handle, seen.prompt, threshold=float(tau), position=int(position)))
        st.session_state["rs_graph_result"] = cached
        if cached is None:
            return
    graph = cached[1]
    st.plotly_chart(F.contribution_graph_figure(graph), key="rs_fig_graph")
    st.dataframe(F.graph_path_rows(graph), hide_index=True)
    explain("Every block adds to the residual stream, so what it writes is a sum of parts: attention's parts are "
            "what each head moves from each earlier position (attention weight × value through the output "
            "projection), the MLP's is its output; the residual itself is one more part. A part's importance is "
            "its proximity to the sum, max(0, ‖y‖₁ − ‖y − part‖₁), as a share of all parts' (Ferrando & Voita "
            "2024). From the output node (star) down, edges above τ are kept. A path's strength is the product of "
            "its importances; the table lists each position's strongest path to the output.")


def patching_headline(params: residual.ResidualParams, result: residual.Patching) -> Headline:
    first = params.components[0] if params.components else None
    return Headline((Metric("Clean: logit(target) − logit(foil)", f"{result.clean_diff:+.2f}"),
                     Metric("Corrupted", f"{result.corrupt_diff:+.2f}"),
                     Metric("Changed positions", ", ".join(map(str, result.changed)))),
                    F.patch_figure(result, first) if first else None, key=f"rs_fig_patch_{first}")


def show_patching(page: Page, params: residual.ResidualParams, result: residual.Patching) -> None:
    page.headline_controls.caption(
        f"Clean: {escape_markdown(repr(result.pair.clean))} · corrupted: {escape_markdown(repr(result.pair.corrupt))}"
        + (f" · the answer enters at {escape_markdown(result.pair.where)}" if result.pair.where else "") + " · "
        + ", ".join(f"{residual.METHODS.label(name)} took {seconds:.1f} s" for name, seconds in result.seconds.items()))
    figures, tables = {}, {}
    for i, name in enumerate(params.components):
        fig = F.patch_figure(result, name)
        figures[residual.COMPONENTS.label(name)] = fig
        if i:  # the first is the headline's
            st.plotly_chart(fig, key=f"rs_fig_patch_{name}")
        tables[name] = F.peak_rows(result, name)
        table(tables[name], where=page.headline_controls if not i else None)
    explain("The corrupted prompt is run with one activation replaced by the clean prompt's (one cell at a "
            "time). Colour: the share of the clean − corrupted logit difference that this alone restores (1: "
            "all of it; 0: nothing; negative: it pushes the other way). Residual: the whole stream entering a "
            "layer at one position. Heads and outputs: a head's or a layer's output at every position. "
            "Attribution patching estimates every cell at once from the corrupted run's gradient.")
    if {"exact", "attribution"} <= set(params.methods):
        st.plotly_chart(F.agreement_figure(result), key="rs_fig_agreement")
        explain("Each dot is one cell: exact share (x) against the gradient estimate (y). On the diagonal the cheap "
                "estimate is right; it drifts where a patch changes the run nonlinearly (large cells, saturated "
                "softmaxes, early layers whose effect passes through many others).")
    show_false_negatives(page, params, result)
    pair = "your own two prompts" if result.pair.name == residual.OWN else result.pair.short  # not "own"
    share_bar("residual", title=f"Activation patching on {page.handle.spec.label}: {pair}",
              params=params.to_dict(), result=result, model=page.handle.spec.label, figures=figures, tables=tables)


def show_false_negatives(page: Page, params: residual.ResidualParams, result: residual.Patching) -> None:
    """AtP*'s point (Kramár et al. 2024): which components an estimate misses, on this pair and on every pair."""
    if not result.false_negatives:
        return
    st.markdown("**What the estimates miss** — cells whose exact effect is in the top 5 % and whose estimate is not")
    table(F.false_negative_rows(result.false_negatives))
    explain("AtP* recomputes a head's attention softmax exactly when its queries or keys are patched (the QK fix) "
            "and averages estimates with the gradient through each layer dropped in turn (GradDrop), to catch "
            "effects that cancel. Queries and keys run through an attention function of this app (eager softmax), "
            "on a local model or nnsight; a model on NDIF has not been checked with it.")
    if "atp*" in params.methods:
        sweep = page.run("atp", residual.atp_sweep, params, label="Exact, attribution and AtP* on every offered pair",
                         on_demand=True, stop=False)
        if sweep is not None:
            st.caption(f"Over {len(sweep.pairs)} offered pairs (summed; skipped: "
                       f"{escape_markdown(', '.join(sweep.skipped) or 'none')})")
            table(F.false_negative_rows(sweep.totals))


def show_side(page: Page, params: residual.ResidualParams, result: residual.SideBySide) -> None:
    fig = F.side_figure(result)
    page.headline_controls.caption(":material/info: **What am I looking at?** ""Both sides read with the same lens and scored on the same target (and foil), at their last position; "
            "grey bars are the difference (left side minus right). Two prompts on one model show where the "
            "corrupted prompt's prediction parts from the clean one; two models on one prompt show in which "
            "layers they differ.")
    c0, c1 = st.columns(2)
    c0.plotly_chart(F.lens_figure(result.a, "target_prob"), key="rs_fig_side_a")
    c1.plotly_chart(F.lens_figure(result.b, "target_prob"), key="rs_fig_side_b")
    share_bar("residual", title=f"Side by side: {result.a_label} vs {result.b_label}", params=params.to_dict(),
              result=result, model=page.handle.spec.label, figures={"Side by side": fig})


def show_pairs(page: Page, params: residual.ResidualParams, result: residual.PairSweep) -> None:
    fig = F.sweep_figure(result)
    page.headline_controls.caption(":material/info: **What am I looking at?** ""Residual-stream patching of every pair offered for this model, averaged per layer at three kinds of "
            "position: the subject's last token (the token the two prompts differ in), the last token, and the "
            "rest. The known pattern of factual recall (Meng et al. 2022): the subject's token carries the fact "
            "through the early and middle layers, then the last token takes it over.")
    rows = [{"pair": r.name, "clean diff": round(r.clean_diff, 2), "corrupted diff": round(r.corrupt_diff, 2),
             "subject's last token": r.subject, "r (exact vs attribution, this pair)": round(r.correlation, 3)}
            for r in result.runs]
    table(rows)
    if result.skipped:
        st.caption(f"Skipped (the two prompts differ in length here): {', '.join(result.skipped)}")
    share_bar("residual", title=f"Residual patching over {len(result.runs)} pairs on {page.handle.spec.label}",
              params=params.to_dict(), result=result, model=page.handle.spec.label, figures={"All pairs": fig},
              tables={"pairs": rows})


def generation_headline(page: Page, result: residual.Generation) -> Headline:
    main = result.strips[-1]
    definition = page.control("commit", page.headline_controls, width="content")
    page.strip_figure = F.strip_figure(result, definition)
    metrics = (Metric("Generated tokens", str(len(result.tokens)), "ended by the model" if result.ended else "the limit",
                      delta_color="off"),
               Metric("Mean P(token)", f"{sum(result.prob) / max(1, len(result.prob)):.2f}"),
               Metric("States read over the whole vocabulary", f"{main.full_rows} of {main.rows}",
                      "every state" if main.full_rows == main.rows else "the rest ruled out by a candidate token",
                      delta_color="off"))
    return Headline(metrics, page.strip_figure, key="rs_fig_strip",
                    caption=f"{escape_markdown(result.prompt)} **→** {escape_markdown(result.text)}")


def show_generation(page: Page, params: residual.ResidualParams, result: residual.Generation) -> None:
    fig = page.strip_figure
    explain("Each column is a generated token, each row a state of the residual stream (state s: after s layers; "
            "0: the embeddings, the last: the model's output) at the position that produced it. Dark: the lens "
            "reads this token as the most likely next one there. Markers: the commitment state, either the first "
            "state where the token is on top, or the state from which it stays on top through the output (a sampled "
            "token that is not the model's own top-1 never stays). The states are the generation's own; no second "
            "forward is run.")
    rows = F.strip_rows(result)
    table(rows)
    result, tables = show_branching(page, params, result)
    link = params.to_dict() | ({"branch_at": result.branch.at, "branch_token": result.branch.token_id}
                               if result.branch is not None else {})
    share_bar("residual", title=f"Commitment strip on {page.handle.spec.label}", params=link,
              result=result, model=page.handle.spec.label, figures={"Commitment strip": fig},
              tables={"generated tokens": rows} | tables)


def _branch_link(page: Page, generated: int) -> tuple[int, int]:
    """The branch the link asks for, read before the controls clamp it; a bad one is the link-settings message
    and no branch."""
    fields = {f.name: f for f, _ in state_fields(page.analysis)}
    raw = {name: st.query_params.get(name) for name in ("branch_at", "branch_token")}
    if raw["branch_at"] in (None, "-1"):
        return -1, -1
    with analysis_errors(prefix=OUT_OF_RANGE, stop=False):
        try:
            at, token = (parse_text(fields[name], str(raw[name] or "")[:URL_TEXT_MAX], residual.ResidualState)
                         for name in raw)
        except (TypeError, ValueError, OverflowError):
            raise SettingsError(f"a branch is two whole numbers, branch_at and branch_token; got "
                                f"{raw['branch_at']!r} and {raw['branch_token']!r}.") from None
        residual.check_branch(page.handle, at, token, generated)
        return at, token
    return -1, -1


def show_branching(page: Page, params: residual.ResidualParams,
                   result: residual.Generation) -> tuple[residual.Generation, dict]:
    """Every generated token, and a branch: another of the model's top tokens at one of them, the text
    regenerated from there beside the generated one (analysis/residual/branching.py)."""
    st.subheader("Branch")
    if not result.token_ids or not result.alternative_ids:
        return result, {}
    at, token = _branch_choice(page, result)
    if at < 0 or token == result.token_ids[at]:
        st.html(F.continuations_html(result))
        explain("Pick a generated token to see the model's other top choices there; taking one regenerates the "
                "text from it with the same decoding (greedy, or sampled from the same seed).")
        return result, {}
    branched = page.run("branch", residual.branch, params, label="Regenerating from the branch", stop=False,
                        optional=True, at=at, token=token, main=tuple(result.token_ids))
    if branched is None:
        return result, {}
    result = dataclasses.replace(result, branch=branched)
    where = ("the same text" if branched.first_difference is None
             else f"first difference at token {branched.at + branched.first_difference}")
    row = metric_row()
    row.metric(f"P(branch) from token {branched.at}", f"{branched.path_prob:.3g}", where, delta_color="off",
               width="content")
    row.metric(f"P(generated text) from token {branched.at}", f"{branched.main_path_prob:.3g}", delta_color="off",
               width="content")
    st.html(F.continuations_html(result, branched))
    n, main_p, branch_p = branched.over_common_length()
    if len(branched.main_ids) != len(branched.ids):
        st.caption(f"The two texts differ in length ({len(branched.main_ids)} and {len(branched.ids)} tokens from the "
                   f"branch point), so their products do not compare; over the first {n} tokens of each: generated "
                   f"{main_p:.3g}, branch {branch_p:.3g}.")
    rows = F.branch_rows(branched)
    table(rows)
    explain("Each text's probability is the product of the model's own probabilities (temperature 1) of its "
            "tokens from the branch point on, read from one plain forward; the first difference is outlined. The "
            "branch continues for the rest of the same token budget.")
    return result, {"branch": rows}


def _branch_choice(page: Page, result: residual.Generation) -> tuple[int, int]:
    """The branch point (-1: none) and the token taken there, from the link first, then the two controls:
    the generated tokens, and the model's top tokens at the chosen one (the generated token among them)."""
    n = len(result.token_ids)
    at, token = _branch_link(page, n)

    def forget_token() -> None:  # another position: its own choice, not the link's token from the last one
        st.query_params.pop("branch_token", None)

    c0, c1 = st.columns([1, 3])
    at = page.control(
        "branch_at", c0, default=at, choices=[-1, *range(n)], widget="select", on_change=forget_token,
        format_func=lambda k: "no branch" if k < 0 else f"{k}: {F.visible(result.tokens[k])!r}")
    if at < 0:
        page.set_link(branch_token=-1)
        return -1, -1
    mine = result.token_ids[at]
    choices = list(result.alternative_ids[at])
    extra = [t for t in (mine, token) if t >= 0 and t not in choices]
    probs = dict(zip(result.alternative_ids[at], result.alternative_probs[at])) | ({mine: result.prob[at]})
    names = dict(zip(result.alternative_ids[at], result.alternative_tokens[at]))

    def label(t: int) -> str:
        name = F.visible(names.get(t) or page.handle.tokenizer.decode([t]))
        return f"{name!r}" + (f" · {probs[t]:.3g}" if t in probs else "") + (" (generated)" if t == mine else "")

    return at, page.control("branch_token", c1, default=token if token >= 0 else mine, choices=choices + extra,
                            widget="radio", format_func=label, key=f"branch_token_{at}")

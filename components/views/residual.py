"""The Residual stream page: what each layer already predicts, which activations carry the answer, what
writes it, side by side. Controls: ResidualParams (analysis/residual/params.py); view state: ResidualState
(which section, how the lens grid is coloured). One run per section: `inspect`, `patch`, `side_by_side` or
`pair_sweep`."""
from __future__ import annotations

import streamlit as st

from analysis import residual
from analysis.model_access.models import ModelSpec, all_zoo_models, load_model
from components.common import table, analysis_errors, explain
from components.figures import residual as F
from components.share import share_bar
from components.view import Headline, Metric, Page, Section, View


@st.cache_resource(max_entries=2, show_spinner="Loading the other model ...")
def other_model(label: str):
    return load_model(ModelSpec.parse(label))


def _own(values: dict) -> bool:
    return values.get("pair") == residual.OWN


def _other(params: residual.ResidualParams) -> dict:
    """The other model of a side-by-side of two models, as the runner's `models` (none for two prompts)."""
    if params.side != "model":
        return {}
    if not params.other_model:
        st.info("Pick the other model to compare with.")
        st.stop()
    with analysis_errors(prefix="Could not load the other model: "):
        return {"other": other_model(params.other_model)}


def _weights_here(page: Page) -> None:
    """The lens and side-by-side views read the model's weights here: one line for a model on NDIF."""
    why = residual.weights_elsewhere(page.handle)
    if why:
        st.info(why, icon=":material/cloud_off:")
        st.stop()


def _others(page: Page) -> list[str]:
    """The zoo models to compare with (every one but this)."""
    return [f"zoo:{n}" for n in all_zoo_models() if f"zoo:{n}" != page.handle.spec.label] or [""]


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
    )

    def defaults(self, page: Page) -> dict:
        return {"other_model": _others(page)[0]}

    def overrides(self, page: Page, values: dict) -> dict[str, dict]:
        """The pair's choices and the other model's are this model's: offered here, not in the field."""
        pairs = residual.pairs_for(page.handle)
        labels = {p.name: p.short for p in pairs} | {"": f"{pairs[0].short} (default)",
                                                      residual.OWN: "Your own two prompts"}
        return {"pair": {"choices": ["", *[p.name for p in pairs], residual.OWN],
                         "format_func": lambda n: labels.get(n, n)},
                "other_model": {"choices": _others(page), "widget": "select"}}

    def validate(self, page: Page, params: residual.ResidualParams) -> None:
        residual.validate_params(params)

    def run(self, page: Page, params: residual.ResidualParams):
        section = page.control("view", page.headline_choice, width="content")
        if section == "patching":
            return page.run("patch", residual.patch, params, label="Patching every cell")
        if section == "side":
            _weights_here(page)
            return page.run("side", residual.side_by_side, params, label="Reading both sides",
                            models=_other(params))
        if section == "pairs":
            return page.run("pairs", residual.pair_sweep, params, label="Patching every offered pair")
        _weights_here(page)
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
        return Headline(figure=F.sweep_figure(result), key="rs_fig_sweep")

    def show(self, page: Page, params: residual.ResidualParams, result) -> None:
        if isinstance(result, residual.Inspection):
            show_lens(page, params, result)
        elif isinstance(result, residual.Patching):
            show_patching(page, params, result)
        elif isinstance(result, residual.SideBySide):
            show_side(page, params, result)
        else:
            show_pairs(page, params, result)


def lens_headline(page: Page, seen: residual.Inspection) -> Headline:
    first = next((i for i, r in enumerate(seen.lens.target_rank) if r[-1] == 0), None)
    metrics = (Metric("The model predicts", repr(seen.prediction)),
               Metric("Target", repr(seen.target), f"P = {seen.lens.target_prob[-1][-1]:.2f} at the last layer",
                      delta_color="off"),
               Metric("Target first on top at layer", "never" if first is None else str(first)),
               Metric("Last layer vs the model's logits", f"{seen.lens.last_gap:.1e}", "max |difference|",
                      delta_color="off"))
    colour = page.control("colour", page.headline_controls, width="content")
    page.grid = F.lens_figure(seen, colour)
    return Headline(metrics, page.grid, key="rs_fig_lens")


def show_lens(page: Page, params: residual.ResidualParams, seen: residual.Inspection) -> None:
    with page.headline_controls:
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


def patching_headline(params: residual.ResidualParams, result: residual.Patching) -> Headline:
    first = params.components[0] if params.components else None
    return Headline((Metric("Clean: logit(target) − logit(foil)", f"{result.clean_diff:+.2f}"),
                     Metric("Corrupted", f"{result.corrupt_diff:+.2f}"),
                     Metric("Changed positions", ", ".join(map(str, result.changed)))),
                    F.patch_figure(result, first) if first else None, key=f"rs_fig_patch_{first}")


def show_patching(page: Page, params: residual.ResidualParams, result: residual.Patching) -> None:
    page.headline_controls.caption(
        f"Clean: {result.pair.clean!r} · corrupted: {result.pair.corrupt!r}"
        + (f" · the answer enters at {result.pair.where}" if result.pair.where else "") + " · "
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
    share_bar("residual", title=f"Activation patching on {page.handle.spec.label}: {result.pair.name}",
              params=params.to_dict(), result=result, model=page.handle.spec.label, figures=figures, tables=tables)


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
             "subject's last token": r.subject} for r in result.runs]
    table(rows)
    if result.skipped:
        st.caption(f"Skipped (the two prompts differ in length here): {', '.join(result.skipped)}")
    share_bar("residual", title=f"Residual patching over {len(result.runs)} pairs on {page.handle.spec.label}",
              params=params.to_dict(), result=result, model=page.handle.spec.label, figures={"All pairs": fig},
              tables={"pairs": rows})

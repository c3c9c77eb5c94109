"""Residual stream: what each layer already predicts, which activations carry the answer, what writes it."""
from __future__ import annotations

import streamlit as st

from analysis import residual
from analysis.models import ModelSpec, all_zoo_models, load_model
from components.common import (analysis_errors, explain, field_row, metric_row, require_model, set_url_params,
                               url_param)
from components.figures import residual as F
from components.params_form import ParamsForm, fields_of
from components.presets import preset_bar
from components.runs import cached_run
from components.share import share_bar

SECTIONS = {"lens": "Lens & logit attribution", "patching": "Activation patching", "side": "Side by side",
            "pairs": "All offered pairs"}
COLOURS = {"target_prob": "P(target)", "kl": "KL to the final layer", "top_prob": "P(top token)"}


@st.cache_resource(max_entries=2, show_spinner="Loading the other model ...")
def other_model(label: str):
    return load_model(ModelSpec.parse(label))


def offered(name: str, choices: list[str]) -> list[str]:
    """`choices` for a control whose choices depend on the model: a link's value outside them is dropped
    (the control shows its default) instead of reaching a select box that cannot show it."""
    if name in st.query_params and st.query_params[name] not in choices:
        del st.query_params[name]
    return choices


def controls(handle) -> residual.ResidualParams:
    """The settings, drawn from ResidualParams' own fields and mirrored into the URL."""
    pairs = residual.pairs_for(handle)
    labels = {p.name: p.label for p in pairs} | {"": f"{pairs[0].label} (default)", residual.OWN: "Your own two prompts"}
    form = ParamsForm("rs_")
    with st.container(border=True):
        c0, c1 = st.columns([5, 3])
        pair = form.draw(c0, fields_of(residual.ResidualParams, ["pair"]), width="stretch", overrides={"pair": {
            "choices": offered("pair", ["", *[p.name for p in pairs], residual.OWN]),
            "format_func": lambda n: labels.get(n, n)}})["pair"]
        form.draw(c1, fields_of(residual.ResidualParams, ["lens"]), width="stretch",
                  overrides={"lens": {"format_func": residual.LENSES.label}})
        if pair == residual.OWN:
            form.draw(st.container(), fields_of(residual.ResidualParams, ["prompt", "corrupt"]), width="stretch")
        form.draw(field_row(), fields_of(residual.ResidualParams, ["answer", "foil", "top_k"]))
        form.draw(field_row(), fields_of(residual.ResidualParams, ["components", "methods"]), width="content",
                  overrides={"components": {"format_func": residual.COMPONENTS.label},
                             "methods": {"format_func": residual.METHODS.label}})
        others = [f"zoo:{n}" for n in all_zoo_models() if f"zoo:{n}" != handle.spec.label] or [""]
        form.draw(field_row(), fields_of(residual.ResidualParams, ["side", "other_model"]), width=260,
                  overrides={"other_model": {"choices": offered("other_model", others), "widget": "select"}},
                  defaults={"other_model": others[0]})
    params = residual.ResidualParams(**form.values)
    form.mirror()
    form.check(lambda raw: residual.validate_params(residual.ResidualParams(**raw)))
    return params


def lens_section(handle, params: residual.ResidualParams) -> None:
    with analysis_errors():
        seen: residual.Inspection = cached_run("inspect", residual.inspect, handle, params, label="Reading every layer")
    row = metric_row()
    row.metric("The model predicts", repr(seen.prediction))
    row.metric("Target", repr(seen.target), f"P = {seen.lens.target_prob[-1][-1]:.2f} at the last layer",
               delta_color="off")
    first = next((i for i, r in enumerate(seen.lens.target_rank) if r[-1] == 0), None)
    row.metric("Target first on top at layer", "never" if first is None else str(first))
    row.metric("Last layer vs the model's logits", f"{seen.lens.last_gap:.1e}", "max |difference|", delta_color="off")
    colour = st.radio("Colour", list(COLOURS), format_func=COLOURS.get, horizontal=True, key="rs_colour",
                      index=list(COLOURS).index(url_param("colour", "target_prob", choices=list(COLOURS))))
    set_url_params(colour=colour)
    grid = F.lens_figure(seen, colour)
    st.plotly_chart(grid, key="rs_fig_lens")
    explain("Each row is the residual stream after one layer (0: the embeddings), each column a token of the "
            "prompt; a cell shows the token the lens reads there as the most likely next token. The logit lens "
            "applies the model's own final norm and unembedding to every layer, so its last row is exactly the "
            "model's output; the tuned lens first maps each layer with a trained affine translator (Belrose et "
            "al. 2023). Hover a cell for its top tokens, the target's probability and rank, and the KL divergence "
            "from the final distribution (nats: 0 means identical).")
    st.plotly_chart(F.lens_curves(seen), key="rs_fig_curves")
    st.dataframe(F.last_position_rows(seen), hide_index=True)
    dla = F.dla_figure(seen)
    st.plotly_chart(dla, key="rs_fig_dla")
    explain("Direct logit attribution: the last position's residual stream is the embeddings plus what every "
            "attention layer and MLP wrote; with the final norm's scale frozen, each part's contribution to "
            "logit(target) − logit(foil) adds up exactly to the model's own value (in the title). A head writes "
            "its slice of the attention output. Direct effects only: what a layer does through later layers is "
            "not counted here — patching measures that.")
    share_bar("residual", title=f"Residual stream ({residual.LENSES.label(params.lens)}) on {handle.spec.label}",
              params=params.to_dict(), result=seen, model=handle.spec.label,
              figures={"Lens": grid, "Logit attribution": dla})


def patching_section(handle, params: residual.ResidualParams) -> None:
    with analysis_errors():
        result: residual.Patching = cached_run("patch", residual.patch, handle, params, label="Patching every cell")
    row = metric_row()
    row.metric("Clean: logit(target) − logit(foil)", f"{result.clean_diff:+.2f}")
    row.metric("Corrupted", f"{result.corrupt_diff:+.2f}")
    row.metric("Changed positions", ", ".join(map(str, result.changed)))
    for name, seconds in result.seconds.items():
        row.metric(f"{residual.METHODS.label(name)} took", f"{seconds:.1f} s")
    st.caption(f"Clean: {result.pair.clean!r} · corrupted: {result.pair.corrupt!r}"
               + (f" · the answer enters at {result.pair.where}" if result.pair.where else ""))
    figures = {}
    for name in params.components:
        fig = F.patch_figure(result, name)
        figures[residual.COMPONENTS.label(name)] = fig
        st.plotly_chart(fig, key=f"rs_fig_patch_{name}")
        st.dataframe(F.peak_rows(result, name), hide_index=True)
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
    share_bar("residual", title=f"Activation patching on {handle.spec.label}: {result.pair.name}",
              params=params.to_dict(), result=result, model=handle.spec.label, figures=figures)


def side_section(handle, params: residual.ResidualParams) -> None:
    models = {}
    if params.side == "model":
        if not params.other_model:
            st.info("Pick the other model to compare with.")
            return
        with analysis_errors(prefix="Could not load the other model: "):
            models["other"] = other_model(params.other_model)
    with analysis_errors():
        result: residual.SideBySide = cached_run("side", residual.side_by_side, handle, params, label="Reading both sides",
                                          models=models)
    row = metric_row()
    for side, label in ((result.a, result.a_label), (result.b, result.b_label)):
        row.metric(label, repr(side.prediction), f"P(target) {side.lens.target_prob[-1][-1]:.2f}", delta_color="off")
    fig = F.side_figure(result)
    st.plotly_chart(fig, key="rs_fig_side")
    explain("Both sides read with the same lens and scored on the same target (and foil), at their last position; "
            "grey bars are the difference (left side minus right). Two prompts on one model show where the "
            "corrupted prompt's prediction parts from the clean one; two models on one prompt show in which "
            "layers they differ.")
    c0, c1 = st.columns(2)
    c0.plotly_chart(F.lens_figure(result.a, "target_prob"), key="rs_fig_side_a")
    c1.plotly_chart(F.lens_figure(result.b, "target_prob"), key="rs_fig_side_b")
    share_bar("residual", title=f"Side by side: {result.a_label} vs {result.b_label}", params=params.to_dict(),
              result=result, model=handle.spec.label, figures={"Side by side": fig})


def pairs_section(handle, params: residual.ResidualParams) -> None:
    with analysis_errors():
        result: residual.PairSweep = cached_run("pairs", residual.pair_sweep, handle, params, label="Patching every offered pair")
    fig = F.sweep_figure(result)
    st.plotly_chart(fig, key="rs_fig_sweep")
    explain("Residual-stream patching of every pair offered for this model, averaged per layer at three kinds of "
            "position: the subject's last token (the token the two prompts differ in), the last token, and the "
            "rest. The known pattern of factual recall (Meng et al. 2022): the subject's token carries the fact "
            "through the early and middle layers, then the last token takes it over.")
    st.dataframe([{"pair": r.name, "clean diff": round(r.clean_diff, 2), "corrupted diff": round(r.corrupt_diff, 2),
                   "subject's last token": r.subject} for r in result.runs], hide_index=True)
    share_bar("residual", title=f"Residual patching over {len(result.runs)} pairs on {handle.spec.label}",
              params=params.to_dict(), result=result, model=handle.spec.label, figures={"All pairs": fig})


def page() -> None:
    st.title("Residual stream")
    st.write("What each layer of the loaded model already predicts (the **logit lens**, and the **tuned lens** of "
             "Belrose et al. 2023), which activations carry the answer (**activation patching**, exact and its "
             "gradient estimate, **attribution patching**), what writes it straight into the output (**direct "
             "logit attribution**), and two prompts or two models **side by side**.")
    preset_bar("residual-stream", widget_prefix="rs_")
    handle = require_model(*residual.ANALYSIS.kinds, panel="Residual stream")
    with analysis_errors():
        params = controls(handle)
    section = st.radio("View", list(SECTIONS), format_func=SECTIONS.get, horizontal=True, key="rs_view",
                       index=list(SECTIONS).index(url_param("view", "lens", choices=list(SECTIONS))))
    set_url_params(view=section)
    {"lens": lens_section, "patching": patching_section, "side": side_section, "pairs": pairs_section}[section](
        handle, params)


page()

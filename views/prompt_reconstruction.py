"""Prompt reconstruction: recover a prompt from its hidden states; defences; Cascade sharding."""
from __future__ import annotations

import streamlit as st

from analysis import cost, inversion
from analysis.tasks import tasks_for
from components.figures import inversion as F
from components.common import (analysis_errors, charts_side_by_side, explain, field_row, metric_row,
                               require_model, set_url_params, url_param)
from components.params_form import WIDTH, ParamsForm, fields_of
from components.presets import preset_bar
from components.runs import cached_run
from components.share import share_bar

NOISES = [0.0, 0.01, 0.1, 0.3, 1.0, 3.0]
BAD_LINK = "This link's settings are out of range; the controls show the nearest allowed values: "

st.title("Prompt reconstruction")
st.write(
    "If someone can see a model's hidden states, can they read the prompt? With open weights, yes: "
    "causal attention makes the state at position *i* depend only on tokens 0..*i*, so the prompt can be "
    "rebuilt one token at a time by trying candidates and keeping the one whose recomputed state matches "
    "(*Hidden No More*, ICML 2025). This panel runs that attack on the loaded model, against the defences "
    "people propose, and simulates *Cascade*'s sequence sharding across parties."
)

preset_bar("prompt-reconstruction", widget_prefix="inv_")
handle = require_model(*inversion.ANALYSIS.kinds, panel="Prompt reconstruction")
n_layers = handle.info.layers


def forget_if_outside(key: str, lo, hi) -> None:
    """Drop a widget's remembered value when the range changed (e.g. a model with fewer layers)."""
    value = st.session_state.get(key)
    if value is not None and not lo <= value <= hi:
        del st.session_state[key]


def label_width(f) -> int:
    """Wide enough for the field's label on one line."""
    return max(WIDTH, 8 * len(f.metadata["label"]) + 24)


# --- controls: drawn from the settings' own descriptions (AttackParams, each defence's and order's class)

forget_if_outside("inv_layer", 0, n_layers)
default_layer = max(1, n_layers // 2)
raw_layer = url_param("layer", default_layer, int)
layer_error = None
try:
    inversion.check_layer(handle, raw_layer)
except inversion.InversionError as exc:
    layer_error = f"{exc} Showing layer {default_layer} instead."
    raw_layer = default_layer

permutations = inversion.defence_names("permutation")
perturbations = inversion.defence_names("perturbation")
method_fields = [*inversion.DEFENCES.settings(), *inversion.ORDERS.settings()]
form = ParamsForm("inv_")
with st.container(border=True):
    form.draw(st.container(), fields_of(inversion.AttackParams, ["prompt"]), width="stretch",
              defaults={"prompt": tasks_for(handle).reconstruction_prompt})
    # fixed-width fields that wrap whole on a narrow screen; each select box is wide enough for its
    # longest option (equal columns cut "model + embedding proposals, then gradient inversion")
    row = field_row()
    layer = row.number_input(f"Layer L (0–{n_layers})", 0, n_layers, raw_layer, key="inv_layer", width=130,
                             help=inversion.AttackParams.__dataclass_fields__["layer"].metadata["help"])
    perm = row.selectbox("Permutation defence", permutations, format_func=inversion.defence_label,
                         index=permutations.index(url_param("perm", "none", choices=permutations)),
                         key="inv_perm", width=300)
    perturb = row.selectbox("Perturbation", perturbations, format_func=inversion.defence_label,
                            index=perturbations.index(url_param("perturb", "none", choices=perturbations)),
                            key="inv_perturb", width=180)
    form.draw(row, fields_of(inversion.AttackParams, ["seed"]), width=140)
    order = form.draw(st.container(), fields_of(inversion.AttackParams, ["order"]), width=440,
                      overrides={"order": {"format_func": inversion.ORDERS.label}})["order"]
    st.caption("Each defence's and proposal order's own settings (greyed out unless it is chosen)")
    chosen = {perm, perturb, order}
    form.draw(field_row(), method_fields,
              overrides={f.name: {"width": label_width(f), "disabled": not chosen & set(inversion.users_of(f.name))}
                         for f, _ in method_fields})


def params_of(values: dict) -> inversion.AttackParams:
    own = {k: v for k, v in values.items() if k in inversion.AttackParams.__dataclass_fields__}
    settings = {k: v for k, v in values.items() if k not in own}
    return inversion.AttackParams(**own, layer=int(layer), defences=[d for d in (perm, perturb) if d != "none"],
                                  methods=inversion.method_settings(**settings))


form.mirror()
set_url_params(layer=layer, perm=perm, perturb=perturb)
if layer_error:
    st.error(layer_error)
with analysis_errors(prefix=BAD_LINK, stop=False):  # a link's own values, through the CLI's validation
    inversion.validate_params(params_of(form.raw))
with analysis_errors():
    params = params_of(form.values)
    params.validate()
    ids = inversion.tokenize(handle, params.prompt, params.max_tokens)

# --- 1. original vs recovered ------------------------------------------------------------------

st.subheader("Original vs recovered")
with analysis_errors():
    result = cached_run("attack", inversion.reconstruct, handle, params, label="Reconstructing")
row = metric_row()
row.metric("Tokens recovered", f"{result.accuracy:.0%}", help=f"{sum(t.correct for t in result.tokens)} of {len(ids)}")
row.metric("Candidates scored", f"{result.evaluations:,}",
           help=f"Exhaustive search scores {len(ids) * result.vocab_size:,} (vocabulary × positions).")
row.metric("Fewer than exhaustive", f"{len(ids) * result.vocab_size / max(result.evaluations, 1):,.0f}×")
row.metric("Time", f"{result.seconds:.2f} s")
st.html(F.tokens_html(result))
explain(
    f"Each box is one position: the original token (grey) over the token the attacker recovered from the "
    f"layer-{params.layer} states (green = right, red = wrong). Hover for the L1 distance and the rank at which "
    f"the true token came up. A candidate is accepted as soon as its recomputed state is within "
    f"ε = {result.numerical_epsilon:.3g} of an observed row (the numerical noise of recomputation, measured on "
    f"random tokens; a typical state has L1 norm {result.state_l1:.3g}). If none is, the closest token in the "
    "whole vocabulary wins — always the case under noise or quantisation, where nothing matches exactly."
)
charts_side_by_side((F.distance_figure(result), "inv_dist"), (F.rank_figure(result), "inv_rank"))
explain(
    "L1 distance: how far the chosen candidate's state is from the observed one; below the dashed line it is an "
    "exact match (certified), below the dotted one (with noise or quantisation) it is within what the defence can "
    "change. Work per position: how many candidates were scored at each position (bars) and where the true "
    "token sat in the proposal order (diamonds); the dotted line is what exhaustive search pays per position."
    + (f" Gradient inversion also spent {result.gradient_steps} forward+backward passes (see the table)."
       if result.gradient_steps else "")
)
with st.expander("Per-token table"):
    st.dataframe(F.token_rows(result), hide_index=True)

# --- 2. and 3. sweeps: each starts at once when its estimate is short, else offers its button ------------

run_sweeps = st.toggle("Show the layer and noise sweeps", value=url_param("sweeps", 1, int) == 1, key="inv_sweeps",
                       help="Re-runs the attack at every layer and at several noise levels per defence.")
set_url_params(sweeps=int(run_sweeps))
if run_sweeps:
    st.subheader("Accuracy by layer")
    layer_sweep = cached_run("layers", inversion.sweep_layers, handle, params, label="Sweeping layers",
                             optional=True)
    if layer_sweep is not None:
        st.plotly_chart(F.layer_figure(layer_sweep), key="inv_layers")
        explain(
            "The same attack (with the defences chosen above) on the states of every layer. Deeper layers mix "
            "more context into each state, but as long as the map from prefix to state is injective the match is "
            "exact. At layer 0 of a rotary-position model the state is the bare token embedding: shuffled "
            "positions then hide the order, though not which tokens were used."
        )
    st.subheader("Accuracy vs noise, per defence")
    noise_sweep = cached_run("noise", inversion.sweep_noise, handle, params, label="Sweeping noise", optional=True,
                             noises=NOISES)
    if noise_sweep is not None:
        st.plotly_chart(F.noise_figure(noise_sweep), key="inv_noise_fig")
        explain(
            "Gaussian noise (σ in units of the states' standard deviation) added on top of each permutation "
            "defence. Permutations alone do not help: the attacker matches against every unused row and compares "
            "sorted vectors. Only noise large enough to bury the difference between neighbouring tokens stops "
            "the attack — and noise that large also destroys what the states are for."
        )
else:
    st.info("The sweeps re-run the attack many times; switch them on above to see them.")

# --- 4. speed vs exhaustive ---------------------------------------------------------------------

st.subheader("Forwards and time vs exhaustive search")
# exhaustive search on every position when that is short, else on the first one, its time extrapolated
full = cost.estimate(inversion.compare_exhaustive, handle, params, {"measured_positions": len(ids)})
measure = len(ids) if full.seconds <= cost.LIMIT_S else 1
speed = None
timing = st.toggle("Time exhaustive search", value=url_param("exhaustive", 1, int) == 1, key="inv_speed_on",
                   help=f"Exhaustive search scores all {result.vocab_size:,} tokens per position. When that is long "
                        "it runs on the first position only and its time is extrapolated.")
set_url_params(exhaustive=int(timing))
if timing:
    speed = cached_run("speed", inversion.compare_exhaustive, handle, params, label="Timing exhaustive search",
                       optional=True, measured_positions=measure)
if speed is not None:
    st.plotly_chart(F.speed_figure(speed), key="inv_speed")
    same = "the same tokens" if speed.identical_on_measured else "DIFFERENT tokens (see the table)"
    explain(
        f"Exhaustive search scores all {speed.attack.vocab_size:,} tokens at each of {speed.positions} positions "
        f"({speed.exhaustive_evaluations_total:,} candidates); the proposal-ordered attack scored "
        f"{speed.attack.evaluations:,} — {speed.evaluation_ratio:,.0f}× fewer — in {speed.time_ratio:,.1f}× less "
        "time"
        + (f" (its {speed.attack.gradient_steps} gradient-inversion steps are in the time, not in the candidate "
           "count). " if speed.attack.gradient_steps else ". ")
        + (f"Exhaustive search was run on all positions and found {same}."
           if speed.measured_positions == speed.positions else
           f"Exhaustive search was run on the first {speed.measured_positions} position(s) only (found {same}) and "
           "its time extrapolated to the whole prompt; its candidate count is exact.")
    )
elif not timing:
    st.info(f"Exhaustive search would score {len(ids) * result.vocab_size:,} candidates; switch it on above to "
            "time it.")

# --- 5. Cascade ----------------------------------------------------------------------------------

st.subheader("Cascade: sharding the sequence across parties")
st.caption(F.CASCADE_SCOPE_SHORT)
with st.expander("What this simulator models — and what it leaves out"):
    st.markdown(F.CASCADE_SCOPE)
cascade_fields = inversion.CascadeParams.__dataclass_fields__
cascade_form = ParamsForm("inv_")
forget_if_outside("inv_parties", 1, len(ids))
with st.container(border=True):
    row = field_row()
    parties = row.number_input(cascade_fields["parties"].metadata["label"], 1, len(ids),
                               url_param("parties", 2, int, lo=1, hi=len(ids)), key="inv_parties", width=130,
                               help=cascade_fields["parties"].metadata["help"])
    sharding = cascade_form.draw(row, fields_of(inversion.CascadeParams, ["sharding"]), width=360,
                                 overrides={"sharding": {"format_func": inversion.SHARDINGS.label}})["sharding"]
    forget_if_outside("inv_attacker", 0, int(parties) - 1)
    attacker = row.number_input(cascade_fields["attacker"].metadata["label"], 0, int(parties) - 1,
                                url_param("attacker", 0, int, lo=0, hi=int(parties) - 1), key="inv_attacker",
                                width=140, help=cascade_fields["attacker"].metadata["help"])
    budget = cascade_form.draw(row, fields_of(inversion.CascadeParams, ["budget"]), width=230)["budget"]
cascade_form.mirror()
set_url_params(parties=parties, attacker=attacker)
cascade_params = inversion.CascadeParams(prompt=params.prompt, layer=params.layer, parties=int(parties),
                                         sharding=sharding, attacker=int(attacker), budget=int(budget))
cascade = None
with analysis_errors(stop=False):
    cascade = cached_run("cascade", inversion.simulate_cascade, handle, cascade_params,
                         label="Brute-forcing the attacker's view", optional=True)
if cascade is not None:
    st.plotly_chart(F.cascade_figure(cascade), key="inv_cascade")
    st.dataframe(F.cascade_rows(cascade), hide_index=True)
    (st.success if cascade.verdict.startswith("Out of") else st.warning)(cascade.verdict)
    if cascade.brute_force_ran:
        st.write(f"Party {attacker} brute-forced its view: {cascade.attacker_accuracy:.0%} of its positions "
                 f"recovered with {cascade.evaluations:,} candidate sequences in {cascade.seconds:.1f} s.")
    else:
        st.write(f"Party {attacker}'s view costs more than the budget, so no brute force was run.")
    explain(
        "Cascade gives each party the hidden states of only some positions. To invert a position it sees, a party "
        "must also guess every unseen token since the last position it recovered, so its cost is V^(gap+1) "
        "sequences for a gap of unseen tokens. Round-robin keeps every gap at most k − 1; contiguous blocks hand "
        "the first party the start of the prompt with no gap at all. With a small vocabulary V the search is cheap "
        "and the shards are broken outright — the brute force above actually runs when the cost fits the budget."
    )

share_bar(
    "prompt_reconstruction", title=f"Prompt reconstruction, layer {params.layer}", params=params.to_dict(),
    result=result, model=handle.spec.label,
    figures={"Distances": F.distance_figure(result), "Work per position": F.rank_figure(result),
             **({"Speed": F.speed_figure(speed)} if speed else {})},
    tables={"tokens": F.token_rows(result)},
)

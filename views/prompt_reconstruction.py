"""Prompt reconstruction: recover a prompt from its hidden states; defences; Cascade sharding."""
from __future__ import annotations

import streamlit as st

from analysis import inversion as inv
from analysis.registry import SettingsError
from analysis.tasks import tasks_for
from components.figures import inversion as F
from components.common import (analysis_errors, charts_side_by_side, explain, field_row, metric_row,
                               require_model, set_url_params, show_error, url_param)
from components.presets import preset_bar
from components.runs import cached_run
from components.share import share_bar

NOISES = [0.0, 0.01, 0.1, 0.3, 1.0, 3.0]
SMALL_WORK = 400_000  # candidate evaluations below which sweeps run without asking

st.title("Prompt reconstruction")
st.write(
    "If someone can see a model's hidden states, can they read the prompt? With open weights, yes: "
    "causal attention makes the state at position *i* depend only on tokens 0..*i*, so the prompt can be "
    "rebuilt one token at a time by trying candidates and keeping the one whose recomputed state matches "
    "(*Hidden No More*, ICML 2025). This panel runs that attack on the loaded model, against the defences "
    "people propose, and simulates *Cascade*'s sequence sharding across parties."
)

preset_bar("prompt-reconstruction", widget_prefix="inv_")
handle = require_model("causal_lm", "vlm", panel="Prompt reconstruction")
n_layers = handle.info.layers


def default_prompt() -> str:
    return tasks_for(handle).reconstruction_prompt


# --- controls (mirrored to the URL) ------------------------------------------------------------


url_errors: list[str] = []


def checked(name: str, default, cast, check) -> object:
    """A URL value that passes the method's own validation (`check` raises SettingsError), else the
    default, with the method's message shown: the page, the URL and the CLI share one check."""
    value = url_param(name, default, cast)
    try:
        check(value)
    except SettingsError as exc:
        url_errors.append(f"{exc} Showing {default} instead.")
        return default
    return value


def forget_if_outside(key: str, lo, hi) -> None:
    """Drop a widget's remembered value when the range changed (e.g. a model with fewer layers)."""
    value = st.session_state.get(key)
    if value is not None and not lo <= value <= hi:
        del st.session_state[key]


forget_if_outside("inv_layer", 0, n_layers)

raw_layer = url_param("layer", max(1, n_layers // 2), int)
layer_error = None
try:
    inv.check_layer(handle, raw_layer)
except inv.InversionError as exc:
    layer_error = f"{exc} Showing layer {max(1, n_layers // 2)} instead."
    raw_layer = max(1, n_layers // 2)

orders = list(inv.ORDERS)
permutations = inv.defence_names("permutation")
perturbations = inv.defence_names("perturbation")
url_noise = checked("noise", 0.5, float, lambda v: inv.GaussianNoise(sigma=v))
url_bits = checked("bits", 4, int, lambda v: inv.Quantise(bits=v))
with st.container(border=True):
    prompt = st.text_input("Prompt (the secret the attacker tries to recover)",
                           url_param("prompt", default_prompt(), str), key="inv_prompt", max_chars=2000)
    # fixed-width fields that wrap whole on a narrow screen; each select box is wide enough for its
    # longest option (equal columns cut "model + embedding proposals, then gradient inversion")
    row = field_row()
    layer = row.number_input(f"Layer L (0–{n_layers})", 0, n_layers, raw_layer, key="inv_layer", width=130,
                             help="0 = token embeddings; k = residual stream after decoder block k.")
    perm = row.selectbox("Permutation defence", permutations, format_func=inv.defence_label,
                         index=permutations.index(url_param("perm", "none", choices=permutations)),
                         key="inv_perm", width=300)
    perturb = row.selectbox("Perturbation", perturbations, format_func=inv.defence_label,
                            index=perturbations.index(url_param("perturb", "none", choices=perturbations)),
                            key="inv_perturb", width=180)
    seed = row.number_input("Defence seed", 0, 10_000, url_param("seed", 0, int, lo=0, hi=10_000), key="inv_seed",
                            help="Seeds the permutations and the noise.", width=140)
    row = field_row()
    order = row.selectbox("Proposal order", orders, format_func=lambda o: inv.ORDERS[o].label,
                          index=orders.index(url_param("order", "hybrid", choices=orders)), key="inv_order",
                          width=440,
                          help="Which candidates are tried first. Every order ends with the rest of the "
                               "vocabulary, and the distance check decides, so the order changes only the cost.")
    noise = row.number_input("Noise σ (× state std)", 0.0, 100.0, min(url_noise, 100.0), width=160,
                             step=0.1, key="inv_noise", disabled=perturb != "gaussian_noise")
    bits = row.number_input("Quantisation bits", 1, 32, url_bits, key="inv_bits", width=140,
                            disabled=perturb != "quantise")

set_url_params(prompt=prompt, layer=layer, perm=perm, perturb=perturb, noise=noise, bits=bits, order=order,
               seed=seed)
for message in [layer_error, *url_errors]:
    if message:
        st.error(message)

defences = [d for d in (perm, perturb) if d != "none"]
with analysis_errors(inv.InversionError):
    params = inv.AttackParams(prompt=prompt, layer=int(layer), defences=defences, noise=float(noise),
                              bits=int(bits), order=order, seed=int(seed))
    params.validate()
    ids = inv.tokenize(handle, prompt, params.max_tokens)

# --- 1. original vs recovered ------------------------------------------------------------------

st.subheader("Original vs recovered")
with analysis_errors(inv.InversionError):
    result = cached_run("attack", inv.reconstruct, handle, params, label="Reconstructing")
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

# --- 2. and 3. sweeps ---------------------------------------------------------------------------

# Rough candidate count: clean runs stop early (~64 candidates a position); noisy runs score everything.
noisy = sum(s > 0 for s in NOISES) * len(permutations)
clean_runs = n_layers + 1 + len(permutations)
sweep_cost = len(ids) * (clean_runs * min(result.vocab_size, 64) + noisy * result.vocab_size)
auto = sweep_cost <= SMALL_WORK
run_sweeps = st.toggle("Run the layer and noise sweeps", value=url_param("sweeps", int(auto), int) == 1,
                       key="inv_sweeps", help="Re-runs the attack at every layer and at several noise levels "
                                              "per defence.")
set_url_params(sweeps=int(run_sweeps))
layer_sweep = noise_sweep = None
if run_sweeps:
    st.subheader("Accuracy by layer")
    layer_sweep = cached_run("layers", inv.sweep_layers, handle, params, label="Sweeping layers")
    st.plotly_chart(F.layer_figure(layer_sweep), key="inv_layers")
    explain(
        "The same attack (with the defences chosen above) on the states of every layer. Deeper layers mix more "
        "context into each state, but as long as the map from prefix to state is injective the match is exact. "
        "At layer 0 of a rotary-position model the state is the bare token embedding: shuffled positions then "
        "hide the order, though not which tokens were used."
    )
    st.subheader("Accuracy vs noise, per defence")
    noise_sweep = cached_run("noise", inv.sweep_noise, handle, params, label="Sweeping noise", noises=NOISES)
    st.plotly_chart(F.noise_figure(noise_sweep), key="inv_noise_fig")
    explain(
        "Gaussian noise (σ in units of the states' standard deviation) added on top of each permutation defence. "
        "Permutations alone do not help: the attacker matches against every unused row and compares sorted "
        "vectors. Only noise large enough to bury the difference between neighbouring tokens stops the attack — "
        "and noise that large also destroys what the states are for."
    )
else:
    st.info("The sweeps re-run the attack many times; switch them on above when you have the time.")

# --- 4. speed vs exhaustive ---------------------------------------------------------------------

st.subheader("Forwards and time vs exhaustive search")
small = len(ids) * result.vocab_size <= 60_000
measure = len(ids) if small else 1
speed = None
timing = st.toggle("Time exhaustive search", value=url_param("exhaustive", int(small), int) == 1, key="inv_speed_on",
                   help=f"Exhaustive search scores all {result.vocab_size:,} tokens per position. For a large "
                        "vocabulary it runs on the first position only and its time is extrapolated.")
set_url_params(exhaustive=int(timing))
if timing:
    speed = cached_run("speed", inv.compare_exhaustive, handle, params, label="Timing exhaustive search",
                       measured_positions=measure)
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
else:
    st.info(f"Exhaustive search would score {len(ids) * result.vocab_size:,} candidates; switch it on above to "
            "time it (on the first position, extrapolated).")

# --- 5. Cascade ----------------------------------------------------------------------------------

st.subheader("Cascade: sharding the sequence across parties")
st.caption(F.CASCADE_SCOPE_SHORT)
with st.expander("What this simulator models — and what it leaves out"):
    st.markdown(F.CASCADE_SCOPE)
shardings = list(inv.SHARDINGS)
forget_if_outside("inv_parties", 1, len(ids))
with st.container(border=True):
    row = field_row()
    parties = row.number_input("Parties k", 1, len(ids), url_param("parties", 2, int, lo=1, hi=len(ids)),
                               key="inv_parties", width=130)
    sharding = row.selectbox("Sharding", shardings, format_func=lambda s: inv.SHARDINGS[s].label,
                             index=shardings.index(url_param("sharding", "round_robin", choices=shardings)),
                             key="inv_sharding", width=360)
    forget_if_outside("inv_attacker", 0, int(parties) - 1)
    attacker = row.number_input("Attacking party", 0, int(parties) - 1,
                                url_param("attacker", 0, int, lo=0, hi=int(parties) - 1), key="inv_attacker",
                                width=140)
    budget = row.number_input("Brute-force budget (sequences)", 1_000, 5_000_000,
                              url_param("budget", 1_000_000, int, lo=1_000, hi=5_000_000), step=50_000,
                              key="inv_budget", width=230)
set_url_params(parties=parties, sharding=sharding, attacker=attacker, budget=budget)
cascade_params = inv.CascadeParams(prompt=prompt, layer=int(layer), parties=int(parties), sharding=sharding,
                                   attacker=int(attacker), budget=int(budget))
try:
    cascade = cached_run("cascade", inv.simulate_cascade, handle, cascade_params,
                         label="Brute-forcing the attacker's view")
except SettingsError as exc:
    show_error(exc)
else:
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

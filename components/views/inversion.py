"""The prompt-reconstruction page: the attack on the loaded model's hidden states, its sweeps, exhaustive
search for comparison, and Cascade's sharding. Controls: AttackParams and each defence's and order's
settings; view state: InversionState (analysis/inversion/params.py)."""
from __future__ import annotations

import streamlit as st

from analysis.framework import cost
from analysis import inversion
from analysis.tasks import tasks_for
from components.common import table, charts_side_by_side, explain
from components.figures import inversion as F
from components.params_form import WIDTH
from components.share import share_bar
from components.view import Headline, Metric, Page, Section, View

NOISES = [0.0, 0.01, 0.1, 0.3, 1.0, 3.0]


class InversionView(View):
    panel = "invert"
    prefix = "inv_"
    intro = (
        "If someone can see a model's hidden states, can they read the prompt? With open weights, yes: "
        "causal attention makes the state at position *i* depend only on tokens 0..*i*, so the prompt can be "
        "rebuilt one token at a time by trying candidates and keeping the one whose recomputed state matches "
        "(*Hidden No More*, ICML 2025). This panel runs that attack on the loaded model, against the defences "
        "people propose, and simulates *Cascade*'s sequence sharding across parties."
    )
    # fixed-width fields that wrap whole on a narrow screen; each select box is wide enough for its longest
    # option (equal columns cut "model + embedding proposals, then gradient inversion")
    sections = (Section("prompt", layout="stack"), Section("row"), Section("order"),
                Section("methods", caption="Each defence's and proposal order's own settings (greyed out unless "
                                           "it is chosen)"))
    bad_link_stops = False  # the page runs with the nearest allowed values, under the link's message

    def defaults(self, page: Page) -> dict:
        return {"prompt": tasks_for(page.handle).reconstruction_prompt, "layer": max(1, page.handle.info.layers // 2)}

    def overrides(self, page: Page, values: dict) -> dict:
        n = page.handle.info.layers
        out = {"layer": {"high": n, "label": f"Layer L (0–{n})"}}
        chosen = {values.get("perm"), values.get("perturb"), values.get("order")}
        for f, _ in inversion.method_fields():  # wide enough for its label on one line
            out[f.name] = {"width": max(WIDTH, 8 * len(f.metadata["label"]) + 24),
                           "disabled": not chosen & set(inversion.users_of(f.name))}
        return out

    def params_of(self, page: Page, values: dict) -> inversion.AttackParams:
        state = page.state.values
        defences = [d for d in (state.get("perm"), state.get("perturb")) if d not in (None, inversion.NO_DEFENCE)]
        return inversion.AttackParams.from_flat(values, defences=defences)

    def validate(self, page: Page, params: inversion.AttackParams) -> None:
        inversion.check_layer(page.handle, params.layer)
        inversion.validate_params(params)
        inversion.tokenize(page.handle, params.prompt, params.max_tokens)  # too many tokens: refused before any run

    def run(self, page: Page, params: inversion.AttackParams):
        return page.run("attack", inversion.reconstruct, params, label="Reconstructing")

    def headline(self, page: Page, params: inversion.AttackParams, result: inversion.AttackResult) -> Headline:
        """How much of the prompt came back, at what cost, and the original over the recovered tokens."""
        positions = len(result.tokens)
        return Headline((
            Metric("Tokens recovered", f"{result.accuracy:.0%}",
                   help=f"{sum(t.correct for t in result.tokens)} of {positions}"),
            Metric("Candidates scored", f"{result.evaluations:,}",
                   help=f"Exhaustive search scores {positions * result.vocab_size:,} (vocabulary × positions)."),
            Metric("Fewer than exhaustive", f"{positions * result.vocab_size / max(result.evaluations, 1):,.0f}×"),
            Metric("Time", f"{result.seconds:.2f} s")),
            html=F.tokens_html(result), caption="Original vs recovered")

    def show(self, page: Page, params: inversion.AttackParams, result: inversion.AttackResult) -> None:
        handle = page.handle
        positions = len(result.tokens)
        with page.headline_controls:
            explain(
                f"Each box is one position: the original token (grey) over the token the attacker recovered from the "
                f"layer-{params.layer} states (green = right, red = wrong). Hover for the L1 distance and the rank at "
                f"which the true token came up. A candidate is accepted as soon as its recomputed state is within "
                f"ε = {result.numerical_epsilon:.3g} of an observed row (the numerical noise of recomputation, measured "
                f"on random tokens; a typical state has L1 norm {result.state_l1:.3g}). If none is, the closest token in "
                "the whole vocabulary wins — always the case under noise or quantisation, where nothing matches "
                "exactly.")
        charts_side_by_side((F.distance_figure(result), "inv_dist"), (F.rank_figure(result), "inv_rank"))
        explain(
            "L1 distance: how far the chosen candidate's state is from the observed one; below the dashed line it is "
            "an exact match (certified), below the dotted one (with noise or quantisation) it is within what the "
            "defence can change. Work per position: how many candidates were scored at each position (bars) and "
            "where the true token sat in the proposal order (diamonds); the dotted line is what exhaustive search "
            "pays per position."
            + (f" Gradient inversion also spent {result.gradient_steps} forward+backward passes (see the table)."
               if result.gradient_steps else "")
        )
        with st.expander("Per-token table"):
            table(F.token_rows(result))
        sweeps(page, params)
        speed = exhaustive(page, params, result)
        cascade(page, params, positions)
        share_bar(
            "prompt_reconstruction", title=f"Prompt reconstruction, layer {params.layer}", params=params.to_dict(),
            result=result, model=handle.spec.label,
            figures={"Distances": F.distance_figure(result), "Work per position": F.rank_figure(result),
                     **({"Speed": F.speed_figure(speed)} if speed else {})},
            tables={"tokens": F.token_rows(result)},
        )


def sweeps(page: Page, params: inversion.AttackParams) -> None:
    """The layer and noise sweeps: each starts at once when its estimate is short, else offers its button."""
    if not page.control("sweeps", width="content"):
        st.info("The sweeps re-run the attack many times; switch them on above to see them.")
        return
    st.subheader("Accuracy by layer")
    layer_sweep = page.run("layers", inversion.sweep_layers, params, label="Sweeping layers", optional=True)
    if layer_sweep is not None:
        st.plotly_chart(F.layer_figure(layer_sweep), key="inv_layers")
        explain(
            "The same attack (with the defences chosen above) on the states of every layer. Deeper layers mix "
            "more context into each state, but as long as the map from prefix to state is injective the match is "
            "exact. At layer 0 of a rotary-position model the state is the bare token embedding: shuffled "
            "positions then hide the order, though not which tokens were used."
        )
    st.subheader("Accuracy vs noise, per defence")
    noise_sweep = page.run("noise", inversion.sweep_noise, params, label="Sweeping noise", optional=True,
                           noises=NOISES)
    if noise_sweep is not None:
        st.plotly_chart(F.noise_figure(noise_sweep), key="inv_noise_fig")
        explain(
            "Gaussian noise (σ in units of the states' standard deviation) added on top of each permutation "
            "defence. Permutations alone do not help: the attacker matches against every unused row and compares "
            "sorted vectors. Only noise large enough to bury the difference between neighbouring tokens stops "
            "the attack — and noise that large also destroys what the states are for."
        )


def exhaustive(page: Page, params: inversion.AttackParams, result: inversion.AttackResult):
    """Exhaustive search on every position when that is short, else on the first one, its time extrapolated."""
    st.subheader("Forwards and time vs exhaustive search")
    positions = len(result.tokens)
    full = cost.estimate(inversion.compare_exhaustive, page.handle, params, {"measured_positions": positions})
    measure = positions if full.seconds <= cost.LIMIT_S else 1
    speed = None
    if page.control("exhaustive", width="content", key="speed_on"):
        speed = page.run("speed", inversion.compare_exhaustive, params, label="Timing exhaustive search",
                         optional=True, measured_positions=measure)
    else:
        st.info(f"Exhaustive search would score {positions * result.vocab_size:,} candidates; switch it on above "
                "to time it.")
    if speed is not None:
        st.plotly_chart(F.speed_figure(speed), key="inv_speed")
        same = "the same tokens" if speed.identical_on_measured else "DIFFERENT tokens (see the table)"
        explain(
            f"Exhaustive search scores all {speed.attack.vocab_size:,} tokens at each of {speed.positions} "
            f"positions ({speed.exhaustive_evaluations_total:,} candidates); the proposal-ordered attack scored "
            f"{speed.attack.evaluations:,} — {speed.evaluation_ratio:,.0f}× fewer — in {speed.time_ratio:,.1f}× less "
            "time"
            + (f" (its {speed.attack.gradient_steps} gradient-inversion steps are in the time, not in the candidate "
               "count). " if speed.attack.gradient_steps else ". ")
            + (f"Exhaustive search was run on all positions and found {same}."
               if speed.measured_positions == speed.positions else
               f"Exhaustive search was run on the first {speed.measured_positions} position(s) only (found {same}) "
               "and its time extrapolated to the whole prompt; its candidate count is exact.")
        )
    return speed


def cascade(page: Page, params: inversion.AttackParams, positions: int) -> None:
    """Cascade: the prompt's positions sharded across parties, one of them brute-forcing its view."""
    st.subheader("Cascade: sharding the sequence across parties")
    st.caption(F.CASCADE_SCOPE_SHORT)
    with st.expander("What this simulator models — and what it leaves out"):
        st.markdown(F.CASCADE_SCOPE)
    with st.container(border=True):
        row = st.container(horizontal=True, wrap=True, vertical_alignment="bottom", gap="small")
        parties = page.control("parties", row, high=positions)
        sharding = page.control("sharding", row)
        attacker = page.control("attacker", row, high=parties - 1)
        budget = page.control("budget", row)
    params = inversion.CascadeParams(prompt=params.prompt, layer=params.layer, parties=int(parties),
                                     sharding=sharding, attacker=int(attacker), budget=int(budget))
    result = page.run("cascade", inversion.simulate_cascade, params, label="Brute-forcing the attacker's view",
                      optional=True, stop=False)
    if result is None:
        return
    st.plotly_chart(F.cascade_figure(result), key="inv_cascade")
    table(F.cascade_rows(result))
    (st.success if result.verdict.startswith("Out of") else st.warning)(result.verdict)
    if result.brute_force_ran:
        st.write(f"Party {attacker} brute-forced its view: {result.attacker_accuracy:.0%} of its positions "
                 f"recovered with {result.evaluations:,} candidate sequences in {result.seconds:.1f} s.")
    else:
        st.write(f"Party {attacker}'s view costs more than the budget, so no brute force was run.")
    explain(
        "Cascade gives each party the hidden states of only some positions. To invert a position it sees, a party "
        "must also guess every unseen token since the last position it recovered, so its cost is V^(gap+1) "
        "sequences for a gap of unseen tokens. Round-robin keeps every gap at most k − 1; contiguous blocks hand "
        "the first party the start of the prompt with no gap at all. With a small vocabulary V the search is cheap "
        "and the shards are broken outright — the brute force above actually runs when the cost fits the budget."
    )

"""Attention sharpness: how each head disperses as inputs grow, and whether temperature helps."""
from __future__ import annotations

import streamlit as st

from analysis import sharpness as S
from analysis.cost import default_for
from components.figures import sharpness as F
from components.common import (EMPTY_LIST, analysis_errors, explain, field_row, metric_row, require_model,
                               set_url_params, show_error, url_list, url_param)
from components.presets import preset_bar
from components import hosting
from components.runs import cached_run
from components.share import share_bar

N_CHOICES = [2, 4, 8, 16, 32, 64, 128, 256, 512]
THETA_CHOICES = ["0.125", "0.25", "0.5", "1", "2", "4", "adaptive"]

st.title("Attention sharpness")
st.write(
    "With bounded attention logits every softmax weight lies between e^(-δ/θ)/n and e^(δ/θ)/n "
    "(δ the logit spread, θ the temperature), so a fixed head must spread its attention as the number "
    "of items n grows — *Softmax is not enough (for sharp size generalisation)*, ICML 2025. This panel "
    "measures that on the loaded model with max-retrieval prompts and tries the paper's fix, an "
    "adaptive temperature chosen per attention row from its entropy."
)

preset_bar("attention-sharpness", widget_prefix="sh_")
handle = require_model("causal_lm", "vlm", panel="Attention sharpness")
info = handle.info


@st.cache_data(max_entries=8, show_spinner=False)
def lemma(params_json: str) -> S.LemmaResult:
    return S.lemma_demo(S.LemmaParams.from_json(params_json))


@st.cache_data(max_entries=32, show_spinner="Running the prompt ...")
def prompt_stats(model_label: str, params_json: str, _handle) -> S.PromptResult:
    return S.analyse_prompt(_handle, S.PromptParams.from_json(params_json))


@st.cache_data(max_entries=8, show_spinner=False)
def example_prompt(model_label: str, _tokenizer) -> tuple[str, str]:
    try:
        pr = S.build_prompt(_tokenizer, 16, seed=0)
    except S.SharpnessError:
        return "", ""
    return pr.text, pr.answer


def rule_of(choice: str, layers: list[int] | None) -> S.Temperature:
    layers = tuple(layers) if layers is not None else None
    return (S.Temperature("adaptive", layers=layers) if choice == "adaptive"
            else S.Temperature("fixed", float(choice), layers=layers))


# --- controls (mirrored to the URL) ------------------------------------------------------------

with st.container(border=True):
    all_layers = list(range(info.layers))
    lists = st.columns(2)
    # pills, not multiselects: every choice is shown as a one-click toggle, and wrap=True lets them wrap
    # (a multiselect's chips, and pills directly in a column by default, scroll sideways and hid 64 and
    # 128 at 1024 px)
    ns = sorted(lists[0].pills("Item counts n", N_CHOICES, selection_mode="multi", wrap=True,
                               default=url_list("ns", S.DEFAULT_NS, N_CHOICES), key="sh_ns",
                               help="How many numbers the max-retrieval prompts list.") or [])
    tl_default = url_list("tlayers", all_layers, all_layers, allow_empty=True)
    tlayers = sorted(lists[1].pills("Apply the temperature in layers", all_layers, selection_mode="multi", wrap=True,
                                    default=tl_default, key="sh_tlayers",
                                    help="θ and adaptive θ act in these layers only; the others keep plain "
                                         "softmax. The paper applies it everywhere.") or [])
    # fixed-width controls that wrap whole on a narrow screen (equal columns emptied the layer and head
    # boxes and cut the toggle's label at 1024 px)
    row = field_row(gap="medium")
    samples = row.number_input("Prompts per n", 1, 512,
                               url_param("samples", default_for(handle, 32, 4), int, lo=1, hi=512),
                               key="sh_samples", width=120)
    theta = row.select_slider("Temperature θ", THETA_CHOICES, value=url_param("theta", "adaptive", str, THETA_CHOICES),
                              key="sh_theta", help="θ < 1 sharpens, θ > 1 flattens; 'adaptive' is the paper's rule.",
                              width=220)
    layer = row.selectbox("Layer", all_layers, index=url_param("layer", 0, int, all_layers), key="sh_layer",
                          width=90)
    head = row.selectbox("Head", list(range(info.heads)), index=url_param("head", 0, int, list(range(info.heads))),
                         key="sh_head", width=90)
    sink = row.toggle("Count first token", value=url_param("sink", "1", str, ["0", "1"]) == "1", key="sh_sink",
                      help="Off: drop the first (attention-sink) token and renormalise before measuring.",
                      width="content")
set_url_params(ns=ns, samples=samples, theta=theta, layer=layer, head=head, sink=int(sink),
               tlayers=tlayers or EMPTY_LIST)
only = None if tlayers == all_layers else tlayers

# --- 1. lemma demo (no model) -------------------------------------------------------------------

st.header("1 · The lemma, without a model")
spread = st.slider("Logit spread δ", 0.5, 12.0, url_param("spread", 4.0, float, lo=0.5, hi=12.0), 0.5,
                   key="sh_spread")
set_url_params(spread=spread)
lemma_result = lemma(S.LemmaParams(spread=spread).to_json())
st.plotly_chart(F.lemma_figure(lemma_result), key="fig_lemma")
explain("n logits, one of them δ above the rest. At any fixed θ the weight on the maximum falls like 1/n "
        "and the entropy climbs towards ln n (dotted): softmax cannot stay sharp as n grows. The adaptive "
        "rule (red) lowers the temperature when the row is diffuse, which delays the decline but cannot stop it.")

# --- 2-6 on the model ---------------------------------------------------------------------------

if not ns:
    st.error("Choose at least one item count n to run the model views.")
    st.stop()
params = S.SweepParams(ns=ns, samples=int(samples), layers=only)
with analysis_errors(S.SharpnessError):
    result = cached_run("sweep", S.size_sweep, handle, params, label="Running max-retrieval prompts ...")

ex = result.example
st.caption(f"Prompt format: **{result.format}** · example at n = {ex.n}: `{ex.text}` → `{ex.answer}`"
           + (f" · skipped n = {', '.join(map(str, result.skipped))} (longer than the model's context)"
              if result.skipped else ""))

st.header("2 · Each head as n grows")
st.plotly_chart(F.size_figure(result, layer, head, sink), key="fig_size")
explain("For the selected head, the attention row of the last prompt token (the one that must produce "
        "the answer), averaged over prompts. A sharp head keeps low entropy and puts its weight on the "
        "largest number's token; a dispersing head drifts towards uniform (dotted 1/n).")

st.subheader("Your own prompt")
default_text, default_target = example_prompt(handle.spec.label, handle.tokenizer)
text = st.text_area("Prompt", value=url_param("prompt", default_text, str), key="sh_prompt", height=80)
target = st.text_input("Target span (text whose weight is reported)", value=url_param("target", default_target, str),
                       key="sh_target")
set_url_params(prompt=text, target=target)
if not text.strip():
    st.error("The prompt is empty: enter some text, the statistics are about how its last token attends.")
else:
    try:
        hosting.check_texts(text, target)  # the deployment's longest prompt
        pres = prompt_stats(handle.spec.label, S.PromptParams(text, target, rule_of(theta, only)).to_json(), handle)
    except S.SharpnessError as exc:
        show_error(exc)
        pres = None
    if pres is not None:
        soft = pres.softmax if sink else pres.softmax_no_sink
        temp = pres.tempered if sink else pres.tempered_no_sink
        label = pres.params.rule.label
        row = metric_row()
        for name, field, fmt in (("Entropy (nats)", "entropy", "{:.3f}"), ("H / ln n", "entropy_norm", "{:.3f}"),
                                 ("Max weight", "max_weight", "{:.3f}"), ("Target weight", "target_weight", "{:.3f}"),
                                 ("Logit spread δ", "spread", "{:.2f}")):
            after = getattr(temp, field)[layer][head]
            before = getattr(soft, field)[layer][head]
            row.metric(f"{name}, {label}", fmt.format(after), delta=fmt.format(after - before),
                       delta_color="off", help=f"softmax: {fmt.format(before)}")
        st.caption(f"Next token: softmax → `{pres.next_token_softmax}`, {label} → `{pres.next_token_tempered}`. "
                   f"β applied at layer {layer}, head {head}: {temp.beta[layer][head]:.3f}.")
        st.plotly_chart(F.prompt_weights_figure(pres, layer, head), key="fig_prompt")
        explain("The last token's attention over your prompt in the selected head, under plain softmax and "
                "under the chosen temperature (the whole model runs with it). The dashed green lines mark "
                "the target span; the metrics compare the chosen temperature with softmax (difference below).")

st.header("3 · Temperature sweep")
st.plotly_chart(F.theta_sweep_figure(result, layer, head, sink), key="fig_theta")
explain("Every head of the model runs at the same fixed θ (and, last, with the adaptive rule). Lower θ "
        "sharpens the selected head at every n; the P(correct answer) panel shows whether that helps the "
        "model name the largest number.")

n_view_choices = [p.n for p in result.points]
n_view = st.selectbox("n for the views below", n_view_choices,
                      index=n_view_choices.index(url_param("n_view", n_view_choices[-1], int, n_view_choices)),
                      key="sh_n_view")
set_url_params(n_view=n_view)

st.header("4 · The adaptive rule, β(H)")
st.plotly_chart(F.beta_figure(result, n_view), key="fig_beta")
explain("The paper's rule picks β = 1/θ from the entropy H of the plain softmax row. It only sharpens "
        "(β > 1) inside the shaded band; sharp rows (H ≤ 0.5) and very diffuse rows are left as they "
        "are. Dots: every head of this model at the answer position, placed at its mean entropy over the "
        "prompts (hover for the mean β it actually got).")

st.header("5 · Which heads are sharp")
st.plotly_chart(F.heatmap_figure(result, n_view, sink), key="fig_heat")
explain("Normalised entropy H / ln n for every layer and head (0: all weight on one key; 1: uniform), "
        "with plain softmax and with adaptive θ, on the same colour scale.")

st.header("6 · Accuracy vs n")
rows = result.accuracy_table()
st.dataframe(rows, hide_index=True, column_config={
    k: st.column_config.NumberColumn(format="%.3f") for k in rows[0] if k not in ("n", "tokens")})
st.plotly_chart(F.accuracy_figure(result), key="fig_acc")
rl, rh = result.retrieval_head()
explain(f"Share of {result.params.samples} prompts per n where the model's most likely next token is the "
        "largest number, the mean probability it gives that number, and the share answered with the "
        "second-largest number instead (a near miss), with softmax in every head and with "
        f"adaptive θ in every head. Max-item weight: attention of the answer position on the largest "
        f"number's tokens, in the retrieval head (layer {rl}, head {rh}: the one with the most such weight at "
        "the smallest n) and averaged over all heads.")

share_bar("sharpness", title=f"Attention sharpness on {handle.spec.label}", params=params.to_dict(),
          result=result, model=handle.spec.label,
          figures={"Each head as n grows": F.size_figure(result, layer, head, sink),
                   "Temperature sweep": F.theta_sweep_figure(result, layer, head, sink),
                   "Heatmap": F.heatmap_figure(result, n_view, sink), "Accuracy": F.accuracy_figure(result)},
          tables={"accuracy": rows})

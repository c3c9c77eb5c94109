"""Attention sharpness: how each head disperses as inputs grow, and whether temperature helps."""
from __future__ import annotations

import streamlit as st

from analysis import sharpness
from analysis.errors import SettingsError
from analysis.settings import url_name
from components import hosting
from components.common import (EMPTY_LIST, analysis_errors, explain, field_row, metric_row, require_model,
                               set_url_params, show_error, url_list, url_param)
from components.figures import sharpness as F
from components.params_form import ParamsForm, fields_of
from components.presets import preset_bar
from components.runs import cached_run
from components.share import share_bar

N_CHOICES = [2, 4, 8, 16, 32, 64, 128, 256, 512]
THETA_CHOICES = ["0.125", "0.25", "0.5", "1", "2", "4", "adaptive"]
RULE_FIELDS = [(f, cls) for f, cls in sharpness.RULES.settings() if url_name(f)]  # the adaptive rule's

st.title("Attention sharpness")
st.write(
    "With bounded attention logits every softmax weight lies between e^(-δ/θ)/n and e^(δ/θ)/n "
    "(δ the logit spread, θ the temperature), so a fixed head must spread its attention as the number "
    "of items n grows — *Softmax is not enough (for sharp size generalisation)*, ICML 2025. This panel "
    "measures that on the loaded model with prompts that ask for one item among n (max retrieval on the "
    "demo LM, which was trained on it; key-value recall on other language models) and tries the paper's "
    "fix, an adaptive temperature chosen per attention row from its entropy."
)

preset_bar("attention-sharpness", widget_prefix="sh_")
handle = require_model(*sharpness.ANALYSIS.kinds, panel="Attention sharpness")
info = handle.info
first_view = sharpness.default_params(handle)  # this model's first view: fewer, shorter prompts on a real LM


@st.cache_data(max_entries=8, show_spinner=False)
def lemma(params_json: str) -> sharpness.LemmaResult:
    return sharpness.lemma_demo(sharpness.LemmaParams.from_json(params_json))


@st.cache_data(max_entries=32, show_spinner="Running the prompt ...")
def prompt_stats(model_label: str, params_json: str, _handle) -> sharpness.PromptResult:
    return sharpness.analyse_prompt(_handle, sharpness.PromptParams.from_json(params_json))


@st.cache_data(max_entries=8, show_spinner=False)
def example_prompt(model_label: str, _tokenizer) -> tuple[str, str]:
    """A prompt of the model's task to start from: 16 items of max retrieval, or 4 of key-value recall."""
    try:
        pr = sharpness.build_prompt(_tokenizer, 16, seed=0)
        if pr.task == sharpness.RECALL:
            pr = sharpness.build_prompt(_tokenizer, 4, seed=0)
    except SettingsError:  # the task cannot be written for this tokenizer
        return "", ""
    return pr.text, pr.answer


def rule_of(choice: str, layers: list[int] | None, rules: dict) -> sharpness.Temperature:
    layers = tuple(layers) if layers is not None else None
    if choice == "adaptive":
        return sharpness.Temperature("adaptive", rules.get("adaptive", {}), layers)
    return sharpness.Temperature.fixed(float(choice), layers)


def params_of(values: dict, ns: list[int], only: list[int] | None) -> sharpness.SweepParams:
    rules = sharpness.rule_settings(**{f.name: values[f.name] for f, _ in RULE_FIELDS if f.name in values})
    return sharpness.SweepParams(ns=ns, thetas=first_view.thetas, samples=values["samples"], layers=only,
                                 rules=rules)


def check_link(raw: dict) -> None:
    sharpness.validate_params(params_of(raw, ns or [2], None), info.layers)
    sharpness.lemma_demo(sharpness.LemmaParams(spread=raw["spread"]))


# --- controls: n, layers and the view are choices of this page; the rest drawn from the settings' own fields

form = ParamsForm("sh_")
with st.container(border=True):
    all_layers = list(range(info.layers))
    lists = st.columns(2)
    # pills, not multiselects: every choice is shown as a one-click toggle, and wrap=True lets them wrap
    # (a multiselect's chips, and pills directly in a column by default, scroll sideways and hid 64 and
    # 128 at 1024 px)
    ns = sorted(lists[0].pills("Item counts n", N_CHOICES, selection_mode="multi", wrap=True,
                               default=url_list("ns", first_view.ns, N_CHOICES), key="sh_ns",
                               help="How many items each retrieval prompt lists.") or [])
    tl_default = url_list("tlayers", all_layers, all_layers, allow_empty=True)
    tlayers = sorted(lists[1].pills("Apply the temperature in layers", all_layers, selection_mode="multi", wrap=True,
                                    default=tl_default, key="sh_tlayers",
                                    help="θ and adaptive θ act in these layers only; the others keep plain "
                                         "softmax. The paper applies it everywhere.") or [])
    # fixed-width controls that wrap whole on a narrow screen (equal columns emptied the layer and head
    # boxes and cut the toggle's label at 1024 px)
    row = field_row(gap="medium")
    form.draw(row, fields_of(sharpness.SweepParams, ["samples"]), defaults={"samples": first_view.samples},
              width=120)
    theta = row.select_slider("Temperature θ", THETA_CHOICES, value=url_param("theta", "adaptive", str, THETA_CHOICES),
                              key="sh_theta", help="θ < 1 sharpens, θ > 1 flattens; 'adaptive' is the paper's rule.",
                              width=220)
    form.draw(row, RULE_FIELDS, width=220)
    sink = row.toggle("Count first token", value=url_param("sink", "1", str, ["0", "1"]) == "1", key="sh_sink",
                      help="Off: drop the first (attention-sink) token and renormalise before measuring.",
                      width="content")
only = None if tlayers == all_layers else tlayers

# --- 1. lemma demo (no model) -------------------------------------------------------------------

st.header("1 · The lemma, without a model")
form.draw(st.container(), fields_of(sharpness.LemmaParams, ["spread"]), width="stretch")
form.mirror()
form.check(check_link)
params = params_of(form.values, ns, only)
lemma_result = lemma(sharpness.LemmaParams(spread=form.values["spread"], rules=params.rules).to_json())
st.plotly_chart(F.lemma_figure(lemma_result), key="fig_lemma")
explain("n logits, one of them δ above the rest. At any fixed θ the weight on the maximum falls like 1/n "
        "and the entropy climbs towards ln n (dotted): softmax cannot stay sharp as n grows. In this "
        "model-free picture the adaptive rule (red) lowers the temperature when the row is diffuse, which "
        "delays the decline but cannot stop it. A trained model need not follow: on the demo LM the rule "
        "delays nothing (section 6).")

# --- 2-6 on the model ---------------------------------------------------------------------------

if not ns:
    set_url_params(theta=theta, sink=int(sink), tlayers=tlayers or EMPTY_LIST, ns=[])
    st.error("Choose at least one item count n to run the model views.")
    st.stop()
with analysis_errors():
    result = cached_run("sweep", sharpness.size_sweep, handle, params, label="Running the retrieval prompts ...")

# the layer and head shown start at the retrieval head found (the most weight on the answer item at the smallest n)
found_layer, found_head = result.retrieval_head()
layer = row.selectbox("Layer", all_layers, index=url_param("layer", found_layer, int, all_layers), key="sh_layer",
                      width=90)
head = row.selectbox("Head", list(range(info.heads)), key="sh_head", width=90,
                     index=url_param("head", found_head, int, list(range(info.heads))))
set_url_params(ns=ns, theta=theta, layer=layer, head=head, sink=int(sink), tlayers=tlayers or EMPTY_LIST)

ex = result.example
task_note = ("key-value recall through the model's chat template" if ex.chat else result.task)
st.caption(f"Task: **{task_note}** ({result.format} format) · example at n = {ex.n}: `{ex.text[-300:]}` → "
           f"`{ex.answer}`" + (f" · skipped n = {', '.join(map(str, result.skipped))} (more items than the task "
                                "writes, or longer than the model's context)" if result.skipped else ""))

st.header("2 · Each head as n grows")
st.plotly_chart(F.size_figure(result, layer, head, sink), key="fig_size")
explain("For the selected head, the attention row of the last prompt token (the one that must produce "
        f"the answer), averaged over prompts. A sharp head keeps low entropy and puts its weight on the "
        f"{'largest number' if result.item == 'max-item' else 'asked key’s code'}; a dispersing head drifts "
        "towards uniform (dotted 1/n).")

st.subheader("Your own prompt")
default_text, default_target = example_prompt(handle.spec.label, handle.tokenizer)
form.draw(st.container(), fields_of(sharpness.PromptParams, ["text", "target"]), width="stretch",
          defaults={"text": default_text, "target": default_target}, overrides={"text": {"height": 80}})
form.mirror()
text, target = form.values["text"], form.values["target"]
if not text.strip():
    st.error("The prompt is empty: enter some text, the statistics are about how its last token attends.")
else:
    try:
        hosting.check_texts(text, target)  # the deployment's longest prompt
        pres = prompt_stats(handle.spec.label, sharpness.PromptParams(text, target, rule_of(theta, only, params.rules)
                                                                      ).to_json(), handle)
    except SettingsError as exc:  # this prompt cannot be measured
        show_error(exc)
        pres = None
    if pres is not None:
        soft = pres.softmax if sink else pres.softmax_no_sink
        temp = pres.tempered if sink else pres.tempered_no_sink
        label = pres.params.rule.label
        metrics = metric_row()
        for name, field, fmt in (("Entropy (nats)", "entropy", "{:.3f}"), ("H / ln n", "entropy_norm", "{:.3f}"),
                                 ("Max weight", "max_weight", "{:.3f}"), ("Target weight", "target_weight", "{:.3f}"),
                                 ("Logit spread δ", "spread", "{:.2f}")):
            after = getattr(temp, field)[layer][head]
            before = getattr(soft, field)[layer][head]
            metrics.metric(f"{name}, {label}", fmt.format(after), delta=fmt.format(after - before),
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
        "model give the right answer.")

n_view_choices = [p.n for p in result.points]
n_view = st.selectbox("n for the views below", n_view_choices,
                      index=n_view_choices.index(url_param("n_view", n_view_choices[-1], int, n_view_choices)),
                      key="sh_n_view")
set_url_params(n_view=n_view)

st.header("4 · The adaptive rule, β(H)")
st.plotly_chart(F.beta_figure(result, n_view), key="fig_beta")
explain("The paper's rule picks β = 1/θ from the entropy H of the plain softmax row. It only sharpens "
        "(β > 1) inside the shaded band; sharp rows (H at most the threshold, 0.5 in the paper) and very "
        "diffuse rows are left as they are. Dots: every head of this model at the answer position, placed at "
        "its mean entropy over the prompts (hover for the mean β it actually got).")

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
if result.item == "max-item":
    scored = ("where the model's most likely next token is the largest number, the mean probability it gives "
              "that number, and the share answered with the second-largest number instead (a near miss)")
else:
    scored = ("where the asked key's code scores highest among the codes in the prompt (each code scored by "
              "the probability of all its tokens; chance is one over the number of codes, dotted), and the "
              "mean probability the model gives that code")
explain(f"Share of {result.params.samples} prompts per n {scored}, with softmax in every head and with "
        f"adaptive θ in every head. {result.item.capitalize()} weight: attention of the answer position on "
        f"the answer item's tokens, in the retrieval head (layer {rl}, head {rh}: the one with the most such "
        "weight at the smallest n) and averaged over all heads.")

st.subheader("The retrieval heads as n grows")
st.plotly_chart(F.retrieval_heads_figure(result), key="fig_heads")
st.dataframe(result.head_table(), hide_index=True, column_config={
    k: st.column_config.NumberColumn(format="%.3f") for k in result.head_table()[0] if k != "n"})
explain("The three heads that put the most weight on the answer item at the smallest n, found automatically "
        "from the softmax runs: their weight on it (and their largest weight on any token) at every n. A head "
        "that selects one item among n keeps this weight near 1; the lemma says a fixed softmax head cannot "
        "keep it as n grows.")

share_bar("sharpness", title=f"Attention sharpness on {handle.spec.label}", params=params.to_dict(),
          result=result, model=handle.spec.label,
          figures={"Each head as n grows": F.size_figure(result, layer, head, sink),
                   "Temperature sweep": F.theta_sweep_figure(result, layer, head, sink),
                   "Heatmap": F.heatmap_figure(result, n_view, sink), "Accuracy": F.accuracy_figure(result),
                   "Retrieval heads": F.retrieval_heads_figure(result)},
          tables={"accuracy": rows, "retrieval heads": result.head_table()})

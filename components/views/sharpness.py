"""The attention-sharpness page: the lemma without a model, then the size sweep on the model, its heads,
the user's own prompt and the temperature rules. Controls: SweepParams and the rules' settings; view
state: SharpnessState (analysis/sharpness/params.py)."""
from __future__ import annotations

from dataclasses import replace

import streamlit as st

from analysis import sharpness
from analysis.framework.errors import SettingsError
from components.common import table, explain, field_row, metric_row
from components.figures import sharpness as F
from components.share import share_bar
from components.view import Headline, Metric, Page, Section, View


@st.cache_data(max_entries=8, show_spinner=False)
def lemma(params_json: str) -> sharpness.LemmaResult:
    """The lemma's curves: a few thousand softmaxes, no model."""
    return sharpness.lemma_demo(sharpness.LemmaParams.from_json(params_json))


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


class SharpnessView(View):
    panel = "sharpness"
    prefix = "sh_"
    intro = (
        "With bounded attention logits every softmax weight lies between e^(-δ/θ)/n and e^(δ/θ)/n "
        "(δ the logit spread, θ the temperature), so a fixed head must spread its attention as the number "
        "of items n grows — *Softmax is not enough (for sharp size generalisation)*, ICML 2025. This panel "
        "measures that on the loaded model with prompts that ask for one item among n (max retrieval on the "
        "demo LM, which was trained on it; key-value recall on other language models) and tries the paper's "
        "fix, an adaptive temperature chosen per attention row from its entropy."
    )
    # fixed-width controls that wrap whole on a narrow screen (equal columns emptied the layer and head
    # boxes and cut the toggle's label at 1024 px); the layer and head join the row once the sweep found
    # its retrieval head
    sections = (Section("lists", layout="columns"), Section(("row", "rules")))
    later = ("lemma", "prompt")

    def layers(self, page: Page) -> list[int]:
        return list(range(page.handle.info.layers))

    def defaults(self, page: Page) -> dict:
        first = sharpness.default_params(page.handle)  # fewer, shorter prompts on a real LM
        return {"ns": first.ns, "samples": first.samples, "tlayers": self.layers(page)}

    def overrides(self, page: Page, values: dict) -> dict:
        return {"tlayers": {"choices": self.layers(page)}}

    def params_of(self, page: Page, values: dict) -> sharpness.SweepParams:
        tlayers = page.state.values.get("tlayers", self.layers(page))
        return sharpness.SweepParams.from_flat(
            values, thetas=sharpness.default_params(page.handle).thetas,
            layers=None if sorted(tlayers) == self.layers(page) else sorted(tlayers))

    def validate(self, page: Page, params: sharpness.SweepParams) -> None:
        sharpness.validate_params(params if params.ns else replace(params, ns=[2]), None)  # no n: said by `run`

    def run(self, page: Page, params: sharpness.SweepParams):
        if not params.ns:
            st.error("Choose at least one item count n to run the model views.")
            st.subheader("The lemma, without a model")  # it needs no n
            st.plotly_chart(self.lemma_figure(page, params, st.container()), key="fig_lemma")
            st.caption(LEMMA_NOTE)
            st.stop()
        return page.run("sweep", sharpness.size_sweep, params, label="Running the retrieval prompts ...")

    def headline(self, page: Page, params: sharpness.SweepParams, result: sharpness.SweepResult) -> Headline:
        """The retrieval head's weight and the accuracy, smallest n against largest, and the selected head
        as n grows (the lemma's curves under the lemma preset)."""
        values = page.values
        sink = values["sink"]
        found_layer, found_head = result.retrieval_head()  # the head with the most weight on the answer item
        row = page.headline_controls.container(horizontal=True, wrap=True, vertical_alignment="bottom", gap="small")
        page.layer = page.control("layer", row, default=found_layer, choices=self.layers(page))
        page.head = page.control("head", row, default=found_head, choices=list(range(page.handle.info.heads)))
        rows = result.accuracy_table()
        first, last = rows[0], rows[-1]
        rule = "adaptive" if values["theta"] == "adaptive" else "softmax"
        weight = f"{rule} {result.item} weight L{found_layer}H{found_head}"
        metrics = (
            Metric(f"Retrieval head L{found_layer}H{found_head}: weight on the {result.item}",
                   f"{last[weight]:.2f} at n = {last['n']}", f"{last[weight] - first[weight]:+.2f} from n = {first['n']}",
                   help=f"{rule}: attention of the answer position on the answer item, mean over the prompts"),
            Metric(f"Accuracy, {rule}", f"{last[f'{rule} accuracy']:.0%} at n = {last['n']}",
                   f"{last[f'{rule} accuracy'] - first[f'{rule} accuracy']:+.0%} from n = {first['n']}"
                   .replace("%", " pts"),
                   help=f"{first[f'{rule} accuracy']:.0%} at n = {first['n']}"
                   + (f"; chance {last['chance']:.0%} at n = {last['n']}" if "chance" in last else "")),
        )
        if page.preset is not None and page.preset.name == "lemma":
            return Headline(metrics, self.lemma_figure(page, params, page.headline_controls), key="fig_lemma")
        return Headline(metrics, F.size_figure(result, page.layer, page.head, sink), key="fig_size")

    def lemma_figure(self, page: Page, params: sharpness.SweepParams, container):
        """The lemma's curves at the spread δ of its control, drawn in `container`."""
        spread = page.draw(container, "lemma", layout="stack")["spread"]
        return F.lemma_figure(lemma(sharpness.LemmaParams(spread=spread, rules=params.rules).to_json()))

    def show(self, page: Page, params: sharpness.SweepParams, result: sharpness.SweepResult) -> None:
        handle, values = page.handle, page.values
        theta, sink = values["theta"], values["sink"]
        layer, head = page.layer, page.head
        ex = result.example
        task_note = ("key-value recall through the model's chat template" if ex.chat else result.task)
        page.headline_controls.caption(
            f"Task: **{task_note}** ({result.format} format) · example at n = {ex.n}: `{ex.text[-300:]}` → "
            f"`{ex.answer}`" + (f" · skipped n = {', '.join(map(str, result.skipped))} (more items than the "
                                "task writes, or longer than the model's context)" if result.skipped else ""))
        lemma_first = page.preset is not None and page.preset.name == "lemma"  # the headline is the lemma
        page.headline_controls.caption(LEMMA_NOTE if lemma_first else size_note(result))
        chapters = ["Each head as n grows" if lemma_first else "The lemma, without a model", "Temperature sweep",
                    "The adaptive rule β(H)", "Which heads are sharp", "Accuracy vs n", "Your own prompt"]
        chapter = page.chapter(chapters, on_demand=True)  # the headline alone first: drawn in <= 3 s (#47)
        if chapter == "Each head as n grows":
            st.plotly_chart(F.size_figure(result, layer, head, sink), key="fig_size")
            st.caption(size_note(result))
        elif chapter == "The lemma, without a model":
            st.plotly_chart(self.lemma_figure(page, params, st.container()), key="fig_lemma")
            st.caption(LEMMA_NOTE)
        elif chapter == "Temperature sweep":
            st.plotly_chart(F.theta_sweep_figure(result, layer, head, sink), key="fig_theta")
            explain("Every head of the model runs at the same fixed θ (and, last, with the adaptive rule). Lower θ "
                    "sharpens the selected head at every n; the P(correct answer) panel shows whether that helps the "
                    "model give the right answer.")
        elif chapter in ("The adaptive rule β(H)", "Which heads are sharp"):
            n_views = [p.n for p in result.points]
            n_view = page.control("n_view", default=n_views[-1], choices=n_views)
            if chapter == "The adaptive rule β(H)":
                st.plotly_chart(F.beta_figure(result, n_view), key="fig_beta")
                explain("The paper's rule picks β = 1/θ from the entropy H of the plain softmax row. It only "
                        "sharpens (β > 1) inside the shaded band; sharp rows (H at most the threshold, 0.5 in the "
                        "paper) and very diffuse rows are left as they are. Dots: every head of this model at the "
                        "answer position, placed at its mean entropy over the prompts (hover for the mean β it "
                        "actually got).")
            else:
                st.plotly_chart(F.heatmap_figure(result, n_view, sink), key="fig_heat")
                explain("Normalised entropy H / ln n for every layer and head (0: all weight on one key; 1: "
                        "uniform), with plain softmax and with adaptive θ, on the same colour scale.")
        elif chapter == "Accuracy vs n":
            accuracy_section(result)
        elif chapter == "Your own prompt":
            own_prompt(page, params, theta, sink, layer, head)

        n_view = page.values.get("n_view") or page.link_value("n_view", default=result.points[-1].n)
        share_bar("sharpness", title=f"Attention sharpness on {handle.spec.label}", params=params.to_dict(),
                  result=result, model=handle.spec.label,
                  figures={"Each head as n grows": F.size_figure(result, layer, head, sink),
                           "Temperature sweep": F.theta_sweep_figure(result, layer, head, sink),
                           "Heatmap": F.heatmap_figure(result, n_view, sink), "Accuracy": F.accuracy_figure(result),
                           "Retrieval heads": F.retrieval_heads_figure(result)},
                  tables={"accuracy": result.accuracy_table(), "retrieval heads": result.head_table()})


LEMMA_NOTE = (":material/info: **What am I looking at?** n logits, one of them δ above the rest. At any fixed θ the "
              "weight on the maximum falls like 1/n and the entropy climbs towards ln n (dotted): softmax cannot "
              "stay sharp as n grows. In this model-free picture the adaptive rule (red) lowers the temperature "
              "when the row is diffuse, which delays the decline but cannot stop it. A trained model need not "
              "follow: on the demo LM the rule delays nothing (Accuracy vs n).")


def size_note(result: sharpness.SweepResult) -> str:
    return (":material/info: **What am I looking at?** For the selected head, the attention row of the last prompt "
            "token (the one that must produce the answer), averaged over prompts. A sharp head keeps low entropy "
            f"and puts its weight on the {'largest number' if result.item == 'max-item' else 'asked key’s code'}; "
            "a dispersing head drifts towards uniform (dotted 1/n).")


def accuracy_section(result: sharpness.SweepResult) -> list[dict]:
    """Accuracy vs n and the retrieval heads as n grows; the accuracy rows (for the share bar)."""
    rows = result.accuracy_table()
    table(rows, column_config={
        k: st.column_config.NumberColumn(format="%.3f") for k in rows[0] if k not in ("n", "tokens")})
    st.plotly_chart(F.accuracy_figure(result), key="fig_acc")
    rl, rh = result.retrieval_head()
    if result.item == "max-item":
        scored = ("where the model's most likely next token is the largest number, the mean probability it "
                  "gives that number, and the share answered with the second-largest number instead (a near "
                  "miss)")
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
    table(result.head_table(), column_config={
        k: st.column_config.NumberColumn(format="%.3f") for k in result.head_table()[0] if k != "n"})
    explain("The three heads that put the most weight on the answer item at the smallest n, found "
            "automatically from the softmax runs: their weight on it (and their largest weight on any token) at "
            "every n. A head that selects one item among n keeps this weight near 1; the lemma says a fixed "
            "softmax head cannot keep it as n grows.")
    return rows


def own_prompt(page: Page, params: sharpness.SweepParams, theta: str, sink: bool, layer: int, head: int) -> None:
    """The user's own prompt, through the runner: how its last token attends in the selected head."""
    st.subheader("Your own prompt")
    default_text, default_target = example_prompt(page.handle.spec.label, page.handle.tokenizer)
    values = page.draw(st.container(), "prompt", layout="stack", defaults={"text": default_text,
                                                                            "target": default_target},
                       overrides={"text": {"height": 80}})
    page.mirror()
    text, target = values["text"], values["target"]
    if not text.strip():
        st.error("The prompt is empty: enter some text, the statistics are about how its last token attends.")
        return
    prompt = sharpness.PromptParams(text, target, rule_of(theta, params.layers, params.rules))
    pres = page.run("prompt", sharpness.analyse_prompt, prompt, label="Running the prompt ...", stop=False)
    if pres is None:
        return
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

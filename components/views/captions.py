"""The caption-correction page (CapMAS): an image and its caption, the agents and the threshold, then one
run (analysis/captions: decompose, verify each claim alone, rewrite) and its claims, scores and metrics.
Controls: CorrectionParams and the chosen agents' settings; view state: CaptionState
(analysis/captions/params.py)."""
from __future__ import annotations

import io

import streamlit as st

from analysis import captions
from analysis.framework.images import open_image
from analysis.model_access.models import ModelSpec, load_model, zoo_models
from analysis.framework.settings import labelled
from components import hosting  # uploads under the deployment's limits
from components.common import table, analysis_errors, explain, field_row
from components.figures import captions as F
from components.params_form import ParamsForm
from components.share import share_bar
from components.view import Headline, Metric, Page, View

WEAK = "shapes-vlm-weak"
PI_SHOWN = 10.0  # the slider's end: above -log ε = 9.2 (the default ε) every claim is kept
ROLES = {"decomposer": captions.DECOMPOSERS, "verifier": captions.VERIFIERS, "rewriter": captions.REWRITERS}


# Two at once: the weak captioner and the decomposer/rewriter LM are both used on every run.
@st.cache_resource(max_entries=2, show_spinner="Loading the decomposer/rewriter model ...")
def agent_lm(label: str):
    return load_model(ModelSpec.parse(label))


@st.cache_data(max_entries=64, show_spinner=False)
def scene_png(seed: int) -> bytes:
    world = captions.shapes_world()
    buf = io.BytesIO()
    world.render(world.generate_scene(seed)).save(buf, format="PNG")
    return buf.getvalue()


class CaptionView(View):
    panel = "captions"
    prefix = "cap_"
    intro = (
        "A detailed caption is split into atomic claims, the vision-language model answers a yes/no "
        "question about **each claim alone**, and claims it does not confirm are removed by a rewriter "
        "that adds nothing new — the multi-agent pipeline of *CapMAS* (ICML 2025). On Shapes World "
        "scenes the ground truth is known, so factuality and coverage are exact; on anything else they "
        "are not measurable, and the page says so."
    )
    later = ("caption", "agents", "threshold", "ground")  # drawn by `controls` below, around the image

    def defaults(self, page: Page) -> dict:
        world = captions.shapes_world() if captions.has_shapes_world() else None
        return {"source": "scene" if world else "upload",
                "seed": world.split_seeds("test", 1)[0] + 3 if world else 0,
                "ground": page.handle.info.parameters < 50_000_000,
                "lm": captions.SHAPES_LM if "shapes-lm" in zoo_models() and captions.speaks_shapes_world(page.handle)
                else captions.OWN_LM}

    def controls(self, page: Page) -> captions.CorrectionParams:
        defaults = self.defaults(page)
        left, right = st.columns([1, 2], gap="large")
        with left:
            self.upload = None
            source = page.control("source", choices=["scene", "upload"] if captions.has_shapes_world() else ["upload"],
                                  default=defaults["source"], width="content")
            seed = None
            if source == "scene":
                seed = page.control("seed", default=defaults["seed"])
                image = open_image(scene_png(seed))
            else:
                file = hosting.file_uploader("Image (PNG, JPEG, GIF, BMP, WebP)", key="cap_upload",
                                             type=["png", "jpg", "jpeg", "gif", "bmp", "webp"])
                if file is None:
                    st.info("Upload an image, or switch to a Shapes World scene.")
                    st.stop()
                self.upload = captions.Upload(file.getvalue())  # every step on it is keyed by its bytes
                with analysis_errors(prefix="Cannot use this upload: "):
                    image = self.upload.image
            self.image, self.seed = image, seed
            st.image(image, caption=f"Scene {seed}" if seed is not None else "Uploaded image", width="stretch")
            if seed is not None:
                with st.expander("Ground truth of this scene"):
                    world = captions.shapes_world()
                    st.write(world.caption(world.generate_scene(seed)))
        with right:
            caption = self.caption(page, seed)
            with st.expander("Agents and threshold", expanded=True):
                values = self.agents_and_threshold(page, defaults)
        return self.correction(page, {**values, "caption": caption}, self.agent_values)

    def caption(self, page: Page, seed: int | None) -> str:
        """The caption to check: pasted, or generated through the runner by the VLM or the weak captioner."""
        handle = page.handle
        sources = ["vlm"] + (["weak"] if WEAK in zoo_models() else []) + ["paste"]
        labels = {"vlm": f"generate with {handle.spec.label}", "weak": f"generate with zoo:{WEAK} (hallucinates)",
                  "paste": "paste a caption"}
        cap = page.control("cap", choices=sources, default="weak" if "weak" in sources and seed is not None else "vlm",
                           format_func=labels.get, key="from", width="content")
        if cap == "paste":
            return page.draw(st.container(), "caption", layout="stack",
                             overrides={"caption": {"height": 100}})["caption"]
        with analysis_errors(prefix="Could not generate a caption: "):
            captioner = handle if cap == "vlm" else agent_lm(f"zoo:{WEAK}")
            if seed is not None:
                text = page.run("caption", captions.caption_scene, captions.SceneCaptionParams(scene_seed=seed),
                                label="Captioning", handle=captioner).text
            else:
                text = page.run("caption", captions.caption_upload, captions.CaptionParams(), label="Captioning",
                                handle=captioner, upload=self.upload).text
        st.text_area("Caption to check (generated)", value=text, disabled=True, height=100)
        return text

    def agents_and_threshold(self, page: Page, defaults: dict) -> dict:
        """The agents, each chosen agent's own settings, π and the probability form, grounding."""
        handle = page.handle
        # fixed-width fields that wrap whole: equal columns cut their values ("zoo:shapes-l…") and, at
        # 1024 px, their labels mid-word
        row = field_row()
        lm_choices = ([captions.SHAPES_LM] if "shapes-lm" in zoo_models() else []) + [captions.OWN_LM]
        lm_choice = page.control("lm", row, choices=lm_choices, default=defaults["lm"], width=200)
        page.draw(row, "agents", layout="inline", overrides={"verifier": {"label": "Verifier (the loaded VLM)"}})
        with analysis_errors(prefix="Could not load the decomposer/rewriter model: "):
            lm = agent_lm(lm_choice) if lm_choice != captions.OWN_LM else handle
        values = page.form.values
        with analysis_errors():
            chosen = {"decomposer": captions.resolve_agent("decomposer", values["decomposer"], lm),
                      "rewriter": captions.resolve_agent("rewriter", values["rewriter"], lm),
                      "verifier": captions.resolve_verifier(values["verifier"], handle)}
        # each chosen agent's own settings (a role's settings keep one URL name: dec_tokens, rew_tokens, ...)
        forms = {role: ParamsForm(f"cap_{role[:3]}_") for role in ROLES}
        row = field_row()
        for role, registry in ROLES.items():
            cls = registry.get(chosen[role])
            forms[role].draw(row, [(f, cls) for f in labelled(cls)])
        row = st.container(horizontal=True, wrap=True)
        page.draw(row, "threshold", layout="inline", overrides={
            "pi": {"widget": "slider", "high": PI_SHOWN, "step": 0.05, "width": 300,
                   "label": "Threshold π (nats): drop a claim when H(u) > π"},
            "probabilities": {"label": "p_True / p_False in H", "key": "prob",
                              "help": "Raw: the next-token probabilities of yes and no, as CapMAS defines H. "
                                      "Renormalised: p_T / (p_T + p_F), the answer among yes and no only — it "
                                      "ignores probability that went to other tokens."}})
        page.draw(st.container(), "ground", defaults={"ground": defaults["ground"]}, overrides={"ground": {
            "width": "content", "help": "Integrated Gradients costs about 8 forward/backward passes per claim; off "
                                        "by default for models above 50 M parameters."}})
        page.draw(field_row(), None)  # a setting of no group: no edit here (components/view.py)
        st.caption("auto: the demo LM for Shapes World, an instruct model's chat prompts otherwise, "
                   "the grammar reference as a last resort. A language model's rewrite is checked and replaced "
                   "if it says what was not kept (the demo LM: by the grammar's; an instruct LM: by the kept "
                   "claims). Verifier: the loaded VLM.")
        for form in forms.values():
            form.mirror()
        self.lm, self.chosen = lm, chosen
        self.agent_values = {role: form.values for role, form in forms.items()}
        # a link's agent settings out of range: the CLI's message; the controls already show the nearest allowed
        for role, form in forms.items():
            form.check(lambda raw, r=role: self.correction(
                page, {**page.form.values, "caption": ""}, {**self.agent_values, r: raw}).validate())
        return dict(page.form.values)

    def correction(self, page: Page, values: dict, agents: dict) -> captions.CorrectionParams:
        chosen = self.chosen
        own = {f.name for f in labelled(captions.CorrectionParams)}
        return captions.CorrectionParams(
            **{k: v for k, v in values.items() if k in own}, scene_seed=self.seed,
            decomposers={chosen["decomposer"]: agents["decomposer"]} if agents["decomposer"] else {},
            verifiers={chosen["verifier"]: agents["verifier"]} if agents["verifier"] else {},
            rewriters={chosen["rewriter"]: agents["rewriter"]} if agents["rewriter"] else {})

    def params_of(self, page: Page, values: dict) -> captions.CorrectionParams:
        return self.correction(page, {**values, "caption": values.get("caption", "")}, self.agent_values)

    def validate(self, page: Page, params: captions.CorrectionParams) -> None:
        params.validate()

    def run(self, page: Page, params: captions.CorrectionParams):
        if not params.caption.strip():
            st.info("Paste a caption (or generate one) to check it.")
            st.stop()
        models = {"lm": self.lm}
        with analysis_errors():
            params.validate()
        if self.upload is not None:
            return page.run("correct", captions.correct_upload, params, label="Correcting the caption",
                            models=models, upload=self.upload)
        return page.run("correct", captions.correct_scene, params, label="Correcting the caption", models=models)

    def headline(self, page: Page, params: captions.CorrectionParams, result) -> Headline:
        """Factuality and coverage before and after, and the corrected caption (what the rewriter struck)."""
        return Headline(tuple(Metric(label, value, delta, delta_color=colour)
                              for label, value, delta, colour in F.metric_cards(result)),
                        html=F.diff_html(result.diff), caption="Corrected caption")

    def show(self, page: Page, params: captions.CorrectionParams, result) -> None:
        handle = page.handle
        notes = page.headline_controls
        notes.caption(f"{len(result.dropped)} of {len(result.claims)} claims dropped · agents: "
                      + ", ".join(f"{k} = {v}" for k, v in result.agents.items()))
        for note in (result.decompose_note, result.rewrite_note):
            if note:
                notes.info(note)
        with notes:
            explain("The caption you checked, with the words the rewriter removed struck through in red and any "
                    "words it added in green. A faithful rewrite only removes.")

        if result.before and result.after:
            st.plotly_chart(F.metrics_figure(result.before, result.after), key="cap_metrics")
        if result.ground_truth:
            st.caption(result.ground_truth)
        explain("Factuality: share of the caption's claims that are true in the scene. Coverage: share of "
                "the scene's facts (three per object: it exists, its size, its position) the caption "
                "states. CHAIR_i: share of mentioned objects that are not in the scene. Exact, because "
                "the scene is known — and only then: without a Shapes World scene, or for a caption its grammar "
                "does not read, no claim has ground truth and the numbers are shown as not measurable.")

        st.subheader("Claims")
        if any(c.low_mass for c in result.claims):
            st.warning(F.low_mass_message(result))
        table(F.claim_rows(result))
        explain("Each claim was put to the VLM as a yes/no question with only the image and that claim. "
                "p_True / p_False are its next-token probabilities of 'yes' and 'no', and 'yes+no mass' is their "
                "sum: the share of its answer that is yes or no at all. The hallucination score "
                "H = −log max(p_True − p_False, ε) is 0 when it is sure the claim is true and large when it is "
                "not; "
                + ("here H reads the renormalised p_True / (p_True + p_False), which ignores mass on other tokens. "
                   if result.params.probabilities == "renormalised" else
                   "here H reads the raw probabilities, as CapMAS defines it, so mass on other tokens raises H. ")
                + "Claims with H > π are dropped.")
        st.plotly_chart(F.score_figure(result), key="cap_scores")
        explain("The same scores as bars; the dashed line is the threshold π. Move π to trade coverage "
                "(more claims kept) against factuality (fewer false claims kept).")

        grounded = [c for c in result.claims if c.heatmap]
        if grounded:
            st.subheader("Grounding")
            names = [c.claim for c in grounded]
            picked = st.selectbox("Claim", range(len(names)), format_func=lambda i: names[i], key="cap_claim")
            view = F.model_view(self.image, handle.info.image_size)
            st.plotly_chart(F.heatmap_figure(grounded[picked], view), key="cap_heat")
            explain("Integrated Gradients (Captum) of the answer's log-odds, log p(yes) − log p(no), with "
                    "respect to the pixels, summed over each vision patch. Red patches pushed the model towards "
                    "'yes' (the claim is true), blue ones towards 'no'. The image is shown as the vision "
                    "tower sees it (resized and centre-cropped).")

        st.subheader("Threshold sweep")
        st.plotly_chart(F.sweep_figure(result), key="cap_sweep")
        explain("For every threshold π: the factuality of the claims that would be kept and the share of the "
                "scene's facts they cover (without ground truth: the share of claims kept). Low π keeps only "
                "claims the verifier is sure of — factual but short; high π keeps everything.")

        share_bar("captions", title=f"Caption correction on {handle.spec.label}", params=params.to_dict(),
                  result=result, model=handle.spec.label,
                  figures={"Scores": F.score_figure(result), "Threshold sweep": F.sweep_figure(result)},
                  tables={"metrics": F.metric_rows(result), "claims": F.claim_rows(result)})

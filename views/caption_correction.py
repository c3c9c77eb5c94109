"""Caption correction (CapMAS): split a caption into claims, verify each alone, rewrite without the false ones."""
from __future__ import annotations

import io

import streamlit as st

from analysis import captions
from analysis.errors import SettingsError
from analysis.images import open_image
from analysis.models import ModelSpec, load_model, zoo_models
from analysis.settings import labelled
from components.common import (analysis_errors, explain, field_row, metric_row, require_model, set_url_params,
                               url_param)
from components.figures import captions as F
from components.params_form import ParamsForm, fields_of
from components.presets import preset_bar
from components.runs import cached_run, ready, remember
from components.share import share_bar
from components import hosting  # uploads under the deployment's limits

st.title("Caption correction")
st.write(
    "A detailed caption is split into atomic claims, the vision-language model answers a yes/no "
    "question about **each claim alone**, and claims it does not confirm are removed by a rewriter "
    "that adds nothing new — the multi-agent pipeline of *CapMAS* (ICML 2025). On Shapes World "
    "scenes the ground truth is known, so factuality and coverage are exact; on anything else they "
    "are not measurable, and the page says so."
)

preset_bar("caption-correction", widget_prefix="cap_")
handle = require_model(*captions.ANALYSIS.kinds, panel="Caption correction")
world = captions.shapes_world() if captions.has_shapes_world() else None
zoo = zoo_models()
WEAK = "shapes-vlm-weak"
OWN_LM = "the VLM's own language model"
SEED_MAX = 2**31 - 1
AGENT_WIDTH = 200  # px: the longest agent label and "zoo:shapes-lm" whole
PI_SHOWN = 10.0  # the slider's end: above -log ε = 9.2 (the default ε) every claim is kept
ROLES = {"decomposer": captions.DECOMPOSERS, "verifier": captions.VERIFIERS, "rewriter": captions.REWRITERS}


# Two at once: the weak captioner and the decomposer/rewriter LM are both used on every run.
@st.cache_resource(max_entries=2, show_spinner="Loading the decomposer/rewriter model ...")
def agent_lm(label: str):
    return load_model(ModelSpec.parse(label))


@st.cache_data(max_entries=64, show_spinner=False)
def scene_png(seed: int) -> bytes:
    buf = io.BytesIO()
    world.render(world.generate_scene(seed)).save(buf, format="PNG")
    return buf.getvalue()


# --- controls -----------------------------------------------------------------------------------

left, right = st.columns([1, 2], gap="large")
with left:
    sources = ["scene", "upload"] if world else ["upload"]
    source = st.radio("Image", sources, index=sources.index(url_param("src", sources[0], choices=sources)),
                      format_func={"scene": "Shapes World scene", "upload": "Upload an image"}.get,
                      horizontal=True, key="cap_src")
    seed = upload = None
    if source == "scene":
        default_seed = world.split_seeds("test", 1)[0] + 3
        seed = int(st.number_input("Scene seed (test split starts at 20,000,000)", min_value=0,
                                   value=url_param("seed", default_seed, int, lo=0, hi=SEED_MAX),
                                   max_value=SEED_MAX, step=1, key="cap_seed"))
        image = open_image(scene_png(seed))
    else:
        file = hosting.file_uploader("Image (PNG, JPEG, GIF, BMP, WebP)", key="cap_upload",
                                     type=["png", "jpg", "jpeg", "gif", "bmp", "webp"])
        if file is None:
            st.info("Upload an image, or switch to a Shapes World scene.")
            st.stop()
        upload = captions.Upload(file.getvalue())  # every step on it is keyed by its bytes
        with analysis_errors(prefix="Cannot use this upload: "):
            image = upload.image
    st.image(image, caption=f"Scene {seed}" if seed is not None else "Uploaded image", width="stretch")
    if seed is not None:
        with st.expander("Ground truth of this scene"):
            st.write(world.caption(world.generate_scene(seed)))

with right:
    cap_sources = ["vlm"] + (["weak"] if WEAK in zoo else []) + ["paste"]
    cap_labels = {"vlm": f"generate with {handle.spec.label}", "weak": f"generate with zoo:{WEAK} (hallucinates)",
                  "paste": "paste a caption"}
    cap_default = "weak" if "weak" in cap_sources and seed is not None else "vlm"
    cap_source = st.radio("Caption", cap_sources, format_func=cap_labels.get, horizontal=True, key="cap_from",
                          index=cap_sources.index(url_param("cap", cap_default, choices=cap_sources)))
    if cap_source == "paste":
        caption = st.text_area("Caption to check", value=url_param("text", "", str), key="cap_text", height=100,
                               max_chars=captions.params.CAPTION_CHARS)
    else:
        with analysis_errors(prefix="Could not generate a caption: "):
            captioner = handle if cap_source == "vlm" else agent_lm(f"zoo:{WEAK}")
            if seed is not None:
                caption = cached_run("caption", captions.caption_scene, captioner,
                                     captions.SceneCaptionParams(scene_seed=seed), label="Captioning").text
            else:
                caption = cached_run("caption", captions.caption_upload, captioner, captions.CaptionParams(),
                                     label="Captioning", upload=upload).text
        st.text_area("Caption to check (generated)", value=caption, disabled=True, height=100)

    lm_choices = (["zoo:shapes-lm"] if "shapes-lm" in zoo else []) + [OWN_LM]
    lm_default = lm_choices[0] if captions.speaks_shapes_world(handle) else OWN_LM
    url_pi = url_param("pi", captions.DEFAULT_PI, float)
    try:
        captions.CorrectionParams(pi=url_pi).validate()  # the same check as the CLI's
    except SettingsError as exc:
        st.error(f"{exc} Showing π = {captions.DEFAULT_PI} instead.")
        url_pi = captions.DEFAULT_PI
    form = ParamsForm("cap_")
    with st.expander("Agents and threshold", expanded=True):
        # fixed-width fields that wrap whole: equal columns cut their values ("zoo:shapes-l…") and, at
        # 1024 px, their labels mid-word
        row = field_row()
        lm_choice = row.selectbox("Decomposer/rewriter model", lm_choices, key="cap_lm", width=AGENT_WIDTH,
                                  index=lm_choices.index(url_param("lm", lm_default, choices=lm_choices)))
        labelled_names = {role: {"format_func": lambda n, r=registry: "auto" if n == "auto" else r.label(n)}
                          for role, registry in ROLES.items()}
        labelled_names["verifier"]["label"] = "Verifier (the loaded VLM)"
        form.draw(row, fields_of(captions.CorrectionParams, ["decomposer", "verifier", "rewriter"]), width=AGENT_WIDTH,
                  overrides=labelled_names)
        with analysis_errors(prefix="Could not load the decomposer/rewriter model: "):
            lm = agent_lm(lm_choice) if lm_choice != OWN_LM else handle
        with analysis_errors():
            chosen = {"decomposer": captions.resolve_agent("decomposer", form.values["decomposer"], lm),
                      "rewriter": captions.resolve_agent("rewriter", form.values["rewriter"], lm),
                      "verifier": captions.resolve_verifier(form.values["verifier"], handle)}
        # each chosen agent's own settings (a role's settings keep one URL name: dec_tokens, rew_tokens, ...)
        agent_forms = {role: ParamsForm(f"cap_{role[:3]}_") for role in ROLES}
        row = field_row()
        for role, registry in ROLES.items():
            cls = registry.get(chosen[role])
            agent_forms[role].draw(row, [(f, cls) for f in labelled(cls)])
        row = st.container(horizontal=True, wrap=True)
        pi = row.slider("Threshold π (nats): drop a claim when H(u) > π", 0.0, PI_SHOWN, key="cap_pi",
                        value=min(url_pi, PI_SHOWN), step=0.05, width=300)
        forms = captions.PROBABILITY_FORMS.names()
        prob = row.radio("p_True / p_False in H", forms, format_func=captions.PROBABILITY_FORMS.label, key="cap_prob",
                         width=220, index=forms.index(url_param("prob", captions.DEFAULT_PROBABILITIES, choices=forms)),
                         help="Raw: the next-token probabilities of yes and no, as CapMAS defines H. "
                              "Renormalised: p_T / (p_T + p_F), the answer among yes and no only — it ignores "
                              "probability that went to other tokens.")
        form.draw(st.container(), fields_of(captions.CorrectionParams, ["ground"]), width="content",
                  defaults={"ground": handle.info.parameters < 50_000_000},
                  overrides={"ground": {"help": "Integrated Gradients costs about 8 forward/backward passes per "
                                                "claim; off by default for models above 50 M parameters."}})
        st.caption("auto: the demo LM for Shapes World, an instruct model's chat prompts otherwise, "
                   "the grammar reference as a last resort. A language model's rewrite is checked and replaced "
                   "if it says what was not kept (the demo LM: by the grammar's; an instruct LM: by the kept "
                   "claims). Verifier: the loaded VLM.")


def params_of(values: dict, agents: dict[str, dict]) -> captions.CorrectionParams:
    return captions.CorrectionParams(
        caption=caption, pi=pi, probabilities=prob, scene_seed=seed, **values,
        decomposers={chosen["decomposer"]: agents["decomposer"]} if agents["decomposer"] else {},
        verifiers={chosen["verifier"]: agents["verifier"]} if agents["verifier"] else {},
        rewriters={chosen["rewriter"]: agents["rewriter"]} if agents["rewriter"] else {})


form.mirror()
for agent_form in agent_forms.values():
    agent_form.mirror()
set_url_params(src=source, cap=cap_source, lm=lm_choice, pi=pi, prob=prob,
               **({"seed": seed} if seed is not None else {}), **({"text": caption} if cap_source == "paste" else {}))


def check_link(role: str, raw: dict) -> None:
    """The link's own values of one agent's settings, validated as the CLI does."""
    params_of(form.values, {**{r: f.values for r, f in agent_forms.items()}, role: raw}).validate()


# a link's agent settings out of range: the CLI's message; the controls already show the nearest allowed
for role, agent_form in agent_forms.items():
    agent_form.check(lambda raw, r=role: check_link(r, raw))

if not caption.strip():
    st.info("Paste a caption (or generate one) to check it.")
    st.stop()

# --- run ----------------------------------------------------------------------------------------

models = {"lm": lm}
with analysis_errors():
    params = params_of(form.values, {role: f.values for role, f in agent_forms.items()})
    params.validate()
    # pi, the probability form and the rewriter's settings do not change verification: moving them only re-scores
    verify_params = captions.verification_params(params)
    if seed is not None:
        result = ready("correct", handle, params, models)
        if result is None:
            verification = cached_run("verify", captions.verify_scene, handle, verify_params,
                                      label="Verifying claims", models=models)
            result = cached_run("rewrite", captions.rewrite_verified, lm, params, label="Rewriting the caption",
                                verification=verification)
            remember("correct", captions.correct_scene, handle, params, result, models=models)
    else:
        verification = cached_run("verify", captions.verify_upload, handle, verify_params, label="Verifying claims",
                                  models=models, upload=upload)
        result = cached_run("rewrite", captions.rewrite_verified, lm, params, label="Rewriting the caption",
                            verification=verification)

# --- views --------------------------------------------------------------------------------------

st.subheader("Corrected caption")
st.markdown(F.diff_html(result.diff), unsafe_allow_html=True)
dropped = len(result.dropped)
st.caption(f"{dropped} of {len(result.claims)} claims dropped · agents: "
           + ", ".join(f"{k} = {v}" for k, v in result.agents.items()))
for note in (result.decompose_note, result.rewrite_note):
    if note:
        st.info(note)
explain("The caption you checked, with the words the rewriter removed struck through in red and any "
        "words it added in green. A faithful rewrite only removes.")

row = metric_row()
for label, value, delta, colour in F.metric_cards(result):
    row.metric(label, value, delta, delta_color=colour)
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
low = [c for c in result.claims if c.low_mass]
if low:
    st.warning(F.low_mass_message(result))
st.dataframe(F.claim_rows(result), hide_index=True)
explain("Each claim was put to the VLM as a yes/no question with only the image and that claim. "
        "p_True / p_False are its next-token probabilities of 'yes' and 'no', and 'yes+no mass' is their "
        "sum: the share of its answer that is yes or no at all. The hallucination score "
        "H = −log max(p_True − p_False, ε) is 0 when it is sure the claim is true and large when it is not; "
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
    view = F.model_view(image, handle.info.image_size)
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

"""Caption correction (CapMAS): split a caption into claims, verify each alone, rewrite without the false ones."""
from __future__ import annotations

import hashlib
import io

import streamlit as st

from analysis import captions as C
from analysis.models import ModelLoadError, ModelSpec, load_model, zoo_models
from analysis.registry import SettingsError
from components.figures import captions as F
from components.common import (analysis_errors, explain, field_row, metric_row, progress, require_model,
                               set_url_params, url_param)
from components.presets import preset_bar
from components.runs import cached_run, confirm, ready, remember
from components.share import share_bar

st.title("Caption correction")
st.write(
    "A detailed caption is split into atomic claims, the vision-language model answers a yes/no "
    "question about **each claim alone**, and claims it does not confirm are removed by a rewriter "
    "that adds nothing new — the multi-agent pipeline of *CapMAS* (ICML 2025). On Shapes World "
    "scenes the ground truth is known, so factuality and coverage are exact."
)

preset_bar("caption-correction", widget_prefix="cap_")
handle = require_model("vlm", panel="Caption correction")
world = C.shapes_world() if C.has_shapes_world() else None
zoo = zoo_models()
WEAK = "shapes-vlm-weak"
OWN_LM = "the VLM's own language model"
SEED_MAX = 2**31 - 1
AGENT_WIDTH = 200  # px: the longest agent label and "zoo:shapes-lm" whole


# Two at once: the weak captioner and the decomposer/rewriter LM are both used on every run.
@st.cache_resource(max_entries=2, show_spinner="Loading the decomposer/rewriter model ...")
def agent_lm(label: str):
    return load_model(ModelSpec.parse(label))


@st.cache_data(max_entries=64, show_spinner=False)
def scene_png(seed: int) -> bytes:
    buf = io.BytesIO()
    world.render(world.generate_scene(seed)).save(buf, format="PNG")
    return buf.getvalue()


# Shapes World scenes go through components/runs.py (keyed by the seed: shared between users and
# shipped for the default view and presets by `python -m analysis warm`); uploads are keyed by their
# bytes here.
@st.cache_data(max_entries=32, show_spinner="Captioning ...")
def generate_caption(model_label: str, image_key: str, _vlm, _image) -> str:
    return C.caption_image(_vlm, _image)


@st.cache_data(max_entries=16, show_spinner=False)
def verify(vlm_label: str, lm_label: str, image_key: str, params_json: str, _vlm, _lm, _image):
    # The progress bar lives inside the cached call: Streamlit replays (and removes) it on a hit.
    with progress("Verifying claims ...") as report:
        return C.verify_caption(_vlm, _image, C.CorrectionParams.from_json(params_json), _lm, report)


@st.cache_data(max_entries=64, show_spinner="Rewriting ...")
def correct(lm_label: str, verification_json: str, params_json: str, _lm):
    verification = C.Verification.from_json(verification_json)
    return C.apply_threshold(verification, C.CorrectionParams.from_json(params_json), _lm)


# --- controls -----------------------------------------------------------------------------------

left, right = st.columns([1, 2], gap="large")
with left:
    sources = ["scene", "upload"] if world else ["upload"]
    source = st.radio("Image", sources, index=sources.index(url_param("src", sources[0], choices=sources)),
                      format_func={"scene": "Shapes World scene", "upload": "Upload an image"}.get,
                      horizontal=True, key="cap_src")
    seed = None
    image = None
    if source == "scene":
        default_seed = world.split_seeds("test", 1)[0] + 3
        seed = int(st.number_input("Scene seed (test split starts at 20,000,000)", min_value=0,
                                   value=url_param("seed", default_seed, int, lo=0, hi=SEED_MAX),
                                   max_value=SEED_MAX, step=1, key="cap_seed"))
        data = scene_png(seed)
        image_key = f"scene:{seed}"
    else:
        upload = st.file_uploader("Image (PNG, JPEG, GIF, BMP, WebP)", key="cap_upload",
                                  type=["png", "jpg", "jpeg", "gif", "bmp", "webp"])
        if upload is None:
            st.info("Upload an image, or switch to a Shapes World scene.")
            st.stop()
        data = upload.getvalue()
        image_key = "upload:" + hashlib.sha256(data).hexdigest()
    try:
        image = C.open_image(data)
    except SettingsError as exc:
        st.error(f"Cannot use this upload: {exc}")
        st.stop()
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
        caption = st.text_area("Caption to check", value=url_param("text", "", str), key="cap_text", height=100)
    else:
        try:
            captioner = handle if cap_source == "vlm" else agent_lm(f"zoo:{WEAK}")
            if seed is not None:
                caption = cached_run("caption", C.caption_scene, captioner, C.SceneCaptionParams(scene_seed=seed),
                                     label="Captioning").text
            else:
                confirm("caption", C.caption_image, captioner, None, label="Captioning", inputs=image_key, image=image)
                caption = generate_caption(captioner.spec.label, image_key, captioner, image)
        except (C.CaptionError, ModelLoadError) as exc:
            st.error(f"Could not generate a caption: {exc}")
            st.stop()
        st.text_area("Caption to check (generated)", value=caption, disabled=True, height=100)

    lm_choices = (["zoo:shapes-lm"] if "shapes-lm" in zoo else []) + [OWN_LM]
    demo_vlm = C.speaks_shapes_world(handle)
    lm_default = lm_choices[0] if demo_vlm else OWN_LM
    decomposers, rewriters, verifiers = (["auto", *C.DECOMPOSERS], ["auto", *C.REWRITERS],
                                         ["auto", *C.VERIFIERS])
    forms = list(C.PROBABILITY_FORMS)

    def labelled(registry):
        return lambda name: "auto" if name == "auto" else registry.label(name)

    url_pi = url_param("pi", C.DEFAULT_PI, float)
    try:
        C.CorrectionParams(pi=url_pi).validate()  # the same check as the CLI's
    except SettingsError as exc:
        st.error(f"{exc} Showing π = {C.DEFAULT_PI} instead.")
        url_pi = C.DEFAULT_PI
    with st.expander("Agents and threshold", expanded=True):
        # fixed-width fields that wrap whole: equal columns cut their values ("zoo:shapes-l…") and, at
        # 1024 px, their labels mid-word
        row = field_row()
        lm_choice = row.selectbox("Decomposer/rewriter model", lm_choices, key="cap_lm", width=AGENT_WIDTH,
                                  index=lm_choices.index(url_param("lm", lm_default, choices=lm_choices)))
        decomposer = row.selectbox("Decomposer", decomposers, key="cap_dec", format_func=labelled(C.DECOMPOSERS),
                                   width=AGENT_WIDTH,
                                   index=decomposers.index(url_param("dec", "auto", choices=decomposers)))
        verifier = row.selectbox("Verifier (the loaded VLM)", verifiers, key="cap_ver",
                                 format_func=labelled(C.VERIFIERS), width=AGENT_WIDTH,
                                 index=verifiers.index(url_param("ver", "auto", choices=verifiers)))
        rewriter = row.selectbox("Rewriter", rewriters, key="cap_rew", format_func=labelled(C.REWRITERS),
                                 width=AGENT_WIDTH, index=rewriters.index(url_param("rew", "auto", choices=rewriters)))
        ground_default = "1" if handle.info.parameters < 50_000_000 else "0"
        row = st.container(horizontal=True, wrap=True)
        pi = row.slider("Threshold π (nats): drop a claim when H(u) > π", 0.0, 10.0, key="cap_pi",
                        value=min(url_pi, 10.0), step=0.05, width=300)
        form = row.radio("p_True / p_False in H", forms, format_func=C.PROBABILITY_FORMS.label, key="cap_prob",
                         width=220, index=forms.index(url_param("prob", C.DEFAULT_PROBABILITIES, choices=forms)),
                         help="Raw: the next-token probabilities of yes and no, as CapMAS defines H. "
                              "Renormalised: p_T / (p_T + p_F), the answer among yes and no only — it ignores "
                              "probability that went to other tokens.")
        ground = st.checkbox("Ground each answer in the image (Captum Integrated Gradients)", key="cap_ground",
                             value=url_param("ground", ground_default, choices=["0", "1"]) == "1",
                             help="Integrated Gradients costs about 8 forward/backward passes per claim; "
                                  "off by default for models above 50 M parameters.")
        st.caption("auto: the demo LM for Shapes World, an instruct model's chat prompts otherwise, "
                   "the grammar reference as a last resort. The demo LM's rewrite is parsed and replaced "
                   "by the grammar's if it states a claim that was not kept. Verifier: the loaded VLM.")

set_url_params(src=source, cap=cap_source, lm=lm_choice, dec=decomposer, ver=verifier, rew=rewriter, pi=pi, prob=form,
               ground=int(ground), **({"seed": seed} if seed is not None else {}),
               **({"text": caption} if cap_source == "paste" else {}))

if not caption.strip():
    st.info("Paste a caption (or generate one) to check it.")
    st.stop()

# --- run ----------------------------------------------------------------------------------------

with analysis_errors(prefix="Could not load the decomposer/rewriter model: "):
    lm = agent_lm(lm_choice) if lm_choice != OWN_LM else handle
with analysis_errors(C.CaptionError):
    params = C.CorrectionParams(caption=caption, pi=pi, decomposer=decomposer, verifier=verifier,
                                rewriter=rewriter, ground=ground, scene_seed=seed, probabilities=form)
    # pi and the probability form do not change verification (p_T, p_F): moving them only re-scores
    verify_params = C.verification_params(params)
    if seed is not None:
        agents = {"lm": lm}
        result = ready("correct", handle, params, agents)
        if result is None:
            verification = cached_run("verify", C.verify_scene, handle, verify_params, label="Verifying claims",
                                      models=agents)
            confirm("rewrite", C.apply_threshold, lm, params, label="Rewriting the caption", verification=verification)
            result = correct(lm.spec.label, verification.to_json(), params.to_json(), lm)
            remember("correct", C.correct_scene, handle, params, result, models=agents)
    else:
        confirm("verify", C.verify_caption, handle, verify_params, label="Verifying claims", models={"lm": lm},
                inputs=image_key, image=image)
        verification = verify(handle.spec.label, lm.spec.label, image_key, verify_params.to_json(), handle, lm,
                              image)
        confirm("rewrite", C.apply_threshold, lm, params, label="Rewriting the caption", verification=verification)
        result = correct(lm.spec.label, verification.to_json(), params.to_json(), lm)

# --- views --------------------------------------------------------------------------------------

st.subheader("Corrected caption")
st.markdown(F.diff_html(result.diff), unsafe_allow_html=True)
dropped = len(result.dropped)
st.caption(f"{dropped} of {len(result.claims)} claims dropped · agents: "
           + ", ".join(f"{k} = {v}" for k, v in result.agents.items()))
if result.rewrite_note:
    st.info(result.rewrite_note)
explain("The caption you checked, with the words the rewriter removed struck through in red and any "
        "words it added in green. A faithful rewrite only removes.")

if result.before and result.after:
    row = metric_row()
    row.metric("Factuality", f"{result.after.factuality:.2f}",
               f"{result.after.factuality - result.before.factuality:+.2f}")
    row.metric("Coverage", f"{result.after.coverage:.2f}",
               f"{result.after.coverage - result.before.coverage:+.2f}")
    row.metric("CHAIR_i", f"{result.after.chair_i:.2f}",
               f"{result.after.chair_i - result.before.chair_i:+.2f}", delta_color="inverse")
    st.plotly_chart(F.metrics_figure(result.before, result.after), key="cap_metrics")
    explain("Factuality: share of the caption's claims that are true in the scene. Coverage: share of "
            "the scene's facts (three per object: it exists, its size, its position) the caption "
            "states. CHAIR_i: share of mentioned objects that are not in the scene. Exact, because "
            "the scene is known.")

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
    chosen = st.selectbox("Claim", range(len(names)), format_func=lambda i: names[i], key="cap_claim")
    view = F.model_view(image, handle.info.image_size)
    st.plotly_chart(F.heatmap_figure(grounded[chosen], view), key="cap_heat")
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
          tables={"claims": F.claim_rows(result)})

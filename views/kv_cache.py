"""KV-cache eviction: which cached tokens each policy keeps, step by step, and what it costs."""
from __future__ import annotations

import streamlit as st

from analysis import kv_eviction as kv
from analysis.cost import default_for
from components import kv_figures as F
from components.common import (analysis_errors, charts_side_by_side, explain, field_row, metric_row,
                               require_model, set_url_params, url_param)
from components.presets import preset_bar
from components.runs import cached_run
from components.share import share_bar

st.title("KV-cache eviction")
st.write(
    "A decoder caches the keys and values of every token it has seen; eviction policies keep only a "
    "budget of them. This panel runs each policy on the loaded model on identical tokens and compares it "
    "with the full cache — *MorphKV* (ICML 2025) against StreamingLLM, H2O, TOVA and SnapKV. The default "
    "prompt is a key-value recall task: needles (key, value) hidden in filler, then each key is asked."
)

preset_bar("kv-cache", widget_prefix="kv_")
handle = require_model("causal_lm", "vlm", panel="KV-cache eviction")
with analysis_errors(kv.KvEvictionError):
    kv.evictable_layers(handle)


# --- controls (mirrored to the URL) ------------------------------------------------------------

names = list(kv.POLICIES)
defaults = kv.KvParams()
TASK_LIMITS = {"context": (16, 4096), "pairs": (1, 8), "queries": (1, 8), "seed": (0, 10_000)}


def setting_default(f):
    return getattr(defaults, f.name, f.default)


# Every policy's own settings, from its class (analysis/kv/policies.py): label, range and help live there.
SETTING_WIDTH = 135  # px: six fit in a row at 1400 px, three at 1024; long labels take two lines
settings_fields = list({f.name: f for cls in kv.POLICIES.values() for f in kv.setting_fields(cls)}.values())

# The link's raw values go through the same validation as the CLI (kv.validate_params), so a bad link gets
# the same one-line message; the widgets below get the values clamped into their ranges.
raw = {f.name: url_param(f.name, setting_default(f), None if f.metadata.get("choices") else type(setting_default(f)))
       for f in settings_fields}
raw_params = kv.KvParams.from_dict({
    **defaults.to_dict(), **{k: v for k, v in raw.items() if hasattr(defaults, k)},
    "budget": url_param("budget", defaults.budget), "prefill": url_param("prefill", defaults.prefill, float),
    **{k: url_param(k, getattr(defaults, k)) for k in TASK_LIMITS}})

with st.container(border=True):
    c1, c2 = st.columns([2, 1])
    policy = c1.selectbox("Policy", names, index=names.index(url_param("policy", defaults.policy, choices=names)),
                          format_func=kv.POLICIES.label, key="kv_policy",
                          help="Full cache keeps everything (the reference). Variants are labelled as such.")
    budget = c2.number_input("Budget C (entries per head)", 1, 100_000,
                             url_param("budget", defaults.budget, int, lo=1, hi=100_000),
                             key="kv_budget", help="Cache entries kept per layer and KV head.")
    st.caption("Each policy's own settings")
    settings = {}
    row = field_row()
    for f in settings_fields:
        meta, default = f.metadata, setting_default(f)
        if meta.get("choices"):
            choices = list(meta["choices"])
            settings[f.name] = row.selectbox(meta["label"], choices, key=f"kv_{f.name}", help=meta.get("help"),
                                             index=choices.index(url_param(f.name, default, choices=choices)),
                                             width=SETTING_WIDTH)
        else:
            cast = type(default)
            lo, hi = cast(meta.get("low", 0)), cast(meta.get("high", 10**6))
            settings[f.name] = cast(row.number_input(
                meta["label"], lo, hi, url_param(f.name, default, cast, lo=lo, hi=hi), step=cast(meta.get("step", 1)),
                key=f"kv_{f.name}", help=meta.get("help"), format="%.2f" if cast is float else "%d",
                width=SETTING_WIDTH))
    row = field_row()
    context = row.number_input("Context (tokens)", 16, 4096,
                               url_param("context", default_for(handle, defaults.context, 64), int, lo=16, hi=4096),
                               step=32, key="kv_context", help="Length of the key-value context.", width=SETTING_WIDTH)
    prefill = row.slider("Prefilled share", 0.05, 1.0, url_param("prefill", defaults.prefill, float, lo=0.05, hi=1.0),
                         step=0.05, key="kv_prefill", width=2 * SETTING_WIDTH,
                         help="Share of the context read in one forward pass; the rest is read token by token, "
                              "with eviction after every token.")
    pairs = row.number_input("Needles", 1, 8, url_param("pairs", defaults.pairs, int, lo=1, hi=8), key="kv_pairs",
                             width=SETTING_WIDTH)
    queries = row.number_input("Questions", 1, 8, url_param("queries", defaults.queries, int, lo=1, hi=8),
                               key="kv_queries", help="Needles asked after the context (shapes-lm was trained on one).",
                               width=SETTING_WIDTH)
    seed = row.number_input("Example seed", 0, 10_000, url_param("seed", 0, int, lo=0, hi=10_000), key="kv_seed",
                            width=SETTING_WIDTH)
    prompt = st.text_input("Your own prompt (optional)", url_param("prompt", "", str), key="kv_prompt",
                           help="Leave empty for the key-value recall task. With a prompt, the full cache's "
                                "greedy continuation is the reference every policy is scored on.")

known = {k: v for k, v in settings.items() if hasattr(defaults, k)}
params = kv.KvParams(policy=policy, budget=int(budget), prompt=prompt, context=int(context), prefill=float(prefill),
                     pairs=int(pairs), queries=int(queries), seed=int(seed), **known)
set_url_params(policy=policy, budget=int(budget), **settings, context=int(context), prefill=float(prefill),
               pairs=int(pairs), queries=int(queries), seed=int(seed), prompt=prompt)

# the URL now holds the nearest allowed values: any change of a control runs with them
with analysis_errors(prefix="This link's settings are out of range (the controls show the nearest allowed values; "
                            "change any control to run with them): "):
    kv.validate_params(raw_params, check_budget=False)
with analysis_errors(kv.KvEvictionError):
    kv.validate_params(params)
    result: kv.KvResult = cached_run("analyze", kv.analyze, handle, params,
                                     label="Running every policy on identical tokens ...")

task = result.task
chosen = result.run(policy)
st.caption(f"{task.source}: context {task.context_len} tokens ({task.prefill_len} prefilled in one forward, the rest "
           f"read token by token), then {len(task.tokens) - task.context_len} question/answer tokens · budget "
           f"{params.budget} = {params.budget / task.context_len:.0%} of the context · "
           f"{len(result.layers)} evictable layers × {result.kv_heads} KV heads")
row = metric_row()
row.metric("Key-value accuracy", "n/a" if chosen.accuracy is None else f"{chosen.accuracy:.0%}",
           None if chosen.accuracy is None or result.full_accuracy is None
           else f"{chosen.accuracy - result.full_accuracy:+.0%} vs full")
row.metric("Mean KL vs full (nats)", f"{chosen.mean_kl:.4f}")
row.metric("Top-1 agreement", f"{chosen.agreement:.0%}")
row.metric("Attention recall", f"{chosen.mean_recall:.1%}")
row.metric("Cache at last step", f"{chosen.cache_bytes[-1] / 1024:.1f} KiB" if chosen.cache_bytes else "—",
           f"{chosen.cache_len[-1]:g} entries/head" if chosen.cache_len else None, delta_color="off")

# --- retained-token heatmap --------------------------------------------------------------------

st.subheader("Which tokens stay in the cache")
h1, h2 = st.columns(2)
layer_choices = list(range(len(result.layers)))
layer_idx = h1.selectbox("Layer", layer_choices, format_func=lambda i: str(result.layers[i]),
                         index=url_param("layer", 0, int, lo=0, hi=len(layer_choices) - 1), key="kv_layer")
head = h2.selectbox("KV head", list(range(result.kv_heads)),
                    index=url_param("head", 0, int, lo=0, hi=result.kv_heads - 1), key="kv_head")
set_url_params(layer=layer_idx, head=head)
heatmap = F.retained_heatmap(result, layer_idx, head)
if result.kept[layer_idx][head]:
    st.plotly_chart(heatmap, key="kv_heatmap")
else:
    st.info("No decode steps to show: the prompt has nothing after the context.")
explain("Each row is one decode step, each column a token by its original position. The first part of the "
        "context is prefilled in one forward (dotted line); the rest, then the questions (dashed line), are read "
        "one token per step. Dark cells are the keys/values this layer and KV head still holds after the step's "
        "eviction; light cells were evicted (they never come back); blank cells are tokens not read yet. Red "
        "triangles mark the needles (key and value). StreamingLLM shows two bands (sinks + recent); H2O, "
        "SnapKV and MorphKV a pattern that keeps changing per head; TOVA the same set for every head.")

st.subheader(f"All policies at budget {params.budget}: equal entries")
st.dataframe(F.summary_rows(result), hide_index=True)
explain("Every policy ran on exactly the same tokens as the full cache (teacher forcing), so the numbers "
        "compare like with like. KL and ΔNLL are per predicted token against the full cache; attention recall "
        "is the share of the full cache's attention (same step, same layer) that falls on the entries the "
        "policy still held; needle survival is the share of the asked-for key/value tokens still cached when "
        "the answer is predicted, averaged over layers and heads; time is per decode step, eviction included. "
        "Every policy in this table holds the same number of entries once the context exceeds the budget "
        "(PyramidKV: the same on average over layers): SnapKV and PyramidKV evict at every decode step too.")
variant_rows = F.summary_rows(result, variants=True)
if variant_rows:
    st.markdown("**Labelled variants** (not part of the equal-entries comparison)")
    st.dataframe(variant_rows, hide_index=True)
    explain("The prefill-only variants compress the prompt once, as SnapKV's and PyramidKV's official code does, "
            "and then grow by one entry per decode step, so they hold more than the budget when the answer is "
            "predicted (see the cache column). The MorphKV variant is our earlier reading (max over the query "
            "heads of a group of per-head fused scores, window including the current token); the default "
            "MorphKV follows the official code.")
if task.answer_positions:
    st.dataframe(F.answer_rows(result), hide_index=True)
    explain("One row per asked key: did each policy's top prediction equal the true value?")
charts_side_by_side((F.step_metric_figure(result, "kl"), "kv_kl"),
                    (F.survival_figure(chosen, result.layers), "kv_survival"))
explain("KL per predicted token: how far each policy's next-token distribution is from the full cache's at "
        "every step; the dotted lines are the answer tokens, where losing a needle hurts most. Needle survival: "
        "for the selected policy, which layers and heads still held the needles when they were needed.")

st.subheader("Memory over decode steps")
st.plotly_chart(F.memory_figure(result), key="kv_memory")
explain("Measured size of the key/value tensors (lines) and the analytic 2 · layers · KV heads · head dim · "
        "cached tokens · bytes per value (crosses), which agree exactly. Every policy of the main comparison "
        "stays flat at the budget; the prefill-only variants grow by one entry per step; the full cache grows "
        "from the whole context.")

examples = url_param("examples", 2, int, lo=1, hi=64)
sweep_params = kv.KvParams.from_dict({**params.to_dict(), "policy": "full", "budget": 1, "examples": examples})


@st.fragment
def budget_sweep_section() -> kv.SweepResult | None:
    """Computed on demand (a Run button) unless this server already has it; reruns alone."""
    st.subheader("Budget sweep")
    with analysis_errors(kv.KvEvictionError):
        sweep = cached_run("sweep", kv.budget_sweep, handle, sweep_params, label="Sweeping budgets ...",
                           on_demand=True, names=kv.main_policies())
    if sweep is None:
        st.caption(f"Every policy at 25 %, 50 % and 75 % of the context on {examples} key-value prompts "
                   "(`examples` in the URL): runs when you press the button.")
        return None
    metrics = {"accuracy": "key-value accuracy", "mean_kl": "mean KL", "recall": "attention recall",
               "agreement": "top-1 agreement", "cache": "cache held"}
    metric = st.radio("Metric", list(metrics), horizontal=True, key="kv_metric", format_func=metrics.get,
                      index=list(metrics).index(url_param("metric", "accuracy", choices=list(metrics))))
    set_url_params(metric=metric)
    st.plotly_chart(F.sweep_figure(sweep, metric), key="kv_sweep")
    explain(f"Each policy at budgets of 25 %, 50 % and 75 % of the context (each policy's settings as set above), "
            f"averaged over {examples} key-value prompts (seeds {params.seed} to {params.seed + examples - 1}; "
            "`examples` in the URL). The dashed line is the full cache's accuracy. 'Cache held' shows what each "
            "policy really kept when the last token was predicted: the same for every policy here (the "
            "labelled variants are left out of the sweep; docs/readme_kv.md measures them). With few prompts "
            "the accuracy steps are coarse; the README table averages more.")
    return sweep


sweep = budget_sweep_section()

st.subheader("Generated text per policy")
st.dataframe(F.text_rows(result), hide_index=True)
explain(f"Greedy continuation of the context ({params.new_tokens} tokens) under each policy; the last column "
        "is the share of tokens equal to the full cache's continuation at the same position.")

share_bar("kv", title=f"KV eviction: {kv.POLICIES.label(policy)} at budget {params.budget} on {handle.spec.label}",
          params=params.to_dict(), result=result, model=handle.spec.label,
          figures={"Retained tokens": heatmap, "Memory": F.memory_figure(result),
                   **({"Budget sweep": F.sweep_figure(sweep)} if sweep is not None else {})},
          tables={"policies": F.summary_rows(result)})

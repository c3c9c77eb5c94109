"""The KV-cache eviction page: every policy on identical tokens, which cached tokens each keeps, and what
it costs. Controls: KvParams and each policy's settings (analysis/kv/params.py); view state: KvState."""
from __future__ import annotations

import streamlit as st

from analysis import kv
from analysis.framework.cost import default_for
from components.common import table, charts_side_by_side, explain, stays_local
from components.figures import kv as F
from components.figures import kv_long as L
from components.share import share_bar
from components.view import Headline, Metric, Page, Section, View, with_defaults


def _retrieval(values: dict) -> bool:
    return values.get("task") != "long-response"


class KvView(View):
    panel = "kv"
    prefix = "kv_"
    intro = (
        "A decoder caches the keys and values of every token it has seen; eviction policies keep only a "
        "budget of them. This panel runs each policy on the loaded model on identical tokens and compares it "
        "with the full cache — *MorphKV* (ICML 2025) against StreamingLLM, H2O, TOVA, SnapKV and PyramidKV. Two "
        "tasks: **retrieval** (needles hidden in filler, then asked) and **long response** (the prompt read once, "
        "then each policy writes its own long answer at constant memory: MorphKV's claim)."
    )
    sections = (
        Section("main", layout="columns"),  # the task box holds "Retrieval (needles)" whole at 1024 px
        Section("policies", caption="Each policy's own settings"),
        Section(("retrieval", "task"), when=_retrieval),
        Section(("long", "task"), when=lambda values: not _retrieval(values)),
        Section("prompt", layout="stack"),
    )
    later = ("sweep",)  # drawn by the budget sweep, which alone reads them

    def check_model(self, page: Page) -> None:
        stays_local(page.handle, "KV-cache eviction")  # its own decode loop: never on NDIF
        kv.evictable_layers(page.handle)

    def defaults(self, page: Page) -> dict:
        # a shorter context on a large model; the page's sweep averages two prompts (the CLI's one)
        return {"context": default_for(page.handle, kv.KvParams.context, 96), "examples": 2}

    def validate(self, page: Page, params: kv.KvParams) -> None:
        kv.validate_params(params, check_budget=False)

    def run(self, page: Page, params: kv.KvParams):
        params = with_defaults(params, "sweep")
        if params.task == "long-response":
            return page.run("long_response", kv.long_response, params, label="Every policy writes its own answer ...")
        return page.run("analyze", kv.analyze, params, label="Running every policy on identical tokens ...")

    def headline(self, page: Page, params: kv.KvParams, result) -> Headline:
        """The chosen policy's numbers against the full cache, and which tokens stay in its cache."""
        if isinstance(result, kv.LongResult):
            return long_headline(page, params, result)
        return retrieval_headline(page, params, result)

    def show(self, page: Page, params: kv.KvParams, result) -> None:
        if isinstance(result, kv.LongResult):
            show_long(page, params, result)
        else:
            show_retrieval(page, params, result)


def retrieval_headline(page: Page, params: kv.KvParams, result: kv.KvResult) -> Headline:
    chosen = result.run(params.policy)
    metrics = (
        Metric("Key-value accuracy", "n/a" if chosen.accuracy is None else f"{chosen.accuracy:.0%}",
               None if chosen.accuracy is None or result.full_accuracy is None
               else f"{chosen.accuracy - result.full_accuracy:+.0%} vs full"),
        Metric("Mean KL vs full (nats)", f"{chosen.mean_kl:.4f}"),
        Metric("Top-1 agreement", f"{chosen.agreement:.0%}"),
        Metric("Attention recall", f"{chosen.mean_recall:.1%}"),
        Metric("Cache at last step", f"{chosen.cache_bytes[-1] / 1024:.1f} KiB" if chosen.cache_bytes else "—",
               f"{chosen.cache_len[-1]:g} entries/head" if chosen.cache_len else None, delta_color="off"))
    layer, head = _layer_and_head(page, result.layers, result.kv_heads)
    page.heatmap = F.retained_heatmap(result, layer, head)
    if not result.kept[layer][head]:
        page.headline_controls.info("No decode steps to show: the prompt has nothing after the context.")
        return Headline(metrics)
    return Headline(metrics, page.heatmap, key="kv_heatmap")


def show_retrieval(page: Page, params: kv.KvParams, result: kv.KvResult) -> None:
    handle, task = page.handle, result.task
    chosen = result.run(params.policy)
    notes = page.headline_controls
    notes.caption(f"{task.source}: context {task.context_len} tokens ({task.prefill_len} prefilled in one forward, "
                  f"the rest read token by token), then {len(task.tokens) - task.context_len} question/answer tokens "
                  f"· budget {params.budget} = {params.budget / task.context_len:.0%} of the context · "
                  f"{len(result.layers)} evictable layers × {result.kv_heads} KV heads")
    with notes:
        explain("Each row is one decode step, each column a token by its original position. The first part of the "
                "context is prefilled in one forward (dotted line); the rest, then the questions (dashed line), are "
                "read one token per step. Dark cells are the keys/values this layer and KV head still holds after "
                "the step's eviction; light cells were evicted (they never come back); blank cells are tokens not "
                "read yet. Red triangles mark the needles (key and value). StreamingLLM shows two bands (sinks + "
                "recent); H2O, SnapKV and MorphKV a pattern that keeps changing per head; TOVA the same set for "
                "every head.")

    chapter = page.chapter(["All policies", "Variants and answers", "KL and needle survival", "Memory",
                            "Budget sweep", "Generated text"])
    sweep = None
    if chapter == "All policies":
        policies_table(params, result)
    elif chapter == "Variants and answers":
        variants_and_answers(result)
    elif chapter == "KL and needle survival":
        charts_side_by_side((F.step_metric_figure(result, "kl"), "kv_kl"),
                            (F.survival_figure(chosen, result.layers), "kv_survival"))
        explain("KL per predicted token: how far each policy's next-token distribution is from the full cache's at "
                "every step; the dotted lines are the answer tokens, where losing a needle hurts most. Needle "
                "survival: for the selected policy, which layers and heads still held the needles when they were "
                "needed.")
    elif chapter == "Memory":
        st.plotly_chart(F.memory_figure(result), key="kv_memory")
        explain("Measured size of the key/value tensors (lines) and the analytic 2 · layers · KV heads · head dim · "
                "cached tokens · bytes per value (crosses), which agree exactly. Every policy of the main "
                "comparison stays flat at the budget; the prefill-only variants grow by one entry per step; the full "
                "cache grows from the whole context. " + F.not_evicted_note(result))
    elif chapter == "Budget sweep":
        sweep = budget_sweep_section(page, params)
    else:
        table(F.text_rows(result))
        explain(f"Greedy continuation of the context ({params.new_tokens} tokens) under each policy; the last "
                "column is the share of tokens equal to the full cache's continuation at the same position.")

    share_bar("kv", title=f"KV eviction: {kv.POLICIES.label(params.policy)} at budget {params.budget} on "
              f"{handle.spec.label}", params=with_defaults(params, "sweep").to_dict(), result=result,
              model=handle.spec.label,
              figures={"Retained tokens": page.heatmap, "Memory": F.memory_figure(result),
                       **({"Budget sweep": F.sweep_figure(sweep)} if sweep is not None else {})},
              tables={"policies": F.summary_rows(result)})


def policies_table(params: kv.KvParams, result: kv.KvResult) -> None:
    """Every policy against the full cache at this budget (one table: the default section draws in <= 3 s)."""
    st.subheader(f"All policies at budget {params.budget}: equal entries")
    table(F.summary_rows(result))
    explain("Every policy ran on exactly the same tokens as the full cache (teacher forcing), so the numbers "
            "compare like with like. KL and ΔNLL are per predicted token against the full cache; attention recall "
            "is the share of the full cache's attention (same step, same layer) that falls on the entries the "
            "policy still held; needle survival is the share of the asked-for key/value tokens still cached when "
            "the answer is predicted, averaged over layers and heads; time is per decode step, eviction included. "
            "Every policy in this table holds the budget once the context exceeds it (PyramidKV: its official "
            "per-layer schedule, at least the budget on average): SnapKV and PyramidKV evict at every decode step "
            "too. MorphKV selects before each query attends (as its code does), the others after.")


def variants_and_answers(result: kv.KvResult) -> None:
    """The labelled variants and the answers per key."""
    variant_rows = F.summary_rows(result, variants=True)
    if variant_rows:
        st.markdown("**Labelled variants** (not part of the equal-entries comparison)")
        table(variant_rows)
        explain("The prefill-only variants compress the prompt once, as SnapKV's and PyramidKV's official code "
                "does, and then grow by one entry per decode step, so they hold more than the budget when the answer "
                "is predicted (see the cache column). The MorphKV variant is the later Llama rule of its repository "
                "(8903d2a: the group's logits summed before one softmax, W scoring queries); the default MorphKV is "
                "the code released with the paper (36fefc7: a softmax per query head, then the max over the group).")
    if result.task.answer_positions:
        table(F.answer_rows(result))
        explain("One row per asked key: did each policy's top prediction equal the true value?")


@st.fragment
def budget_sweep_section(page: Page, params: kv.KvParams) -> kv.SweepResult | None:
    """Computed on demand (a Run button) unless this server already has it; reruns alone."""
    st.subheader("Budget sweep")
    values = page.draw(st.container(), "sweep", defaults=page.view.defaults(page))
    page.mirror()
    sweep_params = type(params).from_dict({**params.to_dict(), **values, "policy": "full", "budget": 1})
    sweep = page.run("sweep", kv.budget_sweep, sweep_params, label="Sweeping budgets ...", on_demand=True,
                     names=kv.main_policies())
    shares = ", ".join(f"{s:.0%}" for s in sweep_params.sweep)
    if sweep is None:
        st.caption(f"Every policy at {shares} of the context on {sweep_params.examples} key-value prompts: runs "
                   "when you press the button.")
        return None
    metric = page.control("metric", width="content")
    st.plotly_chart(F.sweep_figure(sweep, metric), key="kv_sweep_chart")
    explain(f"Each policy at budgets of {shares} of the context (each policy's settings as set above), averaged "
            f"over {sweep_params.examples} key-value prompts (seeds {params.seed} to "
            f"{params.seed + sweep_params.examples - 1}). The dashed line is the full cache's accuracy. 'Cache held' "
            "shows what each policy really kept when the last token was predicted: the same for every policy here "
            "(the labelled variants are left out of the sweep; docs/readme_kv.md measures them). With few prompts "
            "the accuracy steps are coarse; the README table averages more.")
    return sweep


def _layer_and_head(page: Page, layers: list[int], kv_heads: int, key: str = "") -> tuple[int, int]:
    """The layer (an index into the evictable layers) and KV head the heatmap shows, under it."""
    h1 = h2 = page.headline_controls.container(horizontal=True, wrap=True, vertical_alignment="bottom",
                                                gap="small")
    layer = page.control("layer", h1, choices=list(range(len(layers))), high=len(layers) - 1,
                         format_func=lambda i: str(layers[i]), key=f"{key}layer", width=140)
    head = page.control("head", h2, choices=list(range(kv_heads)), high=kv_heads - 1, key=f"{key}head", width=140)
    return layer, head


def long_headline(page: Page, params: kv.KvParams, long: kv.LongResult) -> Headline:
    mine, full = long.run(params.policy), long.runs[0]
    metrics = (
        Metric("Item recall", "n/a" if mine.recall is None else f"{mine.recall:.0%}",
               None if mine.recall is None or full.recall is None else f"{mine.recall - full.recall:+.0%} vs full"),
        Metric("Top-1 agreement (same prefix)", f"{mine.agreement:.0%}"),
        Metric("Identical to the full cache's answer for", f"{int(sum(mine.same))} tokens",
               f"of {len(full.generated)}", delta_color="off"),
        Metric("Cache at last step", f"{mine.cache_bytes[-1] / 1024:.1f} KiB" if mine.cache_bytes else "—",
               f"full cache {full.cache_bytes[-1] / 1024:.1f} KiB" if full.cache_bytes else None, delta_color="off"))
    layer, head = _layer_and_head(page, long.layers, long.kv_heads, key="long_")
    page.heatmap = L.kept_heatmap(long, layer, head)
    return Headline(metrics, page.heatmap, key="kv_long_heatmap")


def show_long(page: Page, params: kv.KvParams, long: kv.LongResult) -> None:
    """The long-response task: every policy writes its own answer with its cache held at the budget."""
    handle = page.handle
    notes = page.headline_controls
    notes.caption(f"{long.task.source}: a {len(long.task.tokens)}-token prompt read in one forward, then up to "
                  f"{long.task.max_new} generated tokens · budget {params.budget} entries per layer and KV head, "
                  f"held from the first generated token · {len(long.layers)} evictable layers × {long.kv_heads} KV "
                  "heads")
    with notes:
        explain("Each row is one generated token, each column a position: the prompt, then the answer as it is "
                "written. Dark cells are the entries this layer and KV head holds after that step; light cells were "
                "evicted; blank cells are not written yet. MorphKV keeps its last W + 1 tokens and the older entries "
                "its recent queries look at; StreamingLLM two bands; H2O what gathered attention so far.")
    chapter = page.chapter(["All policies", "Agreement and memory", "Answers"])
    if chapter == "All policies":
        st.subheader(f"All policies at budget {params.budget}: each writes its own answer")
        table(L.summary_rows(long))
        explain("Item recall and precision check each answer against the task's ground truth (Shapes World: the "
                "caption's claims; a real model: one line per person of the list in the prompt). Top-1 agreement "
                "and KL compare each policy with the full cache *after the same prefix* (its own answer so far); "
                "'identical for' counts the tokens before the answer first differs from the full cache's.")
        if long.task.reference:
            table(L.item_rows(long))
            explain("One row per item of a correct answer, in order: which policies wrote it.")
    elif chapter == "Agreement and memory":
        metric = page.control("position_metric", width="content")
        charts_side_by_side((L.position_figure(long, metric), "kv_long_position"),
                            (L.memory_figure(long), "kv_long_memory"))
        explain("Left: how each policy's answer keeps agreeing with the full cache as it grows (moving mean over 8 "
                "tokens). Right: the measured key/value bytes at each generated token — flat at the budget for "
                "every policy of the comparison, growing for the full cache.")
    else:
        table(L.answer_rows(long))
    share_bar("kv", title=f"KV long response: {kv.POLICIES.label(params.policy)} at budget {params.budget} on "
              f"{handle.spec.label}", params=with_defaults(params, "sweep").to_dict(), result=long,
              model=handle.spec.label, figures={"Retained tokens": page.heatmap, "Memory": L.memory_figure(long)},
              tables={"policies": L.summary_rows(long)})

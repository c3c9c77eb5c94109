"""A ranking of pairs by s_i: separation (only with labels), the keep fraction, examples at the top and the
bottom, rows left out, and the exports (ranked list, kept subset in the data's own format)."""
from __future__ import annotations

from typing import Callable

import streamlit as st

from analysis import sae_v
from components.common import charts_side_by_side, explain, metric_row, table as pinned_table
from components.figures import sae as figs
from components.hosting import escape_markdown


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.3f}"


def overview(ranking: sae_v.Ranking, store: sae_v.FeatureStore | None = None) -> None:
    """The ranking's headline numbers. Which features have an ω is the ranking's own (analysis decides
    whether the store's ω applies: `sae_v.same_omega`)."""
    row = metric_row()
    if ranking.labelled:
        row.metric("ROC AUC (s_i)", _fmt(ranking.roc_auc))
        row.metric("ROC AUC (weighted)", _fmt(ranking.roc_auc_weighted))
    row.metric("Features with ω", "—" if ranking.with_omega is None else ranking.with_omega,
               help="The feature store's ω" if ranking.omega_from_store else
               "ω computed again under this rule on the feature store's pairs")
    row.metric("Pairs with s_i > 0", f"{sum(r.score != 0 for r in ranking.rows)} / {len(ranking.rows)}")
    if ranking.source:
        row.metric("Rows used / read", f"{len(ranking.rows)} / {ranking.rows_read}")
    what = ("ROC AUC is the chance that a clean pair outscores a corrupted one." if ranking.labelled else
            "These pairs carry no corruption labels, so no ROC AUC, precision or recall is measured: the score "
            "distribution and the pairs at the top and the bottom show what the ranking does.")
    explain("Each image–caption pair is scored by the features active on both one of its caption tokens "
            "and one of its image patches. Official SAE-V rule: only features with at least 5 text and 5 image "
            "tokens among their 30 strongest have a cross-modal weight ω, a feature counts as active above 1, "
            "and s_i sums ω over the shared features that have one. Two labelled variants, not the paper's: "
            "*all-shared* gives every feature that fires in both modalities an ω and sums over all shared "
            "features (our earlier reading); *normalised* divides the official sum by the |ω| of the features "
            "active on either side, so a one-object scene is not outscored by a long caption of another scene. "
            + what)
    skipped(ranking)


def skipped(ranking: sae_v.Ranking) -> None:
    for note in ranking.notes:  # they quote the data's captions and file names
        st.caption(escape_markdown(note))
    if not ranking.skipped:
        return
    st.warning(f"{len(ranking.skipped)} of {ranking.rows_read} rows were left out (reported below, never used): "
               f"{len(ranking.rows)} pairs are ranked.", icon=":material/report:")
    with st.expander(f"Rows left out ({len(ranking.skipped)})"):
        pinned_table([{"row": s.row + 1, "image": s.image, "why": s.reason} for s in ranking.skipped],
                     key="sae_rank_skipped")
        explain("Row numbers are your file's line numbers (blank lines counted; a CSV's header is line 1); for a "
                "Parquet file or a datasets folder, the table's row from 1. A row that repeats an earlier one (the "
                "same caption and the same image, by content) is left out as a duplicate, the first kept.")
    if ranking.resumed:
        st.caption(f"{ranking.resumed} pairs came from an earlier, stopped run of this ranking (resumed).")


def keep_section(ranking: sae_v.Ranking, keep: float) -> object | None:
    """Kept / removed counts; with labels also precision and recall of the removal, and its curve."""
    kept = figs.keep_summary(ranking, keep)
    row = metric_row()
    row.metric("Pairs kept / removed", f"{kept['kept']} / {kept['removed']}")
    if not ranking.labelled:
        explain(f"Filtering as in the paper: keep the {keep:.0%} of pairs with the highest score and drop the rest "
                "(the export below writes both).")
        return None
    base = sum(r.corrupted for r in ranking.rows) / max(len(ranking.rows), 1)
    row.metric("Precision: corrupted among removed", _fmt(kept["precision"]),
               help=f"Removing pairs at random would give {base:.3f}.")
    row.metric("Recall: corrupted pairs removed", _fmt(kept["recall"]))
    row.metric("Clean share of what is kept", _fmt(kept["clean_share_kept"]), help=f"{1 - base:.3f} in the whole set.")
    fig = figs.keep_curve_figure(ranking, keep)
    st.plotly_chart(fig, key="sae_rank_keep_curve")
    explain(f"Filtering as in the paper: keep the {keep:.0%} of pairs with the highest score and drop the rest. "
            "Precision is the share of the dropped pairs that are corrupted (random dropping gives the dashed "
            f"base rate {base:.2f}); recall is the share of all corrupted pairs that get dropped.")
    return fig


def distribution(ranking: sae_v.Ranking) -> dict:
    dist = figs.score_distribution_figure(ranking)
    if not ranking.labelled:
        st.plotly_chart(dist, key="sae_rank_dist")
        explain("How the scores of these pairs are spread (no labels: one histogram).")
        return {"Scores": dist}
    roc = figs.roc_figure(ranking)
    charts_side_by_side((dist, "sae_rank_dist"), (roc, "sae_rank_roc"))
    explain("Score per pair: its distribution for each pair kind (clean, caption of another scene, swapped "
            "attributes). ROC: the trade-off when keeping pairs above a score threshold.")
    pinned_table(figs.kind_summary(ranking), key="sae_rank_kinds")
    explain("Averages per pair kind: a useful score gives clean pairs a higher mean s_i and a better (lower) "
            "mean rank than corrupted ones. ROC AUC vs clean: the chance that a clean pair outscores a pair of "
            "that kind (0.5: the score cannot see that corruption; None on the clean row, the one the others are "
            "compared with).")
    return {"Scores": dist, "ROC": roc}


def extremes(ranking: sae_v.Ranking, image_of: Callable[[sae_v.PairScore], object] | None) -> None:
    """The pairs at the top and at the bottom of the ranking (with their images, as the tower sees them)."""
    n = min(3, len(ranking.rows) // 2)
    if n == 0:
        return
    for title, rows in (("Top of the ranking", ranking.rows[:n]), ("Bottom of the ranking", ranking.rows[-n:])):
        st.markdown(f"**{title}**")
        cols = st.columns(n)
        for col, r in zip(cols, rows):
            image = image_of(r) if image_of is not None else None
            if image is not None:
                col.image(image, width=140)
            col.caption(f"#{r.rank} · s_i {r.score:.2f}" + (f" · {r.kind}" if ranking.labelled else "")
                        + f"\n\n{escape_markdown(r.text[:160])}")
    explain("The highest- and lowest-scoring pairs: what the score keeps and what it drops first.")


def downloads(ranking: sae_v.Ranking, keep: float, kept: Callable[[], tuple[bytes, str]] | None) -> list[dict]:
    """The ranked table and its exports; `kept` makes the kept subset in the data's own format."""
    rows = figs.ranking_rows(ranking)
    pinned_table(rows, height=360, key="sae_rank_table")
    row = st.container(horizontal=True, wrap=True, gap="small")
    row.download_button("Ranked list (CSV)", data=sae_v.ranked_text(ranking, keep, "csv"),
                        file_name="sae-v-ranking.csv", mime="text/csv", key="sae_rank_csv", on_click="ignore")
    row.download_button("Ranked list (JSONL)", data=sae_v.ranked_text(ranking, keep, "jsonl"),
                        file_name="sae-v-ranking.jsonl", mime="application/jsonl", key="sae_rank_jsonl",
                        on_click="ignore")
    if kept is not None:
        content, name = kept()
        row.download_button(f"Kept {keep:.0%} in your format ({name})", data=content, file_name=name,
                            key="sae_rank_kept", on_click="ignore")
    explain("The ranked list has one row per usable pair: rank, image, caption, s_i and whether it is kept at "
            "this share. The kept subset is the same rows of your own file (same format and columns), ready to "
            "train on.")
    return rows


def filtering_experiment() -> None:
    st.markdown("#### Does filtering by s_i train a better model? (the paper's experiment, demo scale)")
    results, why = figs.filtering_results(figs.FILTERING_RESULTS)
    if results is None:
        st.info("The data-filtering experiment has not been run yet"
                + ("" if why == "absent" else f" (its results file is {why})") + ": "
                "`python benchmarks/sae_v_filtering.py` writes `benchmarks/results/sae_v_filtering.json`, "
                "which this view then shows.")
        return
    pinned_table(figs.filtering_rows(results), key="sae_filter_table")
    st.plotly_chart(figs.filtering_figure(results), key="sae_filter_fig")
    explain("Stored results of `benchmarks/sae_v_filtering.py` (model "
            f"{results.get('model', '?')}, {results.get('scale', '')}): " + ", ".join(figs.filtering_bits(results))
            + ". Each condition fine-tunes the same starting checkpoint; scores are measured on held-out test "
            "scenes, mean ± standard deviation over seeds.")
    if isinstance(results.get("note"), str) and results["note"].strip():
        st.caption("Benchmark note: " + results["note"])

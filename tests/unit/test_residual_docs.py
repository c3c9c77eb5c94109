"""docs/readme_residual.md quotes its numbers from the benchmark result files: each quoted number is checked
against the file it comes from (changing a result, or the doc, fails here)."""
from __future__ import annotations

import json

from analysis.framework.paths import DOCS, RESULTS

DOC = (DOCS / "readme_residual.md").read_text()


def _result(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def test_factual_recall_numbers_come_from_the_sweep():
    real = next(r for r in _result("residual_factual.json")["results"] if "smollm2" in r["model"])["sweep"]
    assert f"{len(real['runs'])} of the 24 factual pairs" in DOC and real["skipped"] == ["country-rome"]
    assert f"| 24 | {real['subject'][24]:.2f} | {real['last'][24]:.2f} |".replace("-0.03", "−0.03") in DOC
    assert round(min(real["subject"][:10]), 2) >= 0.98 and round(min(real["subject"][10:22]), 2) >= 0.96
    assert f"over all\ncells of the {len(real['runs'])} pairs r = {real['correlation']:.2f}" in DOC


def test_cost_numbers_come_from_the_benchmark():
    for r in _result("residual_bench.json")["results"]:
        row = (f"{r['exact_vs_batched_floor']:.2f} | {r['exact_vs_one_row_forwards']:.2f} | "
               f"{r['attribution_in_forwards']:.2f} | {r['wall']['exact_vs_batched_floor']:.2f} / "
               f"{r['wall']['attribution_in_forwards']:.2f} |")
        assert row in DOC, row
        assert r["exact_vs_batched_floor"] <= 1.2 and r["attribution_in_forwards"] <= 3.0


def test_tuned_lens_numbers_come_from_the_stored_measurements():
    from analysis.residual.translators import META, available, folder_for

    for name in available():
        meta = json.loads((folder_for(name) / META).read_text())
        for label, m in meta["held_out_kl_nats"].items():
            assert all(t < g for t, g in zip(m["tuned"][:-1], m["logit"][:-1])), (name, label)
            for state in (0, 1, 2):
                assert f"{m['logit'][state]:.2f} → {m['tuned'][state]:.2f}" in DOC, (name, label, state)


def test_shipped_lenses_against_the_reference_recipe_come_from_the_benchmark():
    from analysis.residual.translators import META, folder_for

    for name, r in _result("residual_tuned_lens.json")["models"].items():
        recipe = json.loads((folder_for(name) / META).read_text())["recipe"]
        assert (r["steps"], r["batch_tokens"], r["lr"]) == (recipe["steps"], recipe["batch_tokens"], recipe["lr"])
        for label, m in r["held_out"].items():
            assert f"worst ratio {m['worst_ratio']:.2f}" in DOC
            for state in (0, 1, 2):
                assert (f"| {state} | {m['logit'][state]:.2f} | {m['reference'][state]:.2f} | "
                        f"{m['shipped'][state]:.2f} | {m['shipped_over_reference'][state]:.2f} |") in DOC, (name, state)


def test_commitment_strip_numbers_come_from_the_benchmark():
    import statistics

    runs = {r["model"]: r for r in _result("residual_generate.json")["runs"]}
    for r in runs.values():
        row = (f"| {r['model']} | {r['generated']} × {r['layers']} | {r['states_read_in_full']} | "
               f"{r['ratio_cpu']:.2f} | {r['naive_ratio_cpu']:.2f} | {r['ratio_wall']:.2f} |")
        assert row in DOC, row
        assert r["ratio_cpu"] <= 1.2
    real = runs["zoo:smollm2-135m-instruct"]
    layers, n = real["layers"], real["generated"]
    assert real["first"][0] == real["stays"][0] == layers  # ' Paris': only the output has it on top
    at_output = sum(s == layers for s in real["stays"])
    differ = sum(f != s for f, s in zip(real["first"], real["stays"]))
    early = sum(f is not None and f <= 5 for f in real["first"])
    assert f"{at_output} of the {n} tokens" in DOC and f"{differ} of the {n}" in DOC and f"{early} tokens" in DOC
    assert f"median {statistics.median(real['first']):g}" in DOC and f"median {statistics.median(real['stays']):g}" in DOC


def test_per_pair_correlations_come_from_the_sweep():
    import numpy as np

    for r in _result("residual_factual.json")["results"]:
        own = [float(np.corrcoef(np.ravel(x["exact"]), np.ravel(x["attribution"]))[0, 1]) for x in r["sweep"]["runs"]]
        if "smollm2" in r["model"]:
            assert (f"the median of\nthe {len(own)} pairs' own r is {np.median(own):.2f}, from {min(own):.2f} to "
                    f"{max(own):.2f}") in DOC
        else:
            assert f"shapes-lm's {len(own)} pairs: {np.median(own):.2f}, pooled {r['sweep']['correlation']:.2f}" in DOC


def test_branching_numbers_come_from_the_benchmark():
    run = _result("residual_branch.json")
    by = {b["token"]: b for b in run["branches"]}
    assert run["model"] == "zoo:smollm2-135m-instruct" and run["at"] == 0 and set(by) >= {" Paris", " London", " Le"}
    flat = " ".join(DOC.split())  # the paragraph's line breaks
    for token, b in by.items():
        assert f"'{token}' {b['p_token']:.2g}" in flat, token
        assert f"{b['path_prob']:.3g}" in flat, token
    london = by[" London"]
    assert london["ended"] and london["first_difference"] == 0 and f"--branch-token {london['token_id']}" in flat
    assert f"'{london['text'].encode('unicode_escape').decode()}'" in flat and f"after {london['tokens']} tokens" in flat
    assert by[" Paris"]["path_prob"] == run["main_path_prob"] and by[" Paris"]["first_difference"] is None
    common = london["common_length"]
    assert f"first {common['tokens']} tokens of each, the generated text has {common['main_prob']:.3g} and ' London' " \
           f"{common['branch_prob']:.3g}" in flat and common["branch_prob"] < common["main_prob"]
    ratios = [b["cpu_vs_plain"] for b in run["branches"]]
    assert f"{min(ratios):.2f}-{max(ratios):.2f}x the CPU time" in flat

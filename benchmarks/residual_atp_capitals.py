"""The measured finding of docs/readme_residual.md: on SmolLM2's capital pairs, the heads (outputs, queries,
keys) whose exact patching effect is in the top 5 % and that attribution patching or AtP* misses.

    OMP_NUM_THREADS=1 python benchmarks/residual_atp_capitals.py [--model zoo:smollm2-135m-instruct] [--pairs capital-]

Per pair: `patch_problem` with exact, attribution and AtP* on the components heads, queries and keys, then
`false_negatives` per component and estimate. Writes benchmarks/results/residual_atp_capitals.json with the
false negatives of every pair, the totals, and the cells AtP misses that AtP* finds (and the reverse).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402

from analysis.model_access import anatomy  # noqa: E402
from analysis.model_access.models import ModelSpec, load_model  # noqa: E402
from analysis.residual import ResidualError, ResidualParams, pairs_for  # noqa: E402
from analysis.residual.analysis import _problem, patch_problem  # noqa: E402
from analysis.residual.atp import false_negatives  # noqa: E402

COMPONENTS = ["heads", "queries", "keys"]
METHODS = ["exact", "attribution", "atp*"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:smollm2-135m-instruct")
    ap.add_argument("--pairs", default="capital-", help="offered pairs whose name starts with this")
    args = ap.parse_args(argv)
    handle = load_model(ModelSpec.parse(args.model))
    layout = anatomy.head_layout(handle.language_model)
    layers = anatomy.n_layers(handle.language_model)
    rows, cols = [f"L{i}" for i in range(layers)], [f"H{h}" for h in range(layout.heads)]
    pairs, skipped = [], []
    for pair in [p for p in pairs_for(handle) if p.name.startswith(args.pairs)]:
        try:
            problem = _problem(handle, ResidualParams(), pair)
        except ResidualError:
            skipped.append(pair.name)
            continue
        m_c, m_x, shares, seconds = patch_problem(handle, problem, COMPONENTS, METHODS, 32)
        found = {}
        for c in COMPONENTS:
            for m in METHODS[1:]:
                fn = false_negatives(c, m, shares[(c, "exact")].tolist(), shares[(c, m)].tolist(), rows, cols)
                found[f"{c}/{m}"] = {"missed": fn.missed, "effects": [round(e, 4) for e in fn.effects],
                                     "top": fn.top, "cut": round(fn.cut, 4)}
            atp, star = set(found[f"{c}/attribution"]["missed"]), set(found[f"{c}/atp*"]["missed"])
            found[f"{c}/found by atp* only"] = sorted(atp - star)
            found[f"{c}/found by atp only"] = sorted(star - atp)
        top = {c: sorted(((abs(v), i, j) for i, r in enumerate(shares[(c, "exact")].tolist()) for j, v in enumerate(r)),
                         reverse=True)[:3] for c in COMPONENTS}
        pairs.append({"pair": pair.name, "clean_diff": m_c, "corrupt_diff": m_x, "seconds": seconds,
                      "largest_exact": {c: [(f"L{i}H{j}", round(v, 3)) for v, i, j in t] for c, t in top.items()},
                      **found})
        print(pair.name, {k: len(v["missed"]) if isinstance(v, dict) else v for k, v in found.items()}, flush=True)
    totals = {}
    for c in COMPONENTS:
        for m in METHODS[1:]:
            totals[f"{c}/{m}"] = sum(len(p[f"{c}/{m}"]["missed"]) for p in pairs)
        totals[f"{c}/found by atp* only"] = sum(len(p[f"{c}/found by atp* only"]) for p in pairs)
        totals[f"{c}/found by atp only"] = sum(len(p[f"{c}/found by atp only"]) for p in pairs)
    totals["top cells per component and pair"] = pairs[0][f"{COMPONENTS[0]}/attribution"]["top"] if pairs else 0
    out = RESULTS / "residual_atp_capitals.json"
    out.write_text(json.dumps({"model": args.model, "pairs": pairs, "skipped": skipped, "totals": totals,
                               "note": "CPU, one thread, a busy shared machine"}, indent=1) + "\n")
    print(json.dumps(totals, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

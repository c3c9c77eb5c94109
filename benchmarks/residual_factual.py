"""Where the answer is: residual-stream patching over every offered pair, on the zoo and on the real model.

    OMP_NUM_THREADS=1 python benchmarks/residual_factual.py [--models zoo:shapes-lm,zoo:smollm2-135m-instruct]

Per model, `pair_sweep` patches the residual stream at every (state, position) of every offered pair, exact
and attribution (shapes-lm: 9 Shapes World pairs whose answer sits at a known token; SmolLM2: 24 English
factual pairs, the subject swapped). Reported per state: the mean share of the clean - corrupted logit
difference recovered at the subject's last token (the changed token), at the last token and elsewhere; per
zoo pair: the token where the recovery peaks at state 0 (must be the answer's known token), the first state
where the last token recovers more than half, and the head whose patching recovers most.

Writes benchmarks/results/residual_factual.json and the figure docs/figures/residual_factual.png.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import DOCS, RESULTS  # noqa: E402  (every project path comes from analysis/framework/paths.py)

from analysis.model_access.models import ModelLoadError, ModelSpec, load_model  # noqa: E402
from analysis.residual import ResidualParams, pairs_for  # noqa: E402
from analysis.residual.pairs import factual_pairs  # noqa: E402
from analysis.residual.analysis import pair_sweep, patch  # noqa: E402

FIGURE = DOCS / "figures" / "residual_factual.png"


def zoo_locations(handle) -> list[dict]:
    """Per Shapes World pair: where residual patching recovers the answer, and which head moves it."""
    out = []
    for pair in pairs_for(handle):
        r = patch(handle, ResidualParams(pair=pair.name, components=["residual", "heads"], methods=["exact"]))
        grid = r.grid("residual", "exact").share
        heads = r.grid("heads", "exact")
        hi, hj, hv = heads.peak()
        takeover = next((i for i, row in enumerate(grid) if row[-1] > 0.5), None)
        out.append({"pair": pair.name, "where": pair.where, "changed": r.changed,
                    "peak_position_state0": max(range(len(grid[0])), key=lambda j: grid[0][j]),
                    "share_at_changed_state0": grid[0][r.changed[-1]],
                    "last_token_takes_over_at_state": takeover, "top_head": f"L{hi}H{hj}", "top_head_share": hv,
                    "clean_diff": r.clean_diff, "corrupt_diff": r.corrupt_diff})
    return out


def run(label: str) -> dict:
    handle = load_model(ModelSpec.parse(label))
    t0 = time.perf_counter()
    sweep = pair_sweep(handle, ResidualParams())
    result = {"model": label, "seconds": round(time.perf_counter() - t0, 1), "sweep": sweep.to_dict()}
    if label == "zoo:shapes-lm":
        result["locations"] = zoo_locations(handle)
    return result


def figure(results: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    real = next((r for r in results if r["model"] != "zoo:shapes-lm"), results[-1])
    s = real["sweep"]
    states = range(s["layers"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    ax = axes[0]
    for key, colour, label in (("subject", "#d62728", "subject's last token"), ("last", "#1f77b4", "last token"),
                               ("other", "#7f7f7f", "other positions")):
        ax.plot(states, s[key], color=colour, label=f"{label} (exact)")
    ax.plot(states, s["subject_attribution"], color="#d62728", ls="--", label="subject (attribution)")
    ax.plot(states, s["last_attribution"], color="#1f77b4", ls="--", label="last token (attribution)")
    ax.set_xlabel("residual stream entering layer (0 = embeddings)")
    ax.set_ylabel("share of logit difference recovered")
    ax.set_title(f"{real['model']}: {len(s['runs'])} factual pairs (mean)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    first = s["runs"][0]
    ax = axes[1]
    im = ax.imshow(first["exact"], aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, origin="lower")
    clean = next((p.clean for p in factual_pairs() if p.name == first["name"]), "")
    if len(clean.split()) == len(first["exact"][0]):  # one token per word: label the columns with the words
        ax.set_xticks(range(len(first["exact"][0])), clean.split())
    ax.set_xlabel("position (token of the clean prompt)")
    ax.set_ylabel("residual stream entering layer")
    ax.set_title(f"{first['name']}: exact patching, share recovered")
    fig.colorbar(im, ax=ax, label="share recovered")
    fig.tight_layout()
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURE, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="zoo:shapes-lm,zoo:smollm2-135m-instruct")
    ap.add_argument("--figure-only", action="store_true", help="redraw the figure from the stored results")
    args = ap.parse_args(argv)
    out = RESULTS / "residual_factual.json"
    if args.figure_only:
        figure(json.loads(out.read_text())["results"])
        print(f"wrote {FIGURE}")
        return 0
    torch.set_num_threads(1)
    results = []
    for label in args.models.split(","):
        try:
            results.append(run(label))
        except ModelLoadError as exc:
            print(f"skipped {label}: {exc}")
    for r in results:
        s = r["sweep"]
        print(f"\n{r['model']}: {len(s['runs'])} pairs, exact vs attribution r = {s['correlation']:.3f}, {r['seconds']} s")
        print("| state | subject's last token | last token | other |")
        print("|---|---|---|---|")
        for i in range(s["layers"]):
            print(f"| {i} | {s['subject'][i]:.2f} | {s['last'][i]:.2f} | {s['other'][i]:.2f} |")
        for loc in r.get("locations", []):
            print(loc)
    out.write_text(json.dumps({"threads": 1, "torch": torch.__version__, "results": results}, indent=1) + "\n")
    print(f"wrote {out}")
    if results:
        figure(results)
        print(f"wrote {FIGURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every panel on the real instruct model (zoo:smollm2-135m-instruct): its task with ground truth, its
result, and its time against the plain forwards it needs, in one table.

    python benchmarks/real_model.py          # read each panel's latest real-model results, print the table,
                                             # write benchmarks/results/real_model.json and the model card's
                                             # per-panel lines (analysis/zoo/real_models/<name>.card.*)
    python benchmarks/real_model.py --run    # first re-run each panel's own real-model benchmark (about an
                                             # hour on 2 cores; each measures its floor in the same run)

Each panel's benchmark owns its method (what its floor is, how many repeats): this script only runs them and
gathers their figures, so a number here is always the one its own benchmark wrote, with its file named.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS, ROOT  # noqa: E402  (every project path comes from analysis/framework/paths.py)
OUT = RESULTS / "real_model.json"
MODEL = "smollm2-135m-instruct"

# (panel, command that refreshes its results); each writes its own file under benchmarks/results/
RUNS = [
    ("Attention sharpness", ["benchmarks/sharpness_real.py", "--model", f"zoo:{MODEL}", "--repeats", "3"]),
    ("KV-cache eviction", ["benchmarks/kv_real.py", "--lm", f"zoo:{MODEL}"]),
    ("KV-cache eviction", ["benchmarks/kv_longresp.py", "--lm", f"zoo:{MODEL}", "--budgets", "32,64,96",
                           "--examples", "3", "--no-variants", "--response", "64"]),
    ("Prompt reconstruction", ["benchmarks/inversion_bench.py", "--parts", "real"]),
    ("Caption correction", ["benchmarks/captions_instruct.py", "--lm", f"zoo:{MODEL}"]),
]


def _read(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


def _real_entry(found: dict | list | None, key: str = "model") -> dict | None:
    """The entry measured on the real model in a results file keyed or listed by model label."""
    if not found:
        return None
    items = found.values() if isinstance(found, dict) else found
    return next((e for e in items if isinstance(e, dict) and MODEL in str(e.get(key, "")).replace("_", "-")
                 .lower()), None)


def sharpness() -> dict:
    r = _read("sharpness_real.json")
    if not r:
        return {"measured": False}
    acc, chance = r["accuracy"], r["chance"]
    ns = sorted(acc, key=int)
    return {"measured": True, "source": "benchmarks/results/sharpness_real.json",
            "task": r.get("task", f"key-value recall through the chat template, the page's first view "
                                  f"({r['samples']} prompts per n; the answer's code scored over the prompt's codes)"),
            "result": "accuracy " + " / ".join(f"{acc[n]:.2f}" for n in ns) + f" at n = {' / '.join(ns)} "
                      "(chance " + " / ".join(f"{chance[n]:.2f}" for n in ns) + ")",
            "time_over_floor": round(r["ratio_median"], 2),
            "estimate_over_measured": round(r["estimate_over_measured"], 2)}


def kv() -> dict:
    r, long = _read("kv_real.json"), _read("kv_longresp.json")
    if not r:
        return {"measured": False}
    a = r["accuracy"]
    rows = {row["analysis"].split(" ")[0]: row for row in r["speed"]}
    out = {"measured": True, "source": "benchmarks/results/kv_real.json, kv_longresp.json",
           "task": f"{a['source']}, {a['tokens']}-token prompts; long answers: an 8-line list asked back",
           "result": f"full-cache recall accuracy {a['accuracy']:.2f} on {a['prompts']} prompts",
           "time_over_floor": round(rows["analyze"]["ratio_cpu"], 2),
           "estimate_over_measured": round(rows["analyze"]["estimate_over_wall"], 2),
           "long_response_time_over_floor": round(rows["long_response"]["ratio_cpu"], 2)}
    entry = _real_entry(long)
    if entry:
        at = {}
        for p in entry["points"]:
            at.setdefault(p["budget"], {})[p["policy"]] = p["recall"]
        mid = sorted(at)[len(at) // 2]
        best = sorted(at[mid].items(), key=lambda kv_: -kv_[1])
        out["result"] += (f"; long answers at C = {mid}: " + ", ".join(f"{k} {v:.2f}" for k, v in best[:3])
                          + f" … {best[-1][0]} {best[-1][1]:.2f} of the items (full cache 1.00)")
    return out


def inversion() -> dict:
    r = _read("inversion_bench.json")
    entry = _real_entry((r or {}).get("views"))
    if not entry:
        return {"measured": False}
    return {"measured": True, "source": "benchmarks/results/inversion_bench.json (views)",
            "task": f"the page's {entry['tokens']}-token prompt from layer {entry['layer']} states, "
                    f"vocabulary {entry['vocab']:,}",
            "result": f"{entry['accuracy']:.0%} recovered after {entry['candidates']:,} candidates "
                      f"(exhaustive search: {entry['exhaustive_candidates']:,})",
            # its benchmark writes measured / estimate
            "time_over_floor": entry["floor_ratio"], "estimate_over_measured": round(1 / entry["estimate_ratio"], 2)}


def captions() -> dict:
    r = _read("captions_instruct.json")
    if not r:
        return {"measured": False}
    d = r["decomposer"]
    before, after = d["before (one instruction)"], d["after (worked examples, per sentence)"]
    return {"measured": True, "source": "benchmarks/results/captions_instruct.json",
            "task": f"decompose {after['captions']} English captions into claims (the LM as CapMAS's decomposer)",
            "result": f"lines that are claims about the caption {before['claim_rate']:.0%} → {after['claim_rate']:.0%}; "
                      "factuality on captions the Shapes grammar cannot read: not measurable (was 1.000)",
            "time_over_floor": None, "estimate_over_measured": None}


def sae() -> dict:
    return {"measured": False, "source": "",
            "task": "SAE-V needs an SAE trained on the model's activations (and a VLM for cross-modal scores)",
            "result": "not measured: no SAE ships for this model; the page and `python -m analysis sae --sae "
                      "FOLDER` load one trained with sae-lens"}


PANELS = [("Attention sharpness", sharpness), ("KV-cache eviction", kv), ("Prompt reconstruction", inversion),
          ("Caption correction", captions), ("SAE-V features", sae)]


def table(rows: dict) -> str:
    def ratio(x):
        return "–" if x is None else f"{x:.2f}×"

    lines = ["| panel | task (ground truth) | result | time / floor | estimate / measured |", "|---|---|---|---|---|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row.get('task', '–')} | {row.get('result', 'not measured')} | "
                     f"{ratio(row.get('time_over_floor'))} | {ratio(row.get('estimate_over_measured'))} |")
    return "\n".join(lines)


def write_card(rows: dict) -> None:
    """The model card's per-panel lines (committed beside the git-ignored converted folder)."""
    from analysis.model_access import real_models
    from analysis.zoo import cards

    json_path, _ = cards.real_card_paths(MODEL, real_models.REAL_DIR)
    if not json_path.is_file():
        return
    data = json.loads(json_path.read_text())
    data["metrics"]["panels"] = {name: f"{row['task']}: {row['result']}" for name, row in rows.items()
                                 if row.get("result")}
    card = cards.Card(**data)
    cards.write_real_card(card, real_models.REAL_DIR)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="re-run every panel's real-model benchmark first")
    args = parser.parse_args(argv)
    if args.run:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        for panel, cmd in RUNS:
            print(f"== {panel}: {' '.join(cmd)}", flush=True)
            subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, check=True)
    rows = {name: fn() for name, fn in PANELS}
    OUT.write_text(json.dumps({"model": f"zoo:{MODEL}", "panels": rows}, indent=2) + "\n")
    sys.path.insert(0, str(ROOT))
    write_card(rows)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Long responses at constant memory (MorphKV's claim): every main policy writes its own answer with its
cache held at C entries per layer and KV head from the first generated token, at several budgets.

    python benchmarks/kv_longresp.py [--lm zoo:shapes-lm] [--budgets 32,48,64,80,96] [--examples 12]
    python benchmarks/kv_longresp.py --lm zoo:smollm2-135m-instruct --budgets 32,64,96 --examples 3 \
        --no-variants --response 64
    python benchmarks/kv_longresp.py --only-extra --extra morphkv:morph_window=16   (another row, added)

On the demo LM the task is Shapes World's caption decomposition (a 48-token prompt, about 84 generated
tokens, 12 claims checked against the grammar); on an instruct model, a list of 8 people and their
cities asked back line by line (the first given, 7 lines checked). Each policy with its own defaults (StreamingLLM 4
sinks; H2O half/half; SnapKV/PyramidKV w = 8, kernel 5; MorphKV W = 8, max fusion, the rule released
with the paper; the 8903d2a MorphKV rule as a labelled extra row). Greedy decoding, end-of-text ends an
answer. Every row's measured cache is checked against what its rule claims (Policy.held).
Prints markdown tables and writes benchmarks/results/kv_longresp.json (one entry per model).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS, ROOT  # noqa: E402  (every project path comes from analysis/framework/paths.py)

from analysis import kv  # noqa: E402
from analysis.kv.longresp import BIN, long_sweep  # noqa: E402
from analysis.model_access.models import ModelSpec, load_model  # noqa: E402
from benchmarks.kv_bench import progress_printer  # noqa: E402
from benchmarks.result_names import result_name  # noqa: E402

VARIANTS = ["morphkv_8903d2a"]


def extra_rows(handle, specs: list[str], budgets: list[int], examples: int, seed: int) -> list[dict]:
    """Rows for a policy with other settings ("morphkv:morph_window=16"), each point tagged with them."""
    rows = []
    for spec in specs:
        name, _, rest = spec.partition(":")
        settings = {k: (float(v) if "." in v else int(v) if v.isdigit() else v)
                    for k, v in (kv_.split("=") for kv_ in rest.split(",") if kv_)}
        params = kv.KvParams(task="long-response", seed=seed, response=96, policies=kv.policy_settings(**settings))
        for p in long_sweep(handle, params, budgets, examples, names=[name])["points"]:
            assert abs(p.cache - p.claimed) < 1e-9, (p.policy, p.budget, p.cache, p.claimed)
            rows.append({**p.to_dict(), "settings": settings})
    return rows


def run(spec: str, budgets: list[int], examples: int, seed: int, extra: list[str], variants: bool = True,
        response: int = 96) -> dict:
    handle = load_model(ModelSpec.parse(spec))
    params = kv.KvParams(task="long-response", seed=seed, response=response)
    names = [n for n in kv.main_policies() if n != "full"] + (VARIANTS if variants else [])
    t0 = time.time()
    out = long_sweep(handle, params, budgets, examples, names=names, progress=progress_printer())
    task = kv.longresp.long_task(handle, params)
    for p in out["points"]:  # every row holds what it claims
        assert abs(p.cache - p.claimed) < 1e-9, (p.policy, p.budget, p.cache, p.claimed)
    return {"model": result_name(spec), "task": task.source, "prompt_tokens": len(task.tokens), "budgets": budgets,
            "examples": examples, "seeds": [seed, seed + examples - 1], "seconds": round(time.time() - t0, 1),
            "threads": torch.get_num_threads(), "full": out["full"].to_dict(),
            "points": [p.to_dict() for p in out["points"]],
            "extra": extra_rows(handle, extra, budgets, examples, seed)}


def print_tables(r: dict) -> None:
    full = r["full"]
    print(f"\n### {r['model']}: {r['task']} ({r['prompt_tokens']}-token prompt, {r['examples']} prompts; full cache: "
          f"item recall {full['recall']:.2f}, {full['identical']:.0f} tokens per answer, {full['kib']:.0f} KiB at "
          f"the last step)\n")
    budgets = r["budgets"]
    names = list(dict.fromkeys(p["policy"] for p in r["points"]))
    rows = [(kv.POLICIES.label(n), [p for p in r["points"] if p["policy"] == n]) for n in names]
    for spec in dict.fromkeys(json.dumps(p["settings"]) for p in r.get("extra", [])):
        pts = [p for p in r["extra"] if json.dumps(p["settings"]) == spec]
        rows.append((f"{kv.POLICIES.label(pts[0]['policy'])} ({spec})", pts))
    for title, key, fmt in (("item recall", "recall", "{:.2f}"), ("top-1 agreement (same prefix)", "agreement", "{:.2f}"),
                            ("tokens identical to the full cache's answer", "identical", "{:.0f}")):
        print(f"\n{title}\n")
        print("| policy | " + " | ".join(f"C = {b}" for b in budgets) + " |")
        print("|---|" + "---|" * len(budgets))
        for label, pts in rows:
            cells = []
            for b in budgets:
                p = next(p for p in pts if p["budget"] == b)
                cells.append("n/a" if p[key] is None else fmt.format(p[key]))
            print(f"| {label} | " + " | ".join(cells) + " |")
    b = budgets[0]
    print(f"\nagreement by generated position at C = {b} (bins of {BIN} tokens)\n")
    for name in names:
        p = next(p for p in r["points"] if p["policy"] == name and p["budget"] == b)
        print(f"- {kv.POLICIES.label(name)}: " + " ".join(f"{x:.2f}" for x in p["by_position"]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lm", default="zoo:shapes-lm")
    ap.add_argument("--budgets", default="32,48,64,80,96")
    ap.add_argument("--examples", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--extra", action="append", default=[],
                    help="another row: a policy with other settings, e.g. morphkv:morph_window=16 (repeatable)")
    ap.add_argument("--only-extra", action="store_true", help="run only the --extra rows, added to the last results")
    ap.add_argument("--no-variants", action="store_true", help="leave out the 8903d2a MorphKV row")
    ap.add_argument("--response", type=int, default=96, help="generated tokens at most per answer")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    budgets = [int(b) for b in args.budgets.split(",")]
    target = RESULTS / "kv_longresp.json"
    previous = json.loads(target.read_text()) if target.is_file() else {}
    if args.only_extra:
        handle = load_model(ModelSpec.parse(args.lm))
        result = previous[result_name(args.lm)]
        assert result["budgets"] == budgets and result["examples"] == args.examples, "same budgets and prompts"
        result["extra"] = result.get("extra", []) + extra_rows(handle, args.extra, budgets, args.examples, args.seed)
    else:
        result = run(args.lm, budgets, args.examples, args.seed, args.extra, variants=not args.no_variants,
                     response=args.response)
    print_tables(result)
    previous = json.loads(target.read_text()) if target.is_file() else {}  # another model's run may have ended since
    previous[result["model"]] = result
    target.write_text(json.dumps(previous, indent=2))
    print(f"\nwrote {target.relative_to(ROOT)} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Prompt reconstruction: candidate evaluations and wall time of the attack vs exhaustive search.

    python benchmarks/inversion_bench.py [--gpt2-positions 8] [--exhaustive-positions 2] [--parts shapes,gpt2,noise,real]

Two models: `shapes-lm` from the demo zoo (small vocabulary, so exhaustive search runs on every
position) and a GPT-2-small-shaped random-weight model built in memory from `GPT2Config()`
(vocabulary 50,257, 12 layers, attacked at layer 6). On GPT-2, exhaustive search is run on the first
`--exhaustive-positions` positions and its time extrapolated to the prompt; its candidate count
(positions x vocabulary) is exact. All ratios are against the exhaustive run in the same process.
Prints a markdown table and writes benchmarks/results/inversion_bench.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402  (every project path comes from analysis/framework/paths.py)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from analysis.model_access import anatomy  # noqa: E402
from analysis import inversion as inv  # noqa: E402
from analysis.model_access import tiny_models  # noqa: E402
from analysis.model_access.models import ModelHandle, ModelSpec, load_model, zoo_models  # noqa: E402
from benchmarks.result_names import result_name  # noqa: E402


def gpt2_small_random() -> ModelHandle:
    return tiny_models.gpt2_small_random(with_tokenizer=True)


def random_ids(vocab: int, n: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def row(model: str, layer: int, method: str, result: inv.AttackResult, exhaustive_evals: int,
        exhaustive_seconds: float, positions: int, note: str = "") -> dict:
    seconds = sum(t.seconds for t in result.tokens)
    return {
        "model": model, "layer": layer, "method": method, "positions": len(result.tokens),
        "accuracy": result.accuracy, "candidates": result.evaluations, "gradient_steps": result.gradient_steps,
        "proposal_forwards": result.proposal_forwards, "seconds": round(seconds, 3),
        "candidate_ratio": round(exhaustive_evals * len(result.tokens) / positions / max(result.evaluations, 1), 1),
        # All work in forward-equivalents: a gradient step (forward + backward) counted as 3 forwards.
        "work_ratio": round(exhaustive_evals * len(result.tokens) / positions / max(
            result.evaluations + 3 * result.gradient_steps + result.proposal_forwards, 1), 1),
        "time_ratio": round(exhaustive_seconds * len(result.tokens) / positions / max(seconds, 1e-9), 1),
        "recovered": [t.recovered_id for t in result.tokens], "note": note,
    }


def bench(handle: ModelHandle, name: str, layer: int, ids: list[int], orders: list[str],
          exhaustive_positions: int) -> list[dict]:
    n, vocab = len(ids), inv.vocab_size(handle)
    measured = n if exhaustive_positions <= 0 else min(n, exhaustive_positions)
    exhaustive = inv.reconstruct(handle, inv.AttackParams(layer=layer, exhaustive=True, positions=measured,
                                                          max_batch=2048), ids=ids)
    ex_seconds = sum(t.seconds for t in exhaustive.tokens) / measured * n
    ex_evals = n * vocab
    note = "" if measured == n else f"measured on {measured} position(s), time extrapolated to {n}"
    rows = [{
        "model": name, "layer": layer, "method": "exhaustive", "positions": measured,
        "accuracy": exhaustive.accuracy, "candidates": ex_evals, "gradient_steps": 0, "proposal_forwards": 0,
        "seconds": round(ex_seconds, 3), "candidate_ratio": 1.0, "work_ratio": 1.0, "time_ratio": 1.0,
        "recovered": [t.recovered_id for t in exhaustive.tokens], "note": note,
    }]
    for order in orders:
        result = inv.reconstruct(handle, inv.AttackParams(layer=layer, order=order), ids=ids)
        r = row(name, layer, order, result, ex_evals, ex_seconds, n)
        r["identical_to_exhaustive"] = r["recovered"][:measured] == rows[0]["recovered"]
        rows.append(r)
        print(f"  {name} {order}: {r['accuracy']:.0%}, {r['candidates']:,} candidates, {r['seconds']:.1f} s",
              file=sys.stderr)
    return rows


def table(rows: list[dict]) -> str:
    head = ("| model | layer | method | accuracy | candidates scored | gradient steps | wall time (s) | "
            "fewer candidates | less work (all passes) | less time | same tokens as exhaustive |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        same = "—" if r["method"] == "exhaustive" else ("yes" if r.get("identical_to_exhaustive") else "NO")
        star = " *" if r["note"] else ""
        lines.append(f"| {r['model']} | {r['layer']} | {r['method']} | {r['accuracy']:.0%} | {r['candidates']:,} | "
                     f"{r['gradient_steps']} | {r['seconds']:.1f}{star} | {r['candidate_ratio']:,.0f}× | "
                     f"{r['work_ratio']:,.0f}× | "
                     f"{r['time_ratio']:,.1f}× | {same} |")
    notes = sorted({f"* exhaustive on {r['model']}: {r['note']}" for r in rows if r["note"]})
    return "\n".join(lines + [""] + notes)


def noise_model() -> tuple[str, ModelHandle]:
    if "shapes-lm" in zoo_models():
        return "shapes-lm", load_model(ModelSpec("zoo", "shapes-lm"))
    import tempfile

    from analysis.model_access.tiny_models import save_tiny_llama

    folder = save_tiny_llama(Path(tempfile.mkdtemp()) / "tiny-llama")
    os.environ["MODEL_INSPECTOR_ROOTS"] = str(folder.parent)
    return "tiny random Llama", load_model(ModelSpec("local", str(folder)))


def noise_table(named: tuple[str, ModelHandle], quick: bool) -> str:
    """Accuracy vs Gaussian noise for each permutation defence (16 random tokens, middle layer)."""
    name, handle = named
    layer = max(1, handle.info.layers // 2)
    words = sorted(w for w in handle.tokenizer.get_vocab() if not w.startswith("<"))
    prompt = " ".join(words[i] for i in random_ids(len(words), 8 if quick else 16, seed=2))
    noises = [0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0]
    sweep = inv.sweep_noise(handle, inv.AttackParams(prompt=prompt, layer=layer, order="hybrid"), noises)
    acc = {(p.defence, p.noise): p.accuracy for p in sweep.points}
    lines = [f"Accuracy vs Gaussian noise on {name}, layer {layer} (σ in units of the states' std):", "",
             "| defence | " + " | ".join(f"σ={s:g}" for s in noises) + " |", "|---|" + "---|" * len(noises)]
    for perm in inv.defence_names("permutation"):
        lines.append(f"| {inv.defence_label(perm)} | " + " | ".join(f"{acc[(perm, s)]:.0%}" for s in noises) + " |")
    return "\n".join(lines)


REAL_MODEL = "zoo:smollm2-135m-instruct"
REAL_FOLDER = Path("/work/models/smollm2-135m-instruct")  # a converted copy, before the zoo has it


def real_model(spec: str) -> tuple[str, ModelHandle]:
    """The real trained model: the zoo's, else the converted local copy (read-only), else an error."""
    from analysis.model_access.models import ModelLoadError

    try:
        return result_name(spec), load_model(ModelSpec.parse(spec))
    except ModelLoadError:
        if not REAL_FOLDER.is_dir():
            raise
        os.environ["MODEL_INSPECTOR_ROOTS"] = f"{REAL_FOLDER.parent}:{os.environ.get('MODEL_INSPECTOR_ROOTS', '')}"
        return result_name(f"local:{REAL_FOLDER}"), load_model(ModelSpec("local", str(REAL_FOLDER)))


def floor_seconds(handle: ModelHandle, params: inv.AttackParams, result: inv.AttackResult,
                  ids: list[int]) -> tuple[float, float]:
    """(plain forwards, gradient passes) on the same tokens, timed. The plain forwards are the model calls
    the attack cannot do without: the victim's forward of the first L layers, then per position its scored
    candidates (as many as it scored, in batches of at most `max_batch`, through the first L layers after
    the cached prefix) and the prefix's extension by the true token (with the next-token logits when the
    order proposes from them). The gradient passes are gradient inversion's forward+backward steps where
    the attack ran them (the model calls that replace scoring thousands of candidates there). No ranking,
    no calibration, no start-of-text prior, no bookkeeping."""
    gen = torch.Generator().manual_seed(0)
    vocab = inv.vocab_size(handle)
    logits = inv.make_order(params).needs_logits
    vocabulary = inv.Vocabulary(anatomy.input_embeddings(handle.language_model).weight.cpu())
    vocabulary.stats()
    plain = gradient = 0.0
    with handle.patch() as patch, torch.no_grad():
        probe = inv.Probe(handle, patch, params.layer)
        t0 = time.perf_counter()
        observed, _ = probe.run(torch.tensor([ids], device=handle.device), 0)
        cache = probe.new_cache()
        plain += time.perf_counter() - t0
        for t in result.tokens:
            t0 = time.perf_counter()
            for start in range(0, t.evaluations, params.max_batch):
                size = min(params.max_batch, t.evaluations - start)
                probe.candidates(cache, t.position, torch.randint(0, vocab, (size,), generator=gen).to(handle.device))
            plain += time.perf_counter() - t0
            if t.gradient_steps:
                t0 = time.perf_counter()
                probe.invert(cache, t.position, observed[0, t.position:t.position + 1], False, t.gradient_steps,
                             vocabulary)
                gradient += time.perf_counter() - t0
            t0 = time.perf_counter()
            if t.position < len(result.tokens) - 1:
                probe.run(torch.tensor([[ids[t.position]]], device=handle.device), t.position, cache, full=logits)
            plain += time.perf_counter() - t0
    return plain, gradient


def default_view(name: str, handle: ModelHandle, prompt: str, layer: int, exhaustive_positions: int,
                 repeats: int = 3) -> dict:
    """The page's default view: the attack (estimated, timed, against its floor), the estimates of the
    sections that wait for a click, and exhaustive search on the first position(s) for the comparison."""
    from analysis.framework import cost

    params = inv.AttackParams(prompt=prompt, layer=layer)
    ids = inv.tokenize(handle, prompt)
    inv.reconstruct(handle, inv.AttackParams(prompt=prompt, layer=layer, positions=2))  # warm-up
    estimates, times, floors, estimator = [], [], [], []
    for _ in range(repeats):  # a shared machine's speed changes: each estimate with a fresh calibration
        cost._calibrated.pop(cost.calibration_key(handle), None)
        t0 = time.perf_counter()
        estimates.append(cost.estimate(inv.reconstruct, handle, params).seconds)
        estimator.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        result = inv.reconstruct(handle, params)
        times.append(time.perf_counter() - t0)
        floors.append(floor_seconds(handle, params, result, ids))
    measured = statistics.median(times)
    floor = statistics.median(p + g for p, g in floors)
    estimate_ratios = [t / e for t, e in zip(times, estimates)]
    floor_ratios = [t / (p + g) for t, (p, g) in zip(times, floors)]
    plain_ratios = [t / p for t, (p, g) in zip(times, floors)]
    others = {kind: cost.estimate(fn, handle, params, kw).seconds for kind, fn, kw in (
        ("layers", inv.sweep_layers, {}), ("noise", inv.sweep_noise, {"noises": [0.0, 0.01, 0.1, 0.3, 1.0, 3.0]}),
        ("speed", inv.compare_exhaustive, {"measured_positions": exhaustive_positions}))}
    cascade_params = inv.CascadeParams(prompt=prompt, layer=layer)
    cascade_estimate = cost.estimate(inv.simulate_cascade, handle, cascade_params).seconds
    t0 = time.perf_counter()
    inv.simulate_cascade(handle, cascade_params)
    cascade_seconds = time.perf_counter() - t0
    exhaustive = inv.reconstruct(handle, inv.AttackParams(prompt=prompt, layer=layer, exhaustive=True,
                                                          positions=exhaustive_positions))
    per_position = sum(t.seconds for t in exhaustive.tokens) / len(exhaustive.tokens)
    vocab = inv.vocab_size(handle)
    print(f"  {name}: {result.accuracy:.0%}, {result.evaluations:,} candidates, {times} s "
          f"(estimates {estimates}, floors {floors})", file=sys.stderr)
    return {
        "model": name, "layer": layer, "prompt": prompt, "tokens": len(ids), "vocab": vocab,
        "accuracy": result.accuracy, "candidates": result.evaluations, "gradient_steps": result.gradient_steps,
        "exhaustive_candidates": len(ids) * vocab, "ranks": [t.rank for t in result.tokens],
        "evaluations": [t.evaluations for t in result.tokens], "gradient_positions":
            [t.position for t in result.tokens if t.gradient_steps], "seconds": round(measured, 2),
        "times": [round(t, 2) for t in times], "estimates": [round(e, 2) for e in estimates],
        "estimate": round(statistics.median(estimates), 2),
        "estimate_ratio": round(statistics.median(estimate_ratios), 2),
        "estimate_ratios": [round(r, 2) for r in estimate_ratios],
        "estimator_seconds": round(statistics.median(estimator), 2), "floor": round(floor, 2),
        "floors": [[round(p, 2), round(g, 2)] for p, g in floors],
        "floor_ratio": round(statistics.median(floor_ratios), 2), "floor_ratios": [round(r, 2) for r in floor_ratios],
        "plain_ratio": round(statistics.median(plain_ratios), 2), "plain_ratios": [round(r, 2) for r in plain_ratios],
        "exhaustive_seconds_per_position": round(per_position, 2),
        "exhaustive_seconds": round(per_position * len(ids), 1),
        "exhaustive_identical": [t.recovered_id for t in exhaustive.tokens] ==
                                [t.recovered_id for t in result.tokens[:len(exhaustive.tokens)]],
        "cascade_estimate": round(cascade_estimate, 2), "cascade_seconds": round(cascade_seconds, 2),
        "waiting_estimates": {k: round(v, 1) for k, v in others.items()},
    }


def view_table(rows: list[dict]) -> str:
    lines = ["| model | layer | tokens | recovered | candidates (exhaustive) | attack time | estimate (measured / "
             "estimate) | floor: forwards + gradient passes | time / floor | exhaustive time | sections waiting "
             "for a click (estimates) |",
             "|" + "---|" * 11]
    for r in rows:
        waiting = ", ".join(f"{k} {v:,.0f} s" for k, v in r["waiting_estimates"].items())
        lines.append(
            f"| {r['model']} | {r['layer']} | {r['tokens']} | {r['accuracy']:.0%} | {r['candidates']:,} "
            f"({r['exhaustive_candidates']:,}: {r['exhaustive_candidates'] / max(r['candidates'], 1):,.0f}× more) | "
            f"{r['seconds']:.1f} s | {r['estimate']:.1f} s ({r['estimate_ratio']:.2f}; "
            f"{min(r['estimate_ratios']):.2f}–{max(r['estimate_ratios']):.2f}) | {r['floor']:.1f} s | "
            f"{r['floor_ratio']:.2f}× ({min(r['floor_ratios']):.2f}–{max(r['floor_ratios']):.2f}; "
            f"{r['plain_ratio']:.2f}× without the gradient passes) | {r['exhaustive_seconds']:,.0f} s ({r['exhaustive_seconds'] / r['seconds']:,.0f}× "
            f"the attack) | {waiting} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpt2-positions", type=int, default=8, help="prompt length on GPT-2-small")
    ap.add_argument("--exhaustive-positions", type=int, default=2, help="GPT-2 positions searched exhaustively")
    ap.add_argument("--shapes-positions", type=int, default=16)
    ap.add_argument("--parts", default="shapes,gpt2,noise,real",
                    help="comma list of shapes, gpt2, noise, real; parts not run keep their rows from the last JSON")
    ap.add_argument("--real-model", default=REAL_MODEL, help="the real trained model of the `real` part")
    ap.add_argument("--quick", action="store_true", help="3-token GPT-2 prompt (smoke test)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "2"))))
    out = RESULTS / "inversion_bench.json"
    old = json.loads(out.read_text()) if out.is_file() else {}
    rows: dict[str, list[dict]] = {k: v for k, v in old.get("parts", {}).items() if k not in parts}
    noise_md = old.get("noise_markdown", "") if "noise" not in parts else ""
    if "shapes" in parts:
        if "shapes-lm" in zoo_models():
            handle = load_model(ModelSpec("zoo", "shapes-lm"))
            layer = max(1, handle.info.layers // 2)
            ids = random_ids(inv.vocab_size(handle), args.shapes_positions, seed=1)
            rows["shapes"] = bench(handle, "shapes-lm (random tokens)", layer, ids,
                                   ["hybrid", "model", "gradient", "embedding", "vocab"], 0)
            from analysis.world import shapes_world as sw

            ids = inv.tokenize(handle, sw.caption(sw.generate_scene(5)))
            rows["shapes"] += bench(handle, "shapes-lm (caption)", layer, ids, ["hybrid", "model", "gradient"], 0)
        else:
            print("shapes-lm is not in the zoo yet: skipped", file=sys.stderr)
    if "gpt2" in parts:
        handle = gpt2_small_random()
        n = 3 if args.quick else args.gpt2_positions
        ids = random_ids(inv.vocab_size(handle), n, seed=3)
        rows["gpt2"] = bench(handle, "GPT-2-small shape, random weights", handle.info.layers // 2, ids,
                             ["hybrid", "gradient"], args.exhaustive_positions)
    if "noise" in parts:
        noise_md = noise_table(noise_model(), args.quick)
    views = old.get("views", [])
    if "real" in parts:
        from analysis.tasks.generic import PLAIN_PROMPT

        name, handle = real_model(args.real_model)
        views = [default_view(name, handle, PLAIN_PROMPT, max(1, handle.info.layers // 2), 1)]
        if "shapes-lm" in zoo_models():
            from analysis.tasks.shapes_world import SHAPES_PROMPT

            views.append(default_view("zoo:shapes-lm", load_model(ModelSpec("zoo", "shapes-lm")), SHAPES_PROMPT, 2, 22))
    all_rows = [r for key in ("shapes", "gpt2") for r in rows.get(key, [])]
    md = table(all_rows) + "\n\n" + noise_md + ("\n\nThe page's default view:\n\n" + view_table(views) if views else "")
    print(md)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
                   f"{torch.get_num_threads()} thread(s)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": all_rows, "parts": rows,
        "noise_markdown": noise_md, "views": views, "markdown": md,
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

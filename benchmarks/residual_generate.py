"""The commitment strip against the generation it reads, measured in the same run.

    OMP_NUM_THREADS=1 python benchmarks/residual_generate.py [--repeats 3] [--tokens 32] [--models zoo:shapes-lm,...]

Per model, on a clean prompt that it continues for the whole length (shapes-lm: a caption being decomposed,
colour-0; SmolLM2: "The capital of France is"), each repeat times (interleaved, so the shared machine's
load hits all alike):

- the floor: the same greedy generation as a plain `generate` (no hidden states, no logits kept);
- the panel's `generate` (analysis/residual/generation.py): the generation keeping every layer's state, and
  the logit lens's commitment strip of every generated token (candidates rule states out; the rest are read
  over the whole vocabulary);
- for reference, the naive strip: every state of every generated token read over the whole vocabulary.

Ratios use medians of this one-threaded process's CPU time (wall-time ratios beside them). Writes
benchmarks/results/residual_generate.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402

from analysis.model_access.models import ModelSpec, load_model  # noqa: E402
from analysis.residual import ResidualParams, pairs_for  # noqa: E402
from analysis.residual.generation import generate  # noqa: E402
from analysis.residual.lenses import readout  # noqa: E402
from analysis.residual.prompts import encoded  # noqa: E402


PAIRS = {"zoo:shapes-lm": "colour-0"}  # the needle and max pairs end after one token


def timed(fn) -> tuple[float, float, object]:
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c, time.perf_counter() - w, out


def bench(label: str, repeats: int, tokens: int) -> dict:
    handle = load_model(ModelSpec.parse(label))
    lm = handle.language_model
    pair = next((p for p in pairs_for(handle) if p.name == PAIRS.get(label)), pairs_for(handle)[0])
    params = ResidualParams(pair=pair.name, new_tokens=tokens)
    ids = encoded(handle, pair.clean, "prompt")
    tok = handle.tokenizer
    eos = lm.generation_config.eos_token_id if lm.generation_config.eos_token_id is not None else tok.eos_token_id

    def plain():
        with handle.session():
            return lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                               do_sample=False, eos_token_id=eos, pad_token_id=tok.pad_token_id or eos,
                               top_k=None, top_p=None, temperature=None)

    def naive():
        with handle.session():
            out = lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                              do_sample=False, eos_token_id=eos, pad_token_id=tok.pad_token_id or eos, top_k=None,
                              top_p=None, temperature=None, output_hidden_states=True, return_dict_in_generate=True)
            layers = handle.info.layers
            states = torch.stack([torch.stack([s[i][0, -1] for i in range(layers)]) for s in out.hidden_states])
            return readout(lm, states).argmax(-1)

    plain(), generate(handle, params)  # warm up
    times: dict[str, list[tuple[float, float]]] = {"plain": [], "strip": [], "naive": []}
    result = None
    for _ in range(repeats):
        for name, fn in (("plain", plain), ("strip", lambda: generate(handle, params)), ("naive", naive)):
            cpu, wall, out = timed(fn)
            times[name].append((cpu, wall))
            if name == "strip":
                result = out
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for k, v in times.items()}
    strip = result.strip("logit")
    return {
        "model": label, "prompt": pair.clean, "generated": len(result.tokens), "layers": result.layers,
        "text": result.text, "states_read_in_full": strip.full_rows, "states": strip.rows,
        "cpu_s": {k: v[0] for k, v in med.items()}, "wall_s": {k: v[1] for k, v in med.items()},
        "ratio_cpu": med["strip"][0] / med["plain"][0], "ratio_wall": med["strip"][1] / med["plain"][1],
        "naive_ratio_cpu": med["naive"][0] / med["plain"][0],
        "first": strip.first, "stays": strip.stays,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--models", default="zoo:shapes-lm,zoo:smollm2-135m-instruct")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [bench(m, args.repeats, args.tokens) for m in args.models.split(",")]
    for r in rows:
        print(f"{r['model']}: {r['generated']} tokens, strip read {r['states_read_in_full']}/{r['states']} states in "
              f"full; generate+strip / plain generate = {r['ratio_cpu']:.2f} (CPU), {r['ratio_wall']:.2f} (wall); "
              f"naive full readout: {r['naive_ratio_cpu']:.2f}")
    out = RESULTS / "residual_generate.json"
    out.write_text(json.dumps({"repeats": args.repeats, "tokens": args.tokens, "runs": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

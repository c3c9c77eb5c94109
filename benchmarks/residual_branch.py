"""Branching generations on the real model: every top alternative at one generated token, and what it costs.

    OMP_NUM_THREADS=1 python benchmarks/residual_branch.py [--model zoo:smollm2-135m-instruct] [--tokens 16] [--at 0]

The panel's `generate` continues the model's first pair (SmolLM2: "The capital of France is") greedily, then
`branch` takes each of the model's other top-5 tokens at generated token `--at` and regenerates from it. Per
branch: its text, each text's probability from the branch point (product of the model's P of its tokens; and
over the length both texts have, when one ends early), the first difference, whether the model ended it, and the process CPU time of the branch against that of the plain
generation of the whole text (greedy `generate`, no states kept), measured in the same run. Writes
benchmarks/results/residual_branch.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402
from analysis.model_access.models import ModelSpec, load_model  # noqa: E402
from analysis.residual import ResidualParams, branch, generate  # noqa: E402
from analysis.residual.generation import decode  # noqa: E402
from analysis.residual.prompts import chosen_pair, encoded  # noqa: E402


def cpu(fn):
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="zoo:smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--at", type=int, default=0)
    args = ap.parse_args(argv)
    handle = load_model(ModelSpec.parse(args.model))
    params = ResidualParams(new_tokens=args.tokens)
    ids = encoded(handle, chosen_pair(handle, params).clean, "prompt")
    decode(handle, params, ids, 2)  # warm up
    plain_s, _ = cpu(lambda: decode(handle, params, ids, args.tokens))
    gen_s, gen = cpu(lambda: generate(handle, params))
    branches = []
    for token in gen.alternative_ids[args.at]:
        seconds, b = cpu(lambda: branch(handle, params, at=args.at, token=token, main=tuple(gen.token_ids)))
        branches.append({"token": b.token, "token_id": token,
                         "p_token": gen.alternative_probs[args.at][gen.alternative_ids[args.at].index(token)],
                         "text": b.text, "tokens": len(b.ids), "ended": b.ended, "path_prob": b.path_prob,
                         "first_difference": b.first_difference, "cpu_s": seconds, "cpu_vs_plain": seconds / plain_s,
                         "common_length": dict(zip(("tokens", "main_prob", "branch_prob"), b.over_common_length()))})
    out = {"model": args.model, "prompt": gen.prompt, "text": gen.text, "generated": len(gen.tokens), "at": args.at,
           "main_path_prob": branches[0]["path_prob"], "plain_generate_cpu_s": plain_s,
           "generate_with_strip_cpu_s": gen_s, "branches": branches, "torch_threads": torch.get_num_threads(),
           "note": "process CPU time, one run, on a shared 2-core machine"}
    path = RESULTS / "residual_branch.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    for b in branches:
        print(f"{b['token']!r:12} P {b['p_token']:.3f} -> {b['text']!r} P(text) {b['path_prob']:.3g} "
              f"({b['tokens']} tokens{', ended' if b['ended'] else ''}); CPU {b['cpu_s']:.2f} s = "
              f"{b['cpu_vs_plain']:.2f} x the plain generation")
    return out


if __name__ == "__main__":
    main()

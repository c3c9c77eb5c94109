"""`python -m analysis residual [lens|patch|side|sweep] ...`: the panel from the shell; flags made from the
settings of ResidualParams (analysis/framework/settings.py), so ranges and help are the page's."""
from __future__ import annotations

import argparse

from analysis.residual.params import ResidualParams, validate_params
from analysis.framework.errors import SettingsError
from analysis.framework.settings import ArgumentParser, add_arguments, labelled, read_arguments

FIELDS = [(f, ResidualParams) for f in labelled(ResidualParams)]
WHAT = ("lens", "patch", "side", "sweep", "generate", "graph", "atp", "train-lens")


def parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m analysis residual",
                        description="Logit/tuned lens, activation and attribution patching, direct logit "
                                    "attribution, side by side.")
    ap.add_argument("what", nargs="?", default="lens", choices=WHAT,
                    help="lens: lens and direct logit attribution; patch: patch the pair; side: side by side; "
                         "sweep: residual patching over every offered pair; generate: continue the clean prompt "
                         "and show where each lens commits to every generated token; graph: the contribution graph "
                         "(Ferrando & Voita 2024) of the clean prompt; atp: false negatives of attribution patching "
                         "and AtP* against exact patching over every offered pair (--components); train-lens: train a "
                         "tuned lens for the model (the tuned-lens repository's recipe, a per-model step) and store it "
                         "under its weights hash")
    ap.add_argument("--model", default="zoo:shapes-lm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    add_arguments(ap, FIELDS)
    ap.add_argument("--threshold", type=float, default=0.04,
                    help="graph: keep edges whose importance exceeds this (the paper's tau, 0..1)")
    ap.add_argument("--position", type=int, default=None,
                    help="graph: the position the graph is built from (default: the last token)")
    ap.add_argument("--branch-at", type=int, default=None, metavar="I",
                    help="generate: branch at generated token I (0: the first), taking --branch-token there")
    ap.add_argument("--branch-token", type=int, default=None, metavar="T",
                    help="generate: the token id the branch takes (the JSON's alternative_ids list each "
                         "token's top-k)")
    ap.add_argument("--lens-steps", type=int, default=None, help="train-lens: training steps (default 100)")
    ap.add_argument("--lens-batch", type=int, default=None, help="train-lens: tokens per step (default 24)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


def _table(rows: list[list], head: list[str]) -> None:
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row) + " |")


def print_inspection(r) -> None:
    print(f"{r.model}: {r.prompt!r} -> {r.prediction!r}; target {r.target!r}" + (f", foil {r.foil!r}" if r.foil else ""))
    print(f"{r.lens.lens} lens at the last state vs the model's logits: max |difference| {r.lens.last_gap:.2e}\n")
    lens = r.lens
    _table([[i, lens.top_tokens[i][-1][0], lens.target_prob[i][-1], lens.target_rank[i][-1] + 1, lens.kl[i][-1],
             r.dla.attn[i - 1] if i else r.dla.embed, r.dla.mlp[i - 1] if i else 0.0]
            for i in range(len(lens.kl))],
           ["state", "top token", "P(target)", "rank (1 = top)", "KL to final (nats)", "DLA of the layer's attention "
            "(state 0: embeddings)", "DLA of its MLP"])
    print(f"\nDLA total {r.dla.total:.4f} (the model's own: {r.dla.model_value:.4f})")


def print_patching(r) -> None:
    print(f"{r.model}: {r.pair.clean!r} / {r.pair.corrupt!r}; logit difference clean {r.clean_diff:.3f}, "
          f"corrupted {r.corrupt_diff:.3f}")
    for g in r.grids:
        i, j, v = g.peak()
        print(f"{g.component:10s} {g.method:12s} peak {v:.3f} at {g.rows[i]}, {g.cols[j]}")
    for name, corr in r.correlation.items():
        print(f"exact vs attribution, {name}: r = {corr:.3f}")
    for f in r.false_negatives:
        print(f"false negatives of {f.method} on {f.component} (exact top {f.top} of {f.cells}): "
              f"{f.count} {', '.join(f.missed)}")


def print_sweep(r) -> None:
    print(f"{r.model}: {len(r.runs)} pairs (skipped: {', '.join(r.skipped) or 'none'}); exact vs attribution "
          f"r = {r.correlation:.3f} over every cell, median of the pairs' own r = {r.median_correlation:.3f}\n")
    _table([[i, r.subject[i], r.last[i], r.other[i], r.subject_attribution[i], r.last_attribution[i]]
            for i in range(r.layers)],
           ["state", "subject's last token", "last token", "other", "subject (attribution)", "last (attribution)"])


def print_atp_sweep(r) -> None:
    print(f"{r.model}: false negatives against exact patching over {len(r.pairs)} pairs (skipped: "
          f"{', '.join(r.skipped) or 'none'}): cells in the exact top 5 % that an estimate's top 5 % misses\n")
    _table([[t.component, t.method, t.top, t.count] for t in r.totals], ["component", "estimate", "top cells", "missed"])


def print_generation(r) -> None:
    print(f"{r.model}: {r.prompt!r} -> {r.text!r} ({len(r.tokens)} tokens, {r.params.decoding}"
          f"{', seed %d' % r.params.seed if r.params.decoding == 'sample' else ''}"
          f"{', ended by the model' if r.ended else ''})")
    print(f"states: s = after s layers (0: the embeddings, {r.layers}: the model's output)\n")
    head = ["#", "token", "P(token)", "model's top-1"]
    for s in r.strips:
        head += [f"{s.lens}: first top-1", f"{s.lens}: top-1 from"]
    rows = []
    for k, token in enumerate(r.tokens):
        row = [k, repr(token), r.prob[k], repr(r.top[k])]
        for s in r.strips:
            row += ["never" if s.first[k] is None else s.first[k], "-" if s.stays[k] is None else s.stays[k]]
        rows.append(row)
    _table(rows, head)
    if r.branch is not None:
        print_branch(r.branch)


def print_branch(b) -> None:
    was = repr(b.main_tokens[0]) if b.main_tokens else "the end"
    where = "no difference" if b.first_difference is None else f"first difference at +{b.first_difference}"
    print(f"\nbranch at generated token {b.at}: {was} -> {b.token!r} ({where})")
    print(f"main:   {b.main_text!r}  P = {b.main_path_prob:.3g}")
    print(f"branch: {b.text!r}  P = {b.path_prob:.3g}{' (ended by the model)' if b.ended else ''}")


def print_graph(r) -> None:
    print(f"{r.model}: {r.prompt!r}, from position {r.position} ({r.tokens[r.position]!r}) -> {r.prediction!r}; "
          f"tau = {r.threshold}")
    print(f"kept {r.nodes} of {r.possible_nodes} nodes, {len(r.edges)} edges; kept share {r.kept_share:.3f}\n")
    rows = []
    for j in r.ranked_sources(skip_own=False)[:8]:
        hops = [f"L{e.layer}H{max(range(r.heads), key=lambda h: e.heads[h])} {e.source}->{e.target}"
                for e in r.best_path[j] if e.kind == "attn"]
        rows.append([j, repr(r.tokens[j]), r.source_strength[j], ", ".join(hops) or "residual"])
    _table(rows, ["position", "token", "strongest path (product of importances)", "its attention hops (top head)"])


def print_lens_training(r) -> None:
    print(f"{r.model}: tuned lens stored in {r.folder} (weights sha256 {r.weights_sha256[:16]}...), {r.seconds:.0f} s")
    print(f"per-model step: lr {r.lr:g} (check-set KL after {r.check_steps} steps: "
          + ", ".join(f"{k}: {v:.2f}" for k, v in r.check.items()) + f"); then {r.steps} steps x {r.batch} tokens "
          f"of {r.train_tokens}; held out: {r.held_tokens} tokens\n")
    _table([[i, a, b, c] for i, (a, b, c) in enumerate(zip(r.logit_kl, r.tuned_kl, r.closer))],
           ["state", "logit lens: mean KL to final (nats)", "tuned lens", "share of tokens where tuned is closer"])


def train_lens_command(args) -> int:
    """`train-lens`: any loadable model, bounded by nothing but the user's patience (the page has the cost gate)."""
    import dataclasses

    from analysis.model_access.models import ModelSpec, load_model
    from analysis.residual.lens_training import LensRecipe, train_lens

    recipe = LensRecipe()
    if args.lens_steps is not None:
        recipe = dataclasses.replace(recipe, steps=args.lens_steps, check_steps=max(1, args.lens_steps // 10))
    if args.lens_batch is not None:
        recipe = dataclasses.replace(recipe, batch=args.lens_batch)
    if recipe.steps < 1 or recipe.batch < 1:
        raise SystemExit("error: --lens-steps and --lens-batch must be at least 1.")
    handle = load_model(ModelSpec.parse(args.model))
    last = [-1]

    def progress(fraction: float, message: str = "") -> None:
        if int(fraction * 20) != last[0]:
            last[0] = int(fraction * 20)
            print(f"  {fraction:4.0%} {message}", flush=True)

    result = train_lens(handle, progress=None if args.json else progress, recipe=recipe)
    print(result.to_json()) if args.json else print_lens_training(result)
    return 0


def cli(argv: list[str]) -> int:
    from analysis.model_access.models import ModelSpec, load_model
    from analysis.residual import analysis

    args = parser().parse_args(argv)
    if args.what == "train-lens":
        return train_lens_command(args)
    params = ResidualParams(**read_arguments(args, FIELDS))
    validate_params(params)  # before loading the model: bad input fails fast
    handle = load_model(ModelSpec.parse(args.model))
    if args.what == "lens":
        result, show = analysis.inspect(handle, params), print_inspection
    elif args.what == "patch":
        result, show = analysis.patch(handle, params), print_patching
    elif args.what == "side":
        other = load_model(ModelSpec.parse(params.other_model)) if params.side == "model" and params.other_model else None
        result = analysis.side_by_side(handle, params, other=other)
        show = lambda r: (print_inspection(r.a), print(), print_inspection(r.b))  # noqa: E731
    elif args.what == "generate":
        from analysis.residual.generation import generate

        if (args.branch_at is None) != (args.branch_token is None):
            raise SettingsError("--branch-at and --branch-token go together.")
        result, show = generate(handle, params), print_generation
        if args.branch_at is not None:
            from analysis.residual.branching import branch

            result.branch = branch(handle, params, at=args.branch_at, token=args.branch_token,
                                   main=tuple(result.token_ids))
    elif args.what == "graph":
        from analysis.residual.contributions import contribution_graph
        from analysis.residual.prompts import chosen_pair

        result = contribution_graph(handle, chosen_pair(handle, params).clean, threshold=args.threshold,
                                    position=args.position)
        show = print_graph
    elif args.what == "atp":
        result, show = analysis.atp_sweep(handle, params), print_atp_sweep
    else:
        result, show = analysis.pair_sweep(handle, params), print_sweep
    if args.json:
        print(result.to_json())
    else:
        show(result)
    return 0

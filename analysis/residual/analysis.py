"""The panel's run functions: a prompt through a lens with its direct logit attribution (`inspect`), a
pair patched (`patch`), two prompts or two models side by side (`side_by_side`), and residual patching
over every offered pair (`pair_sweep`)."""
from __future__ import annotations

import dataclasses
import time

import torch

from analysis.model_access import anatomy
from analysis import backends
from analysis.framework.progress import Progress
from analysis.model_access.models import ModelHandle, require_kind
from analysis.residual.dla import attribute
from analysis.residual.errors import ResidualError
from analysis.residual.hooks import SITES, trace
from analysis.residual.lenses import LENSES, readout
from analysis.residual.pairs import Pair, pairs_for
from analysis.residual.params import ResidualParams, validate_params
from analysis.residual.atp import FalseNegatives, false_negatives
from analysis.residual.patching import COMPONENTS, METHODS, Geometry, Problem
from analysis.residual.prompts import chosen_pair, encoded, scored, show
from analysis.residual.records import (
    AtpPair, AtpSweep, Inspection, LensGrid, PairRun, PairSweep, PatchGrid, Patching, SideBySide,
)

MAX_TOKENS = 128  # positions a lens grid or a patching grid shows


def _check(handle: ModelHandle, params: ResidualParams) -> None:
    require_kind(handle, "causal_lm", "vlm", panel="residual stream")
    validate_params(params)


def weights_elsewhere(handle: ModelHandle) -> str | None:
    """One line when the lens and direct logit attribution cannot run on this model, else None.

    Every forward of the panel goes through the backend seam, NDIF's included; but the lens reads each
    recorded state through the model's final norm and unembedding, and DLA weighs each part by them and by
    every layer's output projection, here, after the forward. An NDIF model's weights are not here."""
    if not backends.is_remote(handle):
        return None
    return (f"The lens and direct logit attribution read every layer through {handle.spec.label}'s final norm, "
            "unembedding and output projections in this server, and its weights stay on NDIF: they need a local or "
            "zoo model. Activation and attribution patching run on NDIF (the Patching and All pairs views).")


def _check_weights(handle: ModelHandle) -> None:
    why = weights_elsewhere(handle)
    if why:
        raise ResidualError(why)


def _ids(handle: ModelHandle, text: str, what: str) -> torch.Tensor:
    ids = encoded(handle, text, what)
    if ids.shape[1] > MAX_TOKENS:
        raise ResidualError(f"The {what} has {ids.shape[1]} tokens; this panel reads at most {MAX_TOKENS}.")
    return ids


# ---------------------------------------------------------------------------------------------
# Lens and direct logit attribution


def lens_grid(handle: ModelHandle, lens_name: str, states: torch.Tensor, model_logits: torch.Tensor,
              target: int, top_k: int) -> LensGrid:
    """`lens_name` over states (L + 1, T, D); `model_logits` (T, V) are the model's own."""
    lens = LENSES.create(lens_name)
    lens.prepare(handle)
    final = torch.log_softmax(model_logits.float(), -1)
    p_final = final.exp()
    tok = handle.tokenizer
    cols: dict[str, list] = {k: [] for k in ("tokens", "probs", "target", "rank", "kl")}
    gap = 0.0
    for layer in range(states.shape[0]):
        logits = lens.layer_logits(handle, layer, states[layer][None])[0].float()
        logp = torch.log_softmax(logits, -1)
        top = logp.topk(top_k, -1)
        cols["tokens"].append([[tok.decode([int(i)]) for i in row] for row in top.indices])
        cols["probs"].append(top.values.exp().tolist())
        cols["target"].append(logp[:, target].exp().tolist())
        cols["rank"].append((logits > logits[:, target:target + 1]).sum(-1).tolist())
        cols["kl"].append((p_final * (final - logp)).sum(-1).clamp_min(0.0).tolist())
        if layer == states.shape[0] - 1:
            gap = float((logits - model_logits.float()).abs().max())
    return LensGrid(lens=lens_name, top_tokens=cols["tokens"], top_probs=cols["probs"], target_prob=cols["target"],
                    target_rank=cols["rank"], kl=cols["kl"], last_gap=gap)


def _inspect(handle: ModelHandle, params: ResidualParams, text: str, target_text: str, foil_text: str | None,
             *, target_id: int | None = None, foil_id: int | None = None) -> Inspection:
    lm = handle.language_model
    ids = _ids(handle, text, "prompt")
    tr = trace(handle, ids, want=SITES)
    logits = tr.logits[0]
    target = target_id if target_id is not None else scored(handle, target_text, logits[-1], "target token")
    foil = foil_id if foil_id is not None else (scored(handle, foil_text, None, "foil token") if foil_text else None)
    if foil == target:
        foil = None
    heads = anatomy.head_layout(lm).heads
    states = torch.stack([tr.acts["resid"][i][0] for i in sorted(tr.acts["resid"])])
    grid = lens_grid(handle, params.lens, states, logits, target, params.top_k)
    dla = attribute(lm, tr, target, foil, heads)
    with torch.no_grad():
        own = readout(lm, states[-1, -1], softcap=False).float()
    dla.model_value = float(own[target] - (own[foil] if foil is not None else 0.0))
    tok = handle.tokenizer
    return Inspection(model=handle.spec.label, params=params, prompt=text, tokens=show(tok, ids[0].tolist()),
                      target=tok.decode([target]), target_id=target, foil=tok.decode([foil]) if foil is not None else None,
                      foil_id=foil, prediction=tok.decode([int(logits[-1].argmax())]), layers=len(states) - 1,
                      heads=heads, lens=grid, dla=dla)


def inspect(handle: ModelHandle, params: ResidualParams, progress: Progress | None = None) -> Inspection:
    """The clean prompt of the chosen pair through the chosen lens, and its direct logit attribution."""
    _check(handle, params)
    _check_weights(handle)
    pair = chosen_pair(handle, params)
    if progress:
        progress(0.0, "reading every layer")
    out = _inspect(handle, params, pair.clean, params.answer or pair.answer, params.foil or pair.foil)
    if progress:
        progress(1.0, "done")
    return out


# ---------------------------------------------------------------------------------------------
# Patching


def _problem(handle: ModelHandle, params: ResidualParams, pair: Pair) -> Problem:
    clean, corrupt = _ids(handle, pair.clean, "clean prompt"), _ids(handle, pair.corrupt, "corrupted prompt")
    if clean.shape != corrupt.shape:
        raise ResidualError(f"The clean prompt has {clean.shape[1]} tokens and the corrupted one {corrupt.shape[1]}: "
                            "patching swaps activations position by position, so both need the same number.")
    if torch.equal(clean, corrupt):
        raise ResidualError("The clean and the corrupted prompt are the same tokens: there is nothing to patch.")
    answer, foil_text = params.answer or pair.answer, params.foil or pair.foil
    first = None
    if not (answer.strip() and foil_text.strip()):  # the model's own top tokens stand in
        first = trace(handle, torch.cat([clean, corrupt]), want=(), keep=1).logits[:, -1]
    target = scored(handle, answer, first[0] if first is not None else None, "target token")
    foil = scored(handle, foil_text, first[1] if first is not None else None, "foil token")
    if target == foil:
        raise ResidualError("The target and foil are the same token: their logit difference is always 0. Name a foil "
                            "the corrupted prompt should give.")
    return Problem(clean, corrupt, target, foil)


def _pearson(a: list[float], b: list[float]) -> float:
    x, y = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    x, y = x - x.mean(), y - y.mean()
    denom = float(x.norm() * y.norm())
    return float((x @ y) / denom) if denom > 0 else float("nan")


def patch_problem(handle: ModelHandle, problem: Problem, components: list[str], methods: list[str], batch: int,
                  progress: Progress | None = None) -> tuple[float, float, dict, dict]:
    """(m_clean, m_corrupt, {(component, method): share tensor}, {method: seconds}) of one problem."""
    lm = handle.language_model
    comps = [COMPONENTS.create(n) for n in components]
    layout = anatomy.head_layout(lm)
    g = Geometry(anatomy.n_layers(lm), problem.clean.shape[1], layout.heads, layout.head_dim)
    runs, seconds = {}, {}
    for k, name in enumerate(methods):
        method = METHODS.create(name, batch=batch)
        sub = (lambda f, msg, k=k: progress((k + f) / len(methods), msg)) if progress else None
        t0 = time.perf_counter()
        runs[name] = method.run(handle, problem, comps, g, sub)
        seconds[name] = time.perf_counter() - t0
    first = runs.get("exact") or next(iter(runs.values()))
    m_clean, m_corrupt = first.clean, first.corrupt
    if abs(m_clean - m_corrupt) < 1e-6:
        raise ResidualError("The clean and corrupted prompts give the same logit difference between target and foil, "
                            "so no share of it can be recovered. Choose prompts whose answers differ.")
    shares = {(c.name, name): (values.detach().float() - m_corrupt) / (m_clean - m_corrupt)
              for name, run in runs.items() for c, values in zip(comps, run.values)}
    return m_clean, m_corrupt, shares, seconds


def patch(handle: ModelHandle, params: ResidualParams, progress: Progress | None = None) -> Patching:
    """The chosen pair patched by every chosen method at every cell of every chosen component."""
    _check(handle, params)
    pair = chosen_pair(handle, params)
    problem = _problem(handle, params, pair)
    m_clean, m_corrupt, shares, seconds = patch_problem(handle, problem, params.components, params.methods,
                                                        params.batch, progress)
    lm = handle.language_model
    layout = anatomy.head_layout(lm)
    tok = handle.tokenizer
    tokens = show(tok, problem.clean[0].tolist())
    g = Geometry(anatomy.n_layers(lm), len(tokens), layout.heads, layout.head_dim)
    grids, corr, misses = [], {}, []
    for name in params.components:
        comp = COMPONENTS.create(name)
        rows = [f"L{i}" for i in range(g.layers)]
        for method in params.methods:
            grids.append(PatchGrid(name, method, rows, comp.col_labels(g, tokens), shares[(name, method)].tolist()))
        if {"exact", "attribution"} <= set(params.methods):
            corr[name] = _pearson(shares[(name, "exact")].flatten().tolist(),
                                  shares[(name, "attribution")].flatten().tolist())
        misses += [false_negatives(name, method, shares[(name, "exact")].tolist(), shares[(name, method)].tolist(),
                                   rows, comp.col_labels(g, tokens))
                   for method in params.methods if method != "exact" and "exact" in params.methods]
    changed = (problem.clean[0] != problem.corrupt[0]).nonzero().flatten().tolist()
    return Patching(model=handle.spec.label, params=params, pair=pair, clean_tokens=tokens,
                    corrupt_tokens=show(tok, problem.corrupt[0].tolist()), target_id=problem.target,
                    foil_id=problem.foil, clean_diff=m_clean, corrupt_diff=m_corrupt, changed=changed, grids=grids,
                    correlation=corr, seconds=seconds, false_negatives=misses)


# ---------------------------------------------------------------------------------------------
# Side by side


def side_by_side(handle: ModelHandle, params: ResidualParams, progress: Progress | None = None,
                 other: ModelHandle | None = None) -> SideBySide:
    """The clean prompt beside the corrupted one (same model), or beside itself on `other` (same settings,
    same scored tokens); their differences per state at the last position."""
    _check(handle, params)
    _check_weights(handle)
    pair = chosen_pair(handle, params)
    a = _inspect(handle, params, pair.clean, params.answer or pair.answer, params.foil or pair.foil)
    if progress:
        progress(0.5, "the second side")
    if params.side == "model":
        if other is None:
            raise ResidualError("Choose the other model to compare with.")
        _same_vocabulary(handle, other)
        b = _inspect(other, params, pair.clean, "", None, target_id=a.target_id, foil_id=a.foil_id)
        labels = (handle.spec.label, other.spec.label)
    else:
        b = _inspect(handle, params, pair.corrupt, "", None, target_id=a.target_id, foil_id=a.foil_id)
        labels = ("clean prompt", "corrupted prompt")
    if len(a.dla.attn) != len(b.dla.attn) or a.heads != b.heads:
        raise ResidualError(f"{labels[0]} and {labels[1]} differ in layers or heads, so they cannot be compared "
                            "layer by layer.")
    last = a.lens.last
    diff = lambda x, y: [u - v for u, v in zip(x, y)]  # noqa: E731
    if progress:
        progress(1.0, "done")
    return SideBySide(
        a_label=labels[0], b_label=labels[1], a=a, b=b,
        target_prob_diff=diff(last(a.lens.target_prob), last(b.lens.target_prob)),
        kl_diff=diff(last(a.lens.kl), last(b.lens.kl)), dla_diff=diff(a.dla.layers(), b.dla.layers()),
        head_diff=[diff(x, y) for x, y in zip(a.dla.heads, b.dla.heads)], same_tokens=a.tokens == b.tokens)


def _same_vocabulary(a: ModelHandle, b: ModelHandle) -> None:
    if a.info.vocab_size != b.info.vocab_size or a.tokenizer.get_vocab() != b.tokenizer.get_vocab():
        raise ResidualError(f"{a.spec.label} and {b.spec.label} have different vocabularies, so the same tokens "
                            "cannot be read by both.")


# ---------------------------------------------------------------------------------------------
# Every offered pair


def _offered_problems(handle: ModelHandle, params: ResidualParams, progress: Progress | None, skipped: list[str]):
    """Each pair offered for this model that can be patched, as (pair, its problem, its share of `progress`); the
    names of the others go to `skipped`."""
    offered = pairs_for(handle)
    for k, pair in enumerate(offered):
        try:
            problem = _problem(handle, dataclasses.replace(params, answer="", foil=""), pair)
        except ResidualError:
            skipped.append(pair.name)
            continue
        sub = (lambda f, msg, k=k, name=pair.name: progress((k + f) / len(offered), f"{name}: {msg}")) \
            if progress else None
        yield pair, problem, sub


def pair_sweep(handle: ModelHandle, params: ResidualParams, progress: Progress | None = None) -> PairSweep:
    """Residual-stream patching (exact and attribution) over every pair offered for this model."""
    _check(handle, params)
    runs, skipped, cells_exact, cells_attr = [], [], [], []
    for pair, problem, sub in _offered_problems(handle, params, progress, skipped):
        m_c, m_x, shares, _ = patch_problem(handle, problem, ["residual"], ["exact", "attribution"], params.batch, sub)
        changed = (problem.clean[0] != problem.corrupt[0]).nonzero().flatten().tolist()
        exact, attr = shares[("residual", "exact")], shares[("residual", "attribution")]
        runs.append(PairRun(pair.name, m_c, m_x, changed[-1], exact.tolist(), attr.tolist(),
                            _pearson(exact.flatten().tolist(), attr.flatten().tolist())))
        cells_exact += exact.flatten().tolist()
        cells_attr += attr.flatten().tolist()
    if not runs:
        raise ResidualError(f"None of the offered pairs can be patched on {handle.spec.label}.")
    return PairSweep(model=handle.spec.label, layers=anatomy.n_layers(handle.language_model), runs=runs,
                     subject=_mean_at(runs, "exact", "subject"), last=_mean_at(runs, "exact", "last"),
                     other=_mean_at(runs, "exact", "other"), subject_attribution=_mean_at(runs, "attribution", "subject"),
                     last_attribution=_mean_at(runs, "attribution", "last"),
                     correlation=_pearson(cells_exact, cells_attr), skipped=skipped,
                     median_correlation=_median([r.correlation for r in runs]))


def atp_sweep(handle: ModelHandle, params: ResidualParams, progress: Progress | None = None) -> AtpSweep:
    """Exact, attribution and AtP* on the chosen components over every pair offered for this model: the false
    negatives of each estimate per pair and summed over the pairs."""
    _check(handle, params)
    lm = handle.language_model
    layout = anatomy.head_layout(lm)
    methods = ["exact", "attribution", "atp*"]
    runs, skipped = [], []
    for pair, problem, sub in _offered_problems(handle, params, progress, skipped):
        m_c, m_x, shares, _ = patch_problem(handle, problem, params.components, methods, params.batch, sub)
        g = Geometry(anatomy.n_layers(lm), problem.clean.shape[1], layout.heads, layout.head_dim)
        rows = [f"L{i}" for i in range(g.layers)]
        tokens = show(handle.tokenizer, problem.clean[0].tolist())
        misses = [false_negatives(name, method, shares[(name, "exact")].tolist(), shares[(name, method)].tolist(),
                                  rows, COMPONENTS.create(name).col_labels(g, tokens))
                  for name in params.components for method in methods[1:]]
        runs.append(AtpPair(pair.name, m_c, m_x, misses))
    if not runs:
        raise ResidualError(f"None of the offered pairs can be patched on {handle.spec.label}.")
    totals = []
    for name in params.components:
        for method in methods[1:]:
            found = [(r.name, f) for r in runs for f in r.false_negatives if (f.component, f.method) == (name, method)]
            totals.append(FalseNegatives(name, method, sum(f.cells for _, f in found), sum(f.top for _, f in found),
                                         [f"{pair}: {cell}" for pair, f in found for cell in f.missed],
                                         [e for _, f in found for e in f.effects], min(f.cut for _, f in found)))
    return AtpSweep(model=handle.spec.label, components=list(params.components), pairs=runs, totals=totals,
                    skipped=skipped)


def _median(values: list[float]) -> float:
    import statistics

    kept = [v for v in values if v == v]  # NaN: a pair whose cells do not vary
    return statistics.median(kept) if kept else float("nan")


def _mean_at(runs: list[PairRun], method: str, where: str) -> list[float]:
    """Per layer, the mean share over pairs at the subject's last token, the last token, or elsewhere."""
    layers = len(runs[0].exact)
    out = []
    for i in range(layers):
        values = []
        for r in runs:
            row = getattr(r, method)[i]
            if where == "subject":
                values.append(row[r.subject])
            elif where == "last":
                values.append(row[-1])
            else:
                rest = [v for j, v in enumerate(row) if j not in (r.subject, len(row) - 1)]
                values.append(sum(rest) / len(rest) if rest else 0.0)
        out.append(sum(values) / len(values))
    return out

"""Cascade (sequence sharding across parties), simulated: which positions each party sees, the longest
run of unseen tokens before a seen one, the brute-force cost Σ V^(g+1), and an actual brute-force run
when that cost is small. Only what each computing party sees is modelled, not the protocol (attention
nodes, aggregation, other layers, collusion, smarter searches): see docs/readme_inversion.md.
"""
from __future__ import annotations

import itertools
import math
import time

import torch

from analysis.inversion.attack import calibrate
from analysis.inversion.params import CascadeParams, InversionError
from analysis.inversion.probe import Probe, check_layer, observed_states, token_text, tokenize, vocab_size
from analysis.inversion.records import CascadeResult, PartyView
from analysis.inversion.shardings import SHARDINGS
from analysis.model_access.models import ModelHandle
from analysis.framework.progress import Progress

BREAKABLE_LOG10 = 9  # about 15 minutes at a million candidate sequences a second
EXPENSIVE_LOG10 = 13  # about four months at that rate
BRUTE_FORCE_BATCH = 2048


def party_view(party: int, assignment: list[int], vocab: int) -> PartyView:
    """The positions `party` sees, the unseen gap before each, and log10 of its brute-force cost."""
    seen = [i for i, p in enumerate(assignment) if p == party]
    gaps, last = [], -1
    for i in seen:
        gaps.append(i - last - 1)
        last = i
    terms = torch.tensor([(g + 1) * math.log(vocab) for g in gaps], dtype=torch.float64)
    log_cost = float(torch.logsumexp(terms, 0)) / math.log(10) if seen else 0.0
    return PartyView(party, seen, gaps, max(gaps, default=0), log_cost)


def check_parties(params: CascadeParams, n_tokens: int) -> None:
    if not 1 <= params.parties <= n_tokens:
        raise InversionError(f"Choose between 1 and {n_tokens} parties for a {n_tokens}-token prompt.")
    if not 0 <= params.attacker < params.parties:
        raise InversionError(f"The attacker must be one of parties 0..{params.parties - 1}.")


def attacker_view(handle: ModelHandle, params: CascadeParams) -> tuple[list[int], list[int], list[PartyView]]:
    """(prompt ids, party of each position, every party's view), after checking the settings."""
    params.validate()
    check_layer(handle, params.layer)
    ids = tokenize(handle, params.prompt, params.max_tokens)
    check_parties(params, len(ids))
    vocab = vocab_size(handle)
    assignment = SHARDINGS.create(params.sharding).assign(len(ids), params.parties)
    return ids, assignment, [party_view(p, assignment, vocab) for p in range(params.parties)]


def simulate_cascade(handle: ModelHandle, params: CascadeParams, progress: Progress | None = None) -> CascadeResult:
    """Shard a prompt's positions across parties and let one party brute-force what it sees."""
    ids, assignment, views = attacker_view(handle, params)
    vocab = vocab_size(handle)
    view = views[params.attacker]
    recovered: list[int | None] = [None] * len(ids)
    evaluations, t0 = 0, time.perf_counter()
    ran = view.log10_cost <= math.log10(max(params.budget, 1))
    if ran:
        evaluations = _brute_force(handle, params.layer, ids, view, recovered, progress)
    seen_ok = [recovered[i] == ids[i] for i in view.positions]
    return CascadeResult(
        params=params, model=handle.spec.label, vocab_size=vocab,
        tokens=[token_text(handle, t) for t in ids], token_ids=ids,
        assignment=assignment, parties=views, largest_gap=max(v.largest_gap for v in views), brute_force_ran=ran,
        recovered=recovered, attacker_accuracy=sum(seen_ok) / max(len(seen_ok), 1) if ran else 0.0,
        evaluations=evaluations, seconds=time.perf_counter() - t0, verdict=cascade_verdict(views, vocab),
    )


def cascade_verdict(views: list[PartyView], vocab: int) -> str:
    """A plain sentence on whether the weakest party can brute-force its view."""
    cheapest = min(views, key=lambda v: v.log10_cost)
    cost = f"10^{cheapest.log10_cost:.1f} candidate sequences (V = {vocab:,}, largest gap {cheapest.largest_gap})"
    days = 10 ** cheapest.log10_cost / 1e6 / 86_400
    if cheapest.log10_cost <= BREAKABLE_LOG10:
        why = ("its vocabulary is this small" if vocab <= 1000 and cheapest.largest_gap > 0
               else "a party sees the start of the prompt" if cheapest.largest_gap == 0 else "the gaps are short")
        return (f"Breakable: party {cheapest.party} can brute-force its whole view with about {cost}. Sharding "
                f"multiplies the search by V for each unseen token, and here {why}, so it does not protect "
                "the prompt.")
    if cheapest.log10_cost <= EXPENSIVE_LOG10:
        return (f"Expensive but within reach: the weakest party needs about {cost}, roughly {days:,.1f} days at a "
                "million sequences a second — a determined attacker with GPUs gets there.")
    return f"Out of brute-force reach: the weakest party needs about {cost}."


def _brute_force(handle: ModelHandle, layer: int, ids: list[int], view: PartyView,
                 recovered: list[int | None], progress: Progress | None, batch: int = BRUTE_FORCE_BATCH) -> int:
    """For each seen position, enumerate every sequence for the unseen gap plus the seen token
    after the recovered prefix, and keep the one whose layer-L state matches (L1, epsilon)."""
    device, vocab = handle.device, vocab_size(handle)
    evaluations = 0
    observed = observed_states(handle, ids, layer).to(device)  # the targets: through the configured backend
    with handle.patch() as patch, torch.no_grad():
        probe = Probe(handle, patch, layer)
        epsilon, _ = calibrate(probe, vocab, min(len(ids), 4), device)
        cache = probe.new_cache() if layer > 0 else None
        known = 0
        for n, (pos, gap) in enumerate(zip(view.positions, view.gaps)):
            best_seq = _best_sequence(probe, cache, known, gap + 1, observed[pos], epsilon, vocab, batch, device)
            evaluations += best_seq[1]
            for k, tok in enumerate(best_seq[0]):
                recovered[known + k] = tok
            if cache is not None:
                probe.run(torch.tensor([list(best_seq[0])], device=device), known, cache)
            known = pos + 1
            if progress:
                progress((n + 1) / len(view.positions), f"seen position {pos}")
    return evaluations


def _best_sequence(probe: Probe, cache, known: int, width: int, target: torch.Tensor, epsilon: float, vocab: int,
                   batch: int, device) -> tuple[tuple[int, ...], int]:
    """(the `width`-token sequence after the prefix whose last state is nearest `target`, sequences scored):
    every sequence in vocabulary order, stopping at the first batch holding one within ε."""
    best, best_seq, evaluations = math.inf, None, 0
    combos = itertools.product(range(vocab), repeat=width)
    while True:
        chunk = list(itertools.islice(combos, batch))
        if not chunk:
            break
        seqs = torch.tensor(chunk, device=device)
        states, _ = probe.run(seqs, known, probe.expanded(cache, len(seqs)))
        dist = (states[:, -1] - target).abs().sum(dim=1)
        evaluations += len(seqs)
        j = int(dist.argmin())
        if float(dist[j]) < best:
            best, best_seq = float(dist[j]), chunk[j]
        if best <= epsilon:
            break
    return best_seq, evaluations

"""How much work a reconstruction is, counted before it starts (analysis/framework/cost.py prices it).

The attack's search depends on the data: a clean attack stops at the first certified candidate, so
its cost is set by where the true token sits in the proposal order. The model's own next-token
distribution on the prompt says where: `forecast` runs the model once over the prompt (every
position's next-token logits, and its start-of-text prior for position 0) and reads off, per position,
the true token's rank in the model order, so the batches the attack will score are counted rather than
assumed. The hybrid order interleaves that order with the embedding order (ranked as at most twice the
model rank); gradient inversion, where it runs, is assumed to put the true token first after position 0
(measured: rank 1 on SmolLM2-135M and on a random GPT-2) and to fail at position 0 (`_hybrid`).
Orders without a model ranking use fixed assumptions (embedding: CLEAN_CANDIDATES; vocabulary order:
half the vocabulary). Under noise or quantisation, or for exhaustive search, every token is scored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from analysis.framework.cost import BACKWARD, Work
from analysis.inversion.attack import CALIBRATION_BATCH, CALIBRATION_POSITIONS
from analysis.inversion.cascade import BRUTE_FORCE_BATCH, attacker_view
from analysis.inversion.defences import defence_names
from analysis.inversion.orders import GradientOrder, HybridOrder, ModelOrder
from analysis.inversion.params import AttackParams, CascadeParams, build_defences, make_order
from analysis.inversion.probe import MAX_START_CONTEXTS, Probe, tokenize, vocab_size
from analysis.inversion.sweeps import with_changes, with_noise
from analysis.model_access.models import ModelHandle

# Ranking the vocabulary, in elementwise passes over one row of the embedding table (`Throughput.per_row`;
# measured on SmolLM2's 49,152 x 576 table: the directions 3.1 passes, once per attack; an observed row's
# scores against every direction 0.16 (a matmul reading the table), each further row 0.03; an argsort of
# V scores 0.11; the table's mean and std 1.7).
DIRECTION_PASSES = 3.0  # centre and normalise the table (once per attack)
SCORE_PASSES = 0.16  # the embedding scores of one observed row (gradient inversion's nearest embeddings too)
ROW_PASSES = 0.03  # each further observed row compared (shuffled positions: every unmatched row)
SORT_PASSES = 0.11  # one argsort of V scores
STATS_PASSES = 2.0  # the table's mean and spread (gradient inversion's start and step), once
SORT_PASSES_PER_LOG2 = 3.7  # sorting each row's values (permuted dimensions): 3.7 · log2(d) passes
CLEAN_CANDIDATES = 80  # embedding order: an exact match is usually found in the first two batches (16 + 64)


@dataclass
class Search:
    """One position's forecast: candidates scored, candidate batches (forward calls), gradient steps, and
    the ranking work: whether the embedding scores are computed, how many full argsorts of V scores."""

    candidates: float
    batches: int
    gradient_steps: int = 0
    scores: bool = False
    sorts: float = 0.0


def scan(index: float, chunks: list[float], first: int, largest: int) -> Search:
    """Candidates and batches until the `index`-th candidate (1-based) when ids come in chunks of these
    lengths, each batched from `first` growing 4x up to `largest` (as `attack.candidate_batches` does)."""
    seen, batches = 0.0, 0
    for length in chunks:
        size, done = max(1, first), 0.0
        while done < length:
            step = min(size, length - done)
            done += step
            batches += 1
            if seen + done >= index:
                return Search(seen + done, batches)
            size = min(size * 4, largest)
        seen += length
    return Search(seen, batches)


def model_ranks(handle: ModelHandle, params: AttackParams, ids: list[int]) -> list[int] | None:
    """Per position, the 1-based rank of the true token in the model's proposals (its next-token
    distribution given the true prefix; at position 0 its start-of-text prior): one forward of the prompt."""
    lm = handle.language_model
    with handle.patch() as patch, torch.no_grad():
        logits = lm(input_ids=torch.tensor([ids], device=handle.device), logits_to_keep=0).logits[0].float().cpu()
        prior = Probe(handle, patch, params.layer).start_prior(handle)  # (its capture stops forwards from here on)
    rows = [prior] + [logits[i - 1] for i in range(1, len(ids))]
    return [0 if row is None else int((row > row[t]).sum()) + 1 for row, t in zip(rows, ids)]


def forecast(handle: ModelHandle, params: AttackParams, ids: list[int], ranks: list[int] | None) -> list[Search]:
    """Per attacked position, the search the attack is expected to run (`ranks`: from `model_ranks`)."""
    vocab = vocab_size(handle)
    n = min(len(ids), params.positions) if params.positions > 0 else len(ids)
    if params.exhaustive or any(d.perturbs for d in build_defences(params)):
        return [scan(vocab, [vocab], params.max_batch, params.max_batch)] * n
    order, first, largest = make_order(params), params.first_batch, params.max_batch
    out = []
    for i in range(n):
        rank = ranks[i] if ranks else 0
        if isinstance(order, GradientOrder):
            search = scan(1, [vocab], first, largest)
            search.gradient_steps = order.steps
        elif isinstance(order, ModelOrder) and rank:
            search = scan(rank, [vocab], first, largest)
            search.sorts = 1
        elif isinstance(order, HybridOrder) and rank:
            search = _hybrid(order, i, 2 * rank - 1, vocab, first, largest)
        elif params.order == "vocab":
            search = scan(vocab / 2, [vocab], first, largest)
        else:  # the embedding order (or a model order without a ranking)
            search = scan(min(vocab, CLEAN_CANDIDATES), [vocab], first, largest)
            search.scores, search.sorts = True, 1
        out.append(search)
    return out


def _hybrid(order: HybridOrder, position: int, index: int, vocab: int, first: int, largest: int) -> Search:
    """The hybrid order's search for the true token at `index` of its interleaved proposals. Past its head,
    gradient inversion is assumed to put the true token first, except at position 0: a trained model's
    first position holds its attention sink (SmolLM2-135M, layer 15: one value of 23,306 in the state),
    and there gradient inversion ranked the true token about 40,000th after 8 and after 16 steps."""
    gradient = order.gradient(vocab)
    head = min(vocab, order.head_size(vocab, position, first))
    if index <= head or not gradient:
        search = scan(index, [head, vocab - head], first, largest)
    elif position == 0:
        search = scan(index + 2 * first, [head, 2 * first, vocab], first, largest)
    else:
        search = scan(head + 1, [head, 2 * first], first, largest)  # the gradient head's first candidate
    search.gradient_steps = order.steps if gradient and index > head else 0
    # past the head (the top-k of each ranking), both rankings are sorted in full and interleaved
    search.scores, search.sorts = True, (3.0 if search.candidates > head else 0.0)
    return search


def _attack(handle: ModelHandle, params: AttackParams, n_tokens: int, searches: list[Search]) -> Work:
    """What `reconstruct` runs: the victim's states, the noise-floor calibration, the start-of-text prior,
    then per position the proposal rankings, the forecast candidate batches through the first `layer`
    blocks (prefix cached) and the prefix's extension."""
    depth = max(params.layer, 1) / max(handle.info.layers, 1)
    vocab, d = vocab_size(handle), int(handle.info.hidden_size or 1)
    defences = build_defences(params)
    sorted_dims, moves_rows = any(x.moves_dims for x in defences), any(x.moves_rows for x in defences)
    sort = SORT_PASSES_PER_LOG2 * math.log2(max(d, 2)) if sorted_dims else 0.0
    proposing = not (params.exhaustive or any(x.perturbs for x in defences))
    order = make_order(params)
    logits = order.needs_logits and proposing
    work = Work().stopped(1, depth, tokens=n_tokens, attended=n_tokens ** 2 / 2)  # the victim's states
    calib, cached = min(n_tokens, CALIBRATION_POSITIONS), int(params.layer > 0)
    work.stopped(1 + calib * (1 + cached), depth, tokens=calib * (1 + CALIBRATION_BATCH + cached),
                 attended=calib ** 2 / 2 * (1 + CALIBRATION_BATCH + cached))
    if logits:  # the start-of-text prior: a batch of special tokens through every layer
        specials = min(len(getattr(handle.tokenizer, "all_special_ids", []) or []), MAX_START_CONTEXTS)
        work.add(calls=1, tokens=specials, attended=specials)
    if any(s.scores for s in searches):
        work.add(rows=vocab * (DIRECTION_PASSES + sort))
    if any(s.gradient_steps for s in searches):
        work.add(rows=vocab * STATS_PASSES)
    for i, s in enumerate(searches):
        rows_left = n_tokens - i if moves_rows else 1  # observed rows each candidate is compared with
        work.add(rows=vocab * (s.scores * (SCORE_PASSES + ROW_PASSES * (rows_left - 1)) + s.sorts * SORT_PASSES))
        if s.gradient_steps:  # the steps, then the nearest embeddings to the optimised one
            steps = s.gradient_steps * BACKWARD
            work.stopped(steps, depth, tokens=steps, attended=steps * (i + 1), rows=vocab * (SCORE_PASSES + SORT_PASSES))
        work.stopped(s.batches, depth, tokens=s.candidates, attended=s.candidates * (i + 1),
                     rows=s.candidates * rows_left * (1 + sort / 4))  # L1 distances to the observed rows
        if i == len(searches) - 1:
            continue
        if logits:
            work.add(calls=1, tokens=1, attended=i + 1)  # extend the prefix with next-token logits (every layer)
        elif params.layer > 0:
            work.stopped(1, depth, tokens=1, attended=i + 1)  # extend the cached prefix
    return work


def _ids(handle: ModelHandle, params) -> list[int]:
    return tokenize(handle, params.prompt, params.max_tokens)


def _ranks(handle: ModelHandle, params: AttackParams, ids: list[int]) -> list[int] | None:
    """The model's ranks, when the order proposes from them (else nothing is run)."""
    return model_ranks(handle, params, ids) if isinstance(make_order(params), (ModelOrder, HybridOrder)) else None


def attack_work(handle: ModelHandle, params: AttackParams, kwargs: dict) -> Work:
    """`reconstruct`. Settings the attack would refuse are refused here, before any estimate is shown."""
    params.validate()
    ids = _ids(handle, params)
    return _attack(handle, params, len(ids), forecast(handle, params, ids, _ranks(handle, params, ids)))


def layers_work(handle: ModelHandle, params: AttackParams, kwargs: dict) -> Work:
    """`sweep_layers`: the attack at every layer (the model's ranks do not depend on the layer)."""
    ids, work = _ids(handle, params), Work()
    ranks = _ranks(handle, params, ids)
    for layer in kwargs.get("layers") or range(handle.info.layers + 1):
        p = with_changes(params, layer=layer)
        work.add(**vars(_attack(handle, p, len(ids), forecast(handle, p, ids, ranks))))
    return work


def noise_work(handle: ModelHandle, params: AttackParams, kwargs: dict) -> Work:
    """`sweep_noise`: the attack at every σ under every permutation defence."""
    ids, work = _ids(handle, params), Work()
    ranks = _ranks(handle, params, ids)
    for perm in kwargs.get("permutations") or defence_names("permutation"):
        for sigma in kwargs.get("noises", []):
            p = with_noise(params, perm, sigma)
            work.add(**vars(_attack(handle, p, len(ids), forecast(handle, p, ids, ranks))))
    return work


def speed_work(handle: ModelHandle, params: AttackParams, kwargs: dict) -> Work:
    """`compare_exhaustive`: the attack, then exhaustive search on the measured positions."""
    ids = _ids(handle, params)
    measured = min(kwargs.get("measured_positions", 0) or len(ids), len(ids))
    attack = with_changes(params, exhaustive=False)
    work = _attack(handle, attack, len(ids), forecast(handle, attack, ids, _ranks(handle, attack, ids)))
    exhaustive = with_changes(params, exhaustive=True, positions=measured)
    return work.add(**vars(_attack(handle, exhaustive, len(ids), forecast(handle, exhaustive, ids, None))))


def cascade_work(handle: ModelHandle, params: CascadeParams, kwargs: dict) -> Work:
    """`simulate_cascade`: when the attacker's view is cheap enough to brute-force, its observed states and
    noise floor, then for each seen position the sequences filling the gap before it, enumerated in
    vocabulary order in batches up to the batch holding the true sequence (the first match: its index in
    the enumeration is known from the prompt), through the first `layer` blocks, and the prefix's extension."""
    ids, _, views = attacker_view(handle, params)
    view = views[params.attacker]
    if view.log10_cost > math.log10(max(params.budget, 1)):
        return Work()
    vocab = vocab_size(handle)
    depth = max(params.layer, 1) / max(handle.info.layers, 1)
    n, calib, cached = len(ids), min(len(ids), CALIBRATION_POSITIONS), int(params.layer > 0)
    work = Work().stopped(1, depth, tokens=n, attended=n * n / 2)  # the victim's states
    work.stopped(1 + calib * (1 + cached), depth, tokens=calib * (1 + CALIBRATION_BATCH + cached),
                 attended=calib ** 2 / 2 * (1 + CALIBRATION_BATCH + cached))
    known = 0
    for pos, gap in zip(view.positions, view.gaps):
        width = gap + 1
        index = sum(t * vocab ** (width - 1 - k) for k, t in enumerate(ids[known:pos + 1]))  # lexicographic
        batches = index // BRUTE_FORCE_BATCH + 1
        count = min(float(vocab) ** width, batches * BRUTE_FORCE_BATCH)
        work.stopped(batches, depth, tokens=count * width, attended=count * width * (known + width))
        if cached:
            work.stopped(1, depth, tokens=width, attended=width * (known + width))  # extend the prefix
        known = pos + 1
    return work

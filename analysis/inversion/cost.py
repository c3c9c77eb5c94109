"""How much work a reconstruction is, counted from its settings (analysis/cost.py prices it)."""
from __future__ import annotations

import math

from analysis.cost import BACKWARD, Work
from analysis.inversion.cascade import attacker_view
from analysis.inversion.params import AttackParams, CascadeParams, build_defences, make_order
from analysis.inversion.probe import tokenize, vocab_size
from analysis.inversion.sweeps import with_changes, with_noise
from analysis.inversion.defences import defence_names
from analysis.models import ModelHandle

# Ranking the vocabulary, in elementwise passes over the embedding table (measured on a 152 k x 896
# table: embedding order 0.94 s, gradient-order distances 0.66 s, sorting every row 9.0 s more, one
# pass 0.245 s).
EMBEDDING_RANK_PASSES = 4.0  # centre, normalise, dot with the observed row, argsort
GRADIENT_RANK_PASSES = 3.0  # squared distance of every embedding to the optimised one, argsort
SORT_PASSES_PER_LOG2 = 3.7  # sorting each row's values (permuted dimensions): 3.7 · log2(d) passes
CLEAN_CANDIDATES = 80  # an exact match is usually found in the first two proposal batches (16 + 64)


def _attack(handle: ModelHandle, params: AttackParams, n_tokens: int, exhaustive: bool, noisy: bool) -> Work:
    """What `reconstruct` runs: the victim's states, the noise-floor calibration, then per
    position the proposal rankings (each a pass over the whole vocabulary) and candidate batches
    through the first `layer` blocks, with the prefix cached."""
    layers = max(params.layer, 1)
    depth = layers / max(handle.info.layers, 1)
    vocab = int(vocab_size(handle))  # the embedding table's rows (may exceed the tokenizer's)
    d = int(handle.info.hidden_size or 1)
    defences = build_defences(params)
    sorted_dims = any(x.moves_dims for x in defences)
    moves_rows = any(x.moves_rows for x in defences)
    sort = SORT_PASSES_PER_LOG2 * math.log2(max(d, 2)) if sorted_dims else 0.0
    positions = min(n_tokens, params.positions) if params.positions > 0 else n_tokens
    order = make_order(params)
    steps = getattr(order, "steps", 0)
    # the hybrid order's gradient phase runs only for a large vocabulary (else a full pass is cheaper)
    gradient = params.order == "gradient" or (params.order == "hybrid" and steps > 0
                                              and vocab >= order.gradient_min_vocab)
    logits = order.needs_logits and not (exhaustive or noisy)
    work = Work().stopped(1, depth, tokens=n_tokens, attended=n_tokens ** 2 / 2)  # the victim's states
    calib = min(n_tokens, 4)  # noise floor: 32 candidates and one cached step per position
    work.stopped(1 + 2 * calib, depth, tokens=calib + 33 * calib,
                 attended=calib ** 2 / 2 + 32 * calib * (calib + 1) / 2)
    if gradient and not (exhaustive or noisy):
        work.add(rows=vocab)  # the embedding table's spread (std), once
    for i in range(positions):
        rows_left = n_tokens - i if moves_rows else 1  # observed rows each candidate is compared with
        if exhaustive or noisy:
            cands = vocab
            calls = math.ceil(vocab / max(1, params.max_batch))
        elif params.order == "vocab":
            cands = vocab / 2  # vocabulary order: the match is halfway down on average
            calls = 3 + math.ceil(cands / max(1, params.max_batch))
        else:
            cands = min(vocab, CLEAN_CANDIDATES)
            calls = 2
            if params.order in ("embedding", "hybrid") or (params.order == "model" and i == 0):
                work.add(rows=vocab * (EMBEDDING_RANK_PASSES + sort))
            if gradient:
                work.stopped(steps * BACKWARD, depth, tokens=steps * BACKWARD, attended=steps * BACKWARD * (i + 1),
                             rows=vocab * GRADIENT_RANK_PASSES)
        work.stopped(calls, depth, tokens=cands, attended=cands * (i + 1),
                     rows=cands * rows_left * (1 + sort / 4))  # L1 distances to the observed rows
        if i == positions - 1:
            continue
        if logits:
            work.add(calls=1, tokens=1, attended=i + 1)  # extend the prefix with next-token logits (every layer)
        elif params.layer > 0:
            work.stopped(1, depth, tokens=1, attended=i + 1)  # extend the cached prefix
    return work


def _noisy(params: AttackParams) -> bool:
    return any(d.perturbs for d in build_defences(params))


def _n_tokens(handle: ModelHandle, params) -> int:
    return len(tokenize(handle, params.prompt, params.max_tokens))


def attack_work(handle: ModelHandle, params: AttackParams, kwargs: dict) -> Work:
    """`reconstruct`. Settings the attack would refuse are refused here, before any estimate is shown."""
    params.validate()
    return _attack(handle, params, _n_tokens(handle, params), params.exhaustive, _noisy(params))


def layers_work(handle: ModelHandle, params: AttackParams, kwargs: dict) -> Work:
    """`sweep_layers`: the attack at every layer."""
    n, work = _n_tokens(handle, params), Work()
    for layer in kwargs.get("layers") or range(handle.info.layers + 1):
        work.add(**vars(_attack(handle, with_changes(params, layer=layer), n, False, _noisy(params))))
    return work


def noise_work(handle: ModelHandle, params: AttackParams, kwargs: dict) -> Work:
    """`sweep_noise`: the attack at every σ under every permutation defence."""
    n, work = _n_tokens(handle, params), Work()
    for perm in kwargs.get("permutations") or defence_names("permutation"):
        for sigma in kwargs.get("noises", []):
            work.add(**vars(_attack(handle, with_noise(params, perm, sigma), n, False, sigma > 0)))
    return work


def speed_work(handle: ModelHandle, params: AttackParams, kwargs: dict) -> Work:
    """`compare_exhaustive`: the attack, then exhaustive search on the measured positions."""
    n = _n_tokens(handle, params)
    measured = kwargs.get("measured_positions", 0) or n
    work = _attack(handle, params, n, False, _noisy(params))
    return work.add(**vars(_attack(handle, with_changes(params, positions=min(measured, n)), n, True, True)))


def cascade_work(handle: ModelHandle, params: CascadeParams, kwargs: dict) -> Work:
    """`simulate_cascade`: the attacker's observed states and noise floor, then, when its view is cheap
    enough to brute-force, every sequence filling each gap before a seen position (an upper bound: the
    search stops at the first match), in batches of 2048 through the first `layer` blocks."""
    ids, _, views = attacker_view(handle, params)
    view = views[params.attacker]
    if view.log10_cost > math.log10(max(params.budget, 1)):
        return Work()
    vocab = int(vocab_size(handle))
    depth = max(params.layer, 1) / max(handle.info.layers, 1)
    n = len(ids)
    work = Work().stopped(1 + 2 * min(n, 4), depth, tokens=n + 33 * min(n, 4), attended=n * n / 2)
    known = 0
    for pos, gap in zip(view.positions, view.gaps):
        width = gap + 1
        count = float(vocab) ** width
        work.stopped(math.ceil(count / 2048), depth, tokens=count * width, attended=count * width * (known + width))
        known = pos + 1
    return work

"""The attack: recover a prompt from its (defended) layer-L states, one position at a time.

Causal masking makes the state at position i a function of tokens 0..i only. With the prefix already
recovered, candidate tokens for position i are tried in batches that share the prefix's KV cache (only
the first L layers run), in the order the proposal order gives; the first candidate whose state is within
the calibrated numerical noise ε of an observed row is accepted, otherwise the nearest state over the
whole vocabulary wins. The distance check is the certificate, so the order only changes the cost. Under
noise or quantisation no state matches exactly, so the whole vocabulary is scored and the nearest state
taken (the strongest decision, not the first "close enough" one).
"""
from __future__ import annotations

import itertools
import math
import time
from typing import Iterator

import torch

from analysis.model_access import anatomy
from analysis.inversion.defences import Defence
from analysis.inversion.orders import Context, Order, Vocabulary
from analysis.inversion.params import AttackParams, build_defences, make_order
from analysis.inversion.probe import Probe, check_layer, observed_states, token_text, tokenize, vocab_size
from analysis.inversion.records import AttackResult, TokenRecovery
from analysis.model_access.models import ModelHandle
from analysis.framework.progress import Progress

CALIBRATION_POSITIONS = 4  # random-token positions whose recomputation noise sets ε
CALIBRATION_BATCH = 32


def _distances(cands: torch.Tensor, rows: torch.Tensor, sorted_dims: bool) -> torch.Tensor:
    if sorted_dims:
        cands = cands.sort(dim=1).values
    if len(rows) <= 8:  # broadcasting beats cdist for a few rows
        return (cands[:, None, :] - rows[None]).abs().sum(dim=-1)
    return torch.cdist(cands[None], rows[None], p=1)[0]  # (B, R)


def candidate_batches(chunks: Iterator[torch.Tensor], vocab: int, first: int, largest: int,
                      tried: list[int]) -> Iterator[torch.Tensor]:
    """Batches of untried ids, following the ranked chunks, then the rest of the vocabulary.
    Within a chunk, batch sizes start at `first` and grow 4x up to `largest` (a new chunk is a new
    ranking whose head is again the likeliest); `tried` records the order used."""
    seen = torch.zeros(vocab, dtype=torch.bool)
    for chunk in itertools.chain(chunks, [torch.arange(vocab)]):
        size = max(1, first)
        chunk = chunk[chunk < vocab]
        chunk = chunk[~seen[chunk]]
        # drop repeats inside the chunk, keeping the first occurrence
        first_at = torch.full((vocab,), len(chunk), dtype=torch.long)
        first_at.scatter_reduce_(0, chunk, torch.arange(len(chunk)), reduce="amin")
        chunk = chunk[torch.sort(first_at[first_at < len(chunk)]).values]
        start = 0
        while start < len(chunk):
            batch = chunk[start:start + size]
            seen[batch] = True
            tried.extend(batch.tolist())
            yield batch
            start += len(batch)
            size = min(size * 4, largest)


def calibrate(probe: Probe, vocab: int, length: int, device, batch: int = CALIBRATION_BATCH) -> tuple[float, int]:
    """Numerical noise floor: distance between a state computed in one forward (the victim's way)
    and the same state recomputed through the attack's cached, batched path, on random tokens."""
    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, vocab, (length,), generator=gen).to(device)
    clean, _ = probe.run(ids[None], 0)
    cache = probe.new_cache() if probe.layer > 0 else None
    worst, evaluations = 0.0, 0
    for i in range(length):
        others = torch.randint(0, vocab, (batch - 1,), generator=gen).to(device)
        cands = probe.candidates(cache, i, torch.cat([ids[i:i + 1], others]))
        worst = max(worst, float((cands[0] - clean[0, i]).abs().sum()))
        evaluations += batch
        if cache is not None:
            probe.run(ids[None, i:i + 1], i, cache)
    scale = float(clean[0].abs().sum(dim=1).mean())
    return max(16 * worst, 1e-5 * scale), evaluations


class _Attack:
    """One reconstruction inside the model's patch: the observed (defended) states, ε, then one
    `position(i)` call per position, which searches it and extends the recovered prefix."""

    def __init__(self, handle: ModelHandle, probe: Probe, params: AttackParams, ids: list[int], order: Order,
                 defences: list[Defence], clean: torch.Tensor) -> None:
        self.handle, self.probe, self.params, self.ids, self.order = handle, probe, params, ids, order
        self.device, self.vocab = handle.device, vocab_size(handle)
        self.moves_rows = any(d.moves_rows for d in defences)
        self.sorted_dims = any(d.moves_dims for d in defences)
        self._observe(defences, clean)
        self.numerical_eps, self.calibration_evaluations = calibrate(
            probe, self.vocab, min(len(ids), CALIBRATION_POSITIONS), self.device)
        self.epsilon = self.numerical_eps + sum(d.tolerance(self.clean) for d in defences)
        # Under noise or quantisation no candidate can match exactly, so every token is scored anyway
        # (in vocabulary order, in large batches) and proposals would only add work.
        self.exact_possible = self.epsilon == self.numerical_eps
        self.proposing = self.exact_possible and not params.exhaustive
        self.use_logits = order.needs_logits and self.proposing
        self.vocabulary = Vocabulary(anatomy.input_embeddings(handle.language_model).weight.cpu())
        self.cache = probe.new_cache() if (params.layer > 0 or self.use_logits) else None
        self.logits = probe.start_prior(handle) if self.use_logits else None
        self.prior_forwards = int(self.logits is not None)
        self.used = torch.zeros(len(ids), dtype=torch.bool)

    def _observe(self, defences: list[Defence], clean: torch.Tensor) -> None:
        """The victim's states (`observed_states`: one forward of the first L layers), then each defence in turn."""
        self.clean = clean.cpu()
        gen = torch.Generator().manual_seed(self.params.seed)
        observed = self.clean
        for defence in defences:
            observed = defence.apply(observed, gen)
        self.observed = observed
        self.rows_seen = observed.sort(dim=1).values if self.sorted_dims else observed

    def position(self, i: int, last: bool = False) -> TokenRecovery:
        """Search position i; unless it is the `last` one attacked, extend the prefix with the token found."""
        t0 = time.perf_counter()
        row_index = torch.nonzero(~self.used).flatten() if self.moves_rows else torch.tensor([i])
        steps_used = [0]

        def invert(steps: int) -> torch.Tensor:
            steps_used[0] += steps
            return self.probe.invert(self.cache, i, self.rows_seen[row_index], self.sorted_dims, steps,
                                     self.vocabulary)

        if self.proposing:
            ctx = Context(self.logits, self.observed[row_index], self.sorted_dims, self.vocabulary, invert,
                          self.params.first_batch, i)
            chunks: Iterator[torch.Tensor] = self.order.proposals(ctx)
        else:
            chunks = iter([torch.arange(self.vocab)])
        (distance, token, row), certified, evaluations, tried = self._search(i, chunks, row_index)
        self.used[row] = True
        if not last:
            self._extend(i, token)
        true_id = self.ids[i]
        handle = self.handle
        return TokenRecovery(
            position=i, true_id=true_id, true_token=token_text(handle, true_id), recovered_id=token,
            recovered_token=token_text(handle, token), correct=token == true_id, distance=distance,
            rank=tried.index(true_id) + 1 if true_id in tried else 0, evaluations=evaluations,
            gradient_steps=steps_used[0], certified=certified or distance <= self.epsilon, matched_row=row,
            seconds=time.perf_counter() - t0,
        )

    def _search(self, i: int, chunks: Iterator[torch.Tensor], row_index: torch.Tensor):
        """((distance, token, row) of the best candidate, certified early, candidates scored, ids tried)."""
        rows = self.rows_seen[row_index]
        best, certified, evaluations, tried = (math.inf, -1, -1), False, 0, []
        size = self.params.first_batch if self.proposing else self.params.max_batch
        for batch in candidate_batches(chunks, self.vocab, size, self.params.max_batch, tried):
            states = self.probe.candidates(self.cache, i, batch.to(self.device)).cpu()
            dist, which = _distances(states, rows, self.sorted_dims).min(dim=1)
            evaluations += len(batch)
            j = int(dist.argmin())
            if float(dist[j]) < best[0]:
                best = (float(dist[j]), int(batch[j]), int(row_index[which[j]]))
            if not self.params.exhaustive:
                hits = torch.nonzero(dist <= self.numerical_eps).flatten()
                if len(hits):
                    k = int(hits[0])
                    return (float(dist[k]), int(batch[k]), int(row_index[which[k]])), True, evaluations, tried
        return best, certified, evaluations, tried

    def _extend(self, i: int, token: int) -> None:
        """Append the recovered token to the cached prefix (with the next-token logits when the order uses them)."""
        if self.cache is not None:
            _, last = self.probe.run(torch.tensor([[token]], device=self.device), i, self.cache, full=self.use_logits)
            self.logits = last[0].cpu() if last is not None else None

    def result(self, tokens: list[TokenRecovery], seconds: float) -> AttackResult:
        handle, params = self.handle, self.params
        return AttackResult(
            params=params, model=handle.spec.label, layers=handle.info.layers, vocab_size=self.vocab,
            hidden_size=int(self.clean.shape[1]), tokens=tokens,
            accuracy=sum(t.correct for t in tokens) / max(len(tokens), 1),
            evaluations=sum(t.evaluations for t in tokens),
            proposal_forwards=max(len(tokens) - 1, 0) + self.prior_forwards if self.use_logits else 0,
            gradient_steps=sum(t.gradient_steps for t in tokens),
            calibration_evaluations=self.calibration_evaluations, epsilon=self.epsilon,
            numerical_epsilon=self.numerical_eps, state_l1=float(self.clean.abs().sum(dim=1).mean()),
            seconds=seconds,
        )


def reconstruct(handle: ModelHandle, params: AttackParams, progress: Progress | None = None,
                ids: list[int] | None = None) -> AttackResult:
    """Recover the prompt of `params` from its (defended) layer-L states, position by position."""
    params.validate()
    check_layer(handle, params.layer)
    if ids is None:
        ids = tokenize(handle, params.prompt, params.max_tokens)
    order, defences = make_order(params), build_defences(params)
    n_attack = min(len(ids), params.positions) if params.positions > 0 else len(ids)
    t_start = time.perf_counter()
    clean = observed_states(handle, ids, params.layer)  # the targets: through the configured backend
    with handle.patch() as patch, torch.no_grad():
        attack = _Attack(handle, Probe(handle, patch, params.layer), params, ids, order, defences, clean)
        tokens = []
        for i in range(n_attack):
            patch.checkpoint()  # other users waiting for the model go first, between positions
            tokens.append(attack.position(i, last=i == n_attack - 1))
            if progress:
                progress((i + 1) / n_attack, f"position {i + 1}/{n_attack}")
    return attack.result(tokens, time.perf_counter() - t_start)

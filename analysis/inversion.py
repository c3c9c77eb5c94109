"""Prompt reconstruction from hidden states ("Hidden No More", ICML 2025) and the defences against it.

Threat model: the weights are public and an attacker sees the layer-L hidden states of a prompt.
Causal masking makes the state at position i a function of tokens 0..i only, so the prompt can be
recovered one position at a time: with the prefix already recovered, try candidate tokens for
position i, recompute their layer-L state (only the first L layers run, and the prefix KV cache is
shared by the whole candidate batch) and keep the candidate whose state is closest (L1) to the
observed one. Candidates are tried in a proposal order (the model's own next-token distribution,
the token embeddings closest to the observed state, or both interleaved); the first candidate whose
distance is under a calibrated epsilon (numerical noise) is accepted, otherwise the global minimum
over the whole vocabulary wins. The distance check is the certificate, so the order only changes
the cost. Under noise or quantisation no state matches exactly, so the attack scores the whole
vocabulary and takes the nearest state (the strongest decision, not the first "close enough" one).

Defences (each a small class in `DEFENCES`): shuffled positions (the attacker matches against every
row not yet used), shuffled hidden dimensions (sorted vectors are compared, which a permutation
cannot change), both, Gaussian noise relative to the state's std, and uniform quantisation.

Cascade (sequence sharding across parties) is simulated by `simulate_cascade`: which positions
each party sees, the longest run of unseen tokens before a seen one, the brute-force cost
sum V^(g+1), and an actual brute-force run when the cost is small. Only what each computing party
sees is modelled, not the protocol (attention nodes, aggregation, other layers, collusion, smarter
searches): see docs/readme_inversion.md.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Iterator

import torch

from analysis import anatomy
from analysis.models import ModelHandle
from analysis.registry import Method, Registry, SettingsError, check_range
from analysis.results import Result

Progress = Callable[[float, str], None] | None

MAX_TOKENS = 64


class InversionError(SettingsError):
    """Bad input for an inversion run; the message is meant for the user (one line)."""


# ---------------------------------------------------------------------------------------------
# Params and results


@dataclass
class AttackParams(Result):
    prompt: str = ""
    layer: int = 1  # 0 = token embeddings, k = output of decoder block k (before any final norm)
    defences: list[str] = field(default_factory=list)  # names from DEFENCES, applied in order
    noise: float = 0.5  # gaussian_noise: sigma as a multiple of the states' std
    bits: int = 4  # quantise: bits per value
    order: str = "hybrid"  # name from ORDERS
    exhaustive: bool = False  # score the whole vocabulary at every position (the baseline)
    positions: int = 0  # attack only the first `positions` positions (0 = all)
    seed: int = 0  # defences' randomness (permutations, noise)
    max_tokens: int = MAX_TOKENS
    first_batch: int = 16  # candidates in the first batch; later batches grow 4x up to max_batch
    max_batch: int = 1024
    gradient_steps: int = 8  # Adam steps of gradient inversion (orders "gradient" and "hybrid")

    def validate(self) -> None:
        """Check every setting (and build the defences and the order, which check their own):
        the one validation path of the CLI, the page and shared URLs. Raises SettingsError."""
        check_range("Layer", self.layer, low=0, integer=True)
        check_range("Positions", self.positions, low=0, integer=True)
        check_range("Defence seed", self.seed, low=0, integer=True)
        check_range("Token limit", self.max_tokens, low=1, integer=True)
        check_range("First batch", self.first_batch, low=1, integer=True)
        check_range("Largest batch", self.max_batch, low=self.first_batch, integer=True)
        build_defences(self)
        build_order(self)


@dataclass
class TokenRecovery(Result):
    position: int
    true_id: int
    true_token: str
    recovered_id: int
    recovered_token: str
    correct: bool
    distance: float  # L1 distance of the recovered token's state to its matched observed row
    rank: int  # 1-based rank of the true token among the candidates tried (0: not reached)
    evaluations: int  # candidates whose layer-L state was computed at this position
    gradient_steps: int  # forward+backward passes spent by gradient inversion at this position
    certified: bool  # distance within epsilon: consistent with the defence (exact match without one)
    matched_row: int  # row of the observed matrix it was matched to
    seconds: float


@dataclass
class AttackResult(Result):
    params: AttackParams
    model: str
    layers: int
    vocab_size: int
    hidden_size: int
    tokens: list[TokenRecovery]
    accuracy: float
    evaluations: int
    proposal_forwards: int  # full-model forwards (batch 1) that produced next-token distributions
    gradient_steps: int
    calibration_evaluations: int
    epsilon: float  # numerical + defence tolerance: a distance this small is consistent with the defence
    numerical_epsilon: float  # early-acceptance threshold (calibrated numerical noise)
    state_l1: float  # mean L1 norm of an observed state, to read distances against
    seconds: float

    @property
    def recovered_text(self) -> str:
        return " ".join(t.recovered_token for t in self.tokens)


@dataclass
class LayerPoint(Result):
    layer: int
    accuracy: float
    evaluations: int
    seconds: float


@dataclass
class LayerSweep(Result):
    params: AttackParams
    points: list[LayerPoint]


@dataclass
class NoisePoint(Result):
    defence: str
    noise: float
    accuracy: float
    evaluations: int


@dataclass
class NoiseSweep(Result):
    params: AttackParams
    points: list[NoisePoint]


@dataclass
class SpeedComparison(Result):
    """The proposal-ordered attack against exhaustive search on the same prompt and layer."""

    attack: AttackResult
    exhaustive: AttackResult  # run on the first `measured_positions` positions only
    measured_positions: int
    positions: int
    exhaustive_evaluations_total: int  # positions x vocabulary (exact count, not measured)
    exhaustive_seconds_total: float  # measured per position, extrapolated to every position
    identical_on_measured: bool
    evaluation_ratio: float
    time_ratio: float


# ---------------------------------------------------------------------------------------------
# Running the first L layers


class _Probe:
    """Captures the residual stream after block L (or the embeddings for L = 0) and stops there."""

    def __init__(self, handle: ModelHandle, patch, layer: int) -> None:
        self.lm = handle.language_model
        self.layer = layer
        self._embedding_stats: tuple[torch.Tensor, float] | None = None
        # depth L: the input of block 0 for L = 0 (the embeddings), else the output of block L - 1
        self.capture = anatomy.Capture(max(layer - 1, 0), before=layer == 0).attach(patch, self.lm)

    @property
    def captured(self) -> torch.Tensor | None:
        return self.capture.output

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.lm.config)

    def run(self, ids: torch.Tensor, start: int, cache=None, full: bool = False):
        """Layer-L states (B, T, d) of `ids` placed at positions start.., and last logits if `full`."""
        batch, length = ids.shape
        positions = torch.arange(start, start + length, device=ids.device).expand(batch, length)
        self.capture.stop = not full
        logits = None
        try:
            out = self.lm(input_ids=ids, position_ids=positions, cache=cache,
                          use_cache=cache is not None, logits_to_keep=1)
            logits = out.logits[:, -1].float()
        except anatomy.StopForward:
            pass
        finally:
            self.capture.stop = True
        return self.captured.float(), logits

    def expanded(self, cache, batch: int):
        """A cache holding the prefix once, viewed `batch` times (no copy) for a candidate batch."""
        if cache is None or cache.get_seq_length() == 0:
            return None
        out = self.new_cache()
        for src, dst in zip(cache.layers[: self.layer], out.layers[: self.layer]):
            if src.keys is None or not src.is_initialized:
                continue
            dst.lazy_initialization(src.keys, src.values)
            dst.keys = src.keys.expand(batch, *src.keys.shape[1:])
            dst.values = src.values.expand(batch, *src.values.shape[1:])
        return out

    def invert(self, cache, position: int, rows: torch.Tensor, sorted_dims: bool, steps: int) -> torch.Tensor:
        """An input embedding whose layer-L state at `position` is L1-close to one of `rows`,
        found by Adam from the mean embedding (no weights change; gradients flow only to it)."""
        table = anatomy.input_embeddings(self.lm).weight.detach()
        if self._embedding_stats is None:  # std over V x d values is slow enough to compute once
            self._embedding_stats = (table.mean(0), float(table.float().std()))
        start, scale = self._embedding_stats
        embed = start.clone().requires_grad_(True)
        opt = torch.optim.Adam([embed], lr=0.15 * scale)
        rows = rows.to(table.device)
        positions = torch.tensor([[position]], device=table.device)
        with torch.enable_grad():
            for _ in range(steps):
                try:
                    self.lm(inputs_embeds=embed[None, None], position_ids=positions,
                            cache=self.expanded(cache, 1), use_cache=cache is not None)
                except anatomy.StopForward:
                    pass
                state = self.captured[0, -1].float()
                if sorted_dims:
                    state = state.sort().values
                loss = (state[None] - rows).abs().sum(dim=1).min()
                (grad,) = torch.autograd.grad(loss, embed)
                embed.grad = grad
                opt.step()
        return embed.detach().float().cpu()

    def candidates(self, cache, position: int, ids: torch.Tensor) -> torch.Tensor:
        """Layer-L state of each candidate token (B,) at `position` after the cached prefix."""
        states, _ = self.run(ids[:, None], position, self.expanded(cache, len(ids)))
        return states[:, -1]


def observed_states(handle: ModelHandle, ids: list[int], layer: int) -> torch.Tensor:
    """The victim's layer-L hidden states (N, d) of a token sequence (one forward, first L layers)."""
    check_layer(handle, layer)
    with handle.patch() as patch, torch.no_grad():
        probe = _Probe(handle, patch, layer)
        states, _ = probe.run(torch.tensor([ids], device=handle.device), 0)
    return states[0]


def check_layer(handle: ModelHandle, layer: int) -> None:
    n = handle.info.layers
    if not 0 <= int(layer) <= n:
        raise InversionError(f"Layer {layer} is out of range: this model has layers 0 (embeddings) to {n}.")


def tokenize(handle: ModelHandle, prompt: str, max_tokens: int = MAX_TOKENS) -> list[int]:
    if not prompt or not prompt.strip():
        raise InversionError("The prompt is empty: type a few words to reconstruct.")
    ids = handle.tokenizer(prompt, add_special_tokens=True)["input_ids"]
    if len(ids) > max_tokens:
        raise InversionError(
            f"The prompt has {len(ids)} tokens; the limit here is {max_tokens}. Shorten it "
            "(the attack costs one vocabulary search per token)."
        )
    if not ids:
        raise InversionError("The prompt produced no tokens.")
    return ids


def vocab_size(handle: ModelHandle) -> int:
    return int(anatomy.input_embeddings(handle.language_model).weight.shape[0])


def token_text(handle: ModelHandle, token_id: int) -> str:
    text = handle.tokenizer.decode([int(token_id)])
    return text if text.strip() else repr(text)


# ---------------------------------------------------------------------------------------------
# Defences: what the attacker sees instead of the plain states


DEFENCES: Registry["Defence"] = Registry("defence")
NO_DEFENCE = "none"  # the selectboxes' "no defence" choice (not a class: it changes nothing)
NO_DEFENCE_LABEL = "no defence"


@dataclass
class Defence(Method):
    """What the attacker sees instead of the plain states. `kind` places it on the page: a
    "permutation" hides where values are, a "perturbation" changes them."""

    kind: ClassVar[str] = "perturbation"
    moves_rows: ClassVar[bool] = False  # rows are permuted: match against all unmatched rows
    moves_dims: ClassVar[bool] = False  # hidden dimensions are permuted: compare sorted vectors

    def apply(self, states: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return states

    def tolerance(self, states: torch.Tensor) -> float:
        """Largest L1 change (w.h.p.) the defence adds to a true match (reported, not used to stop early)."""
        return 0.0


@DEFENCES.register
@dataclass
class ShufflePositions(Defence):
    name: ClassVar[str] = "shuffle_positions"
    label: ClassVar[str] = "shuffled positions"
    kind: ClassVar[str] = "permutation"
    moves_rows: ClassVar[bool] = True

    def apply(self, states, gen):
        return states[torch.randperm(len(states), generator=gen)]


@DEFENCES.register
@dataclass
class ShuffleDims(Defence):
    name: ClassVar[str] = "shuffle_dims"
    label: ClassVar[str] = "shuffled hidden dimensions"
    kind: ClassVar[str] = "permutation"
    moves_dims: ClassVar[bool] = True

    def apply(self, states, gen):
        return states[:, torch.randperm(states.shape[1], generator=gen)]


@DEFENCES.register
@dataclass
class ShuffleBoth(Defence):
    name: ClassVar[str] = "shuffle_both"
    label: ClassVar[str] = "shuffled positions and dimensions"
    kind: ClassVar[str] = "permutation"
    moves_rows: ClassVar[bool] = True
    moves_dims: ClassVar[bool] = True

    def apply(self, states, gen):
        return ShuffleDims().apply(ShufflePositions().apply(states, gen), gen)


@DEFENCES.register
@dataclass
class GaussianNoise(Defence):
    name: ClassVar[str] = "gaussian_noise"
    label: ClassVar[str] = "Gaussian noise"
    sigma: float = 0.5  # relative to the std of the clean states

    def validate(self) -> None:
        check_range("Noise σ (multiples of the states' std)", self.sigma, low=0)

    def apply(self, states, gen):
        noise = torch.randn(states.shape, generator=gen) * (self.sigma * float(states.std()))
        return states + noise.to(states)

    def tolerance(self, states):
        # L1 norm of d iid N(0, s^2) values: mean d*s*sqrt(2/pi), std s*sqrt(d*(1-2/pi)); allow 4 std.
        d, s = states.shape[1], self.sigma * float(states.std())
        return d * s * math.sqrt(2 / math.pi) + 4 * s * math.sqrt(d * (1 - 2 / math.pi))


@DEFENCES.register
@dataclass
class Quantise(Defence):
    name: ClassVar[str] = "quantise"
    label: ClassVar[str] = "quantisation"
    bits: int = 4

    def validate(self) -> None:
        check_range("Quantisation bits", self.bits, low=1, high=32, integer=True)

    def _step(self, states) -> tuple[float, float]:
        lo, hi = float(states.min()), float(states.max())
        return lo, max(hi - lo, 1e-12) / (2 ** self.bits - 1)

    def apply(self, states, gen):
        lo, step = self._step(states)
        return torch.round((states - lo) / step) * step + lo

    def tolerance(self, states):
        return states.shape[1] * self._step(states)[1] / 2  # rounding moves each value by <= step/2


def defence_names(kind: str) -> list[str]:
    """"none" and the registered defences of one kind ("permutation" or "perturbation")."""
    return [NO_DEFENCE] + [name for name, cls in DEFENCES.items() if cls.kind == kind]


def defence_label(name: str) -> str:
    return NO_DEFENCE_LABEL if name in ("", NO_DEFENCE) else DEFENCES.label(name)


def defence_settings(params: AttackParams) -> dict:
    """The params' defence settings under the defences' field names (each class takes its own)."""
    return {"sigma": params.noise, "bits": params.bits}


def build_defences(params: AttackParams) -> list[Defence]:
    """The params' defences, in order, each validated. Every registered defence's settings are
    checked too, so an out-of-range value is reported even when its defence is not selected."""
    settings = defence_settings(params)
    for name in DEFENCES:
        DEFENCES.create(name, **settings)
    out = []
    for name in params.defences:
        if name in ("", NO_DEFENCE):
            continue
        if name not in DEFENCES:
            raise InversionError(f"Unknown defence '{name}' (choose from {', '.join(DEFENCES)}).")
        out.append(DEFENCES.create(name, **settings))
    return out


# ---------------------------------------------------------------------------------------------
# Proposal orders: which candidates to try first at a position


@dataclass
class _Context:
    """What an order may look at for one position."""

    logits: torch.Tensor | None  # next-token logits given the recovered prefix (None at position 0)
    rows: torch.Tensor  # observed rows still unmatched (R, d), as the attacker sees them
    sorted_dims: bool
    embeddings: torch.Tensor  # (V, d) input embeddings
    invert: Callable[[int], torch.Tensor]  # gradient inversion with n Adam steps: an embedding whose state matches a row
    head: int  # how many top proposals a mixed order takes from its first source


ORDERS: Registry["Order"] = Registry("proposal order")


@dataclass
class Order(Method):
    """Yields ranked chunks of candidate ids, lazily: later chunks are only computed if the attack
    has not yet found a certified match. Ids already tried are skipped; whatever no chunk named is
    tried last, in vocabulary order, so every order ends in an exhaustive search."""

    needs_logits: ClassVar[bool] = False

    def proposals(self, ctx: _Context) -> Iterator[torch.Tensor]:
        raise NotImplementedError


@ORDERS.register
@dataclass
class HybridOrder(Order):
    """The model's and the embedding's top proposals interleaved (cheap, and right most of the time
    on a trained model); then, for a large vocabulary, gradient inversion; then both orders in full.
    With a small vocabulary a full pass costs less than the gradient steps, so they are skipped."""

    name: ClassVar[str] = "hybrid"
    label: ClassVar[str] = "model + embedding proposals, then gradient inversion"
    needs_logits: ClassVar[bool] = True
    steps: int = 8  # Adam steps of the gradient phase (0: no gradient phase)
    gradient_min_vocab: int = 2048  # below this vocabulary size the gradient phase is skipped

    def validate(self) -> None:
        check_range("Gradient steps", self.steps, low=0, high=10_000, integer=True)
        check_range("Smallest vocabulary for gradient inversion", self.gradient_min_vocab, low=0, integer=True)

    def proposals(self, ctx):
        model = ctx.logits.argsort(descending=True) if ctx.logits is not None else None
        embedding = next(EmbeddingOrder().proposals(ctx))
        both = embedding if model is None else _interleave(model, embedding)
        yield both[: 2 * ctx.head]
        if self.steps > 0 and len(ctx.embeddings) >= self.gradient_min_vocab:
            yield from GradientOrder(self.steps).proposals(ctx)
        yield both


@ORDERS.register
@dataclass
class GradientOrder(Order):
    """Optimise a free input embedding until its layer-L state matches the observed row, then try
    tokens by distance to it. Works even where the next-token distribution is uninformative
    (random weights); the L1 check stays the certificate, so a poor optimum only costs time."""

    name: ClassVar[str] = "gradient"
    label: ClassVar[str] = "gradient inversion of the embedding"
    steps: int = 8  # Adam steps per position

    def validate(self) -> None:
        check_range("Gradient steps", self.steps, low=1, high=10_000, integer=True)

    def proposals(self, ctx):
        target = ctx.invert(self.steps)
        yield (ctx.embeddings - target).square().sum(dim=1).argsort()  # cdist is ~10x slower for one target


@ORDERS.register
@dataclass
class ModelOrder(Order):
    """The model's own next-token distribution given the recovered prefix (embedding order at 0)."""

    name: ClassVar[str] = "model"
    label: ClassVar[str] = "model's next-token distribution"
    needs_logits: ClassVar[bool] = True

    def proposals(self, ctx):
        if ctx.logits is None:
            yield from EmbeddingOrder().proposals(ctx)
        else:
            yield ctx.logits.argsort(descending=True)


@ORDERS.register
@dataclass
class EmbeddingOrder(Order):
    """Tokens whose input embedding points the way the observed state does: the residual stream
    keeps a trace of the current token's embedding. Needs no forward, but is weak deep in a model."""

    name: ClassVar[str] = "embedding"
    label: ClassVar[str] = "closest token embedding"

    def proposals(self, ctx):
        emb, rows = ctx.embeddings, ctx.rows
        if ctx.sorted_dims:
            emb, rows = emb.sort(dim=1).values, rows.sort(dim=1).values
        emb = torch.nn.functional.normalize(emb - emb.mean(0), dim=1)
        rows = torch.nn.functional.normalize(rows - rows.mean(1, keepdim=True) * ctx.sorted_dims, dim=1)
        yield (emb @ rows.T).amax(dim=1).argsort(descending=True)


@ORDERS.register
@dataclass
class VocabOrder(Order):
    name: ClassVar[str] = "vocab"
    label: ClassVar[str] = "vocabulary order (no proposal)"

    def proposals(self, ctx):
        yield torch.arange(len(ctx.embeddings))


def _interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a[0], b[0], a[1], b[1], ... (repeats are skipped later by the batcher)."""
    n = min(len(a), len(b))
    return torch.cat([torch.stack([a[:n], b[:n]], dim=1).reshape(-1), a[n:], b[n:]])


def build_order(params: AttackParams) -> Order:
    """The params' proposal order with its settings, validated."""
    if params.order not in ORDERS:
        raise InversionError(f"Unknown proposal order '{params.order}' (choose from {', '.join(ORDERS)}).")
    return ORDERS.create(params.order, steps=params.gradient_steps)


# ---------------------------------------------------------------------------------------------
# The attack


def _distances(cands: torch.Tensor, rows: torch.Tensor, sorted_dims: bool) -> torch.Tensor:
    if sorted_dims:
        cands = cands.sort(dim=1).values
    if len(rows) <= 8:  # broadcasting beats cdist for a few rows
        return (cands[:, None, :] - rows[None]).abs().sum(dim=-1)
    return torch.cdist(cands[None], rows[None], p=1)[0]  # (B, R)


def _candidate_batches(chunks: Iterator[torch.Tensor], vocab: int, first: int, largest: int,
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


def _calibrate(probe: _Probe, vocab: int, length: int, device, batch: int = 32) -> tuple[float, int]:
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


def reconstruct(handle: ModelHandle, params: AttackParams, progress: Progress = None,
                ids: list[int] | None = None) -> AttackResult:
    """Recover the prompt of `params` from its (defended) layer-L states, position by position."""
    params.validate()
    check_layer(handle, params.layer)
    if ids is None:
        ids = tokenize(handle, params.prompt, params.max_tokens)
    order = build_order(params)
    defences = build_defences(params)
    moves_rows = any(d.moves_rows for d in defences)
    sorted_dims = any(d.moves_dims for d in defences)
    device = handle.device
    vocab = vocab_size(handle)
    n_attack = min(len(ids), params.positions) if params.positions > 0 else len(ids)
    gen = torch.Generator().manual_seed(params.seed)
    t_start = time.perf_counter()

    with handle.patch() as patch, torch.no_grad():
        probe = _Probe(handle, patch, params.layer)
        clean, _ = probe.run(torch.tensor([ids], device=device), 0)
        clean = clean[0].cpu()
        observed = clean
        for defence in defences:
            observed = defence.apply(observed, gen)
        rows_seen = observed.sort(dim=1).values if sorted_dims else observed
        numerical_eps, calib_evals = _calibrate(probe, vocab, min(len(ids), 4), device)
        epsilon = numerical_eps + sum(d.tolerance(clean) for d in defences)
        # Under noise or quantisation no candidate can match exactly, so every token is scored anyway
        # (in vocabulary order, in large batches) and proposals would only add work.
        exact_possible = epsilon == numerical_eps
        use_logits = order.needs_logits and exact_possible and not params.exhaustive
        embeddings = anatomy.input_embeddings(handle.language_model).weight.detach().float().cpu()

        cache = probe.new_cache() if (params.layer > 0 or use_logits) else None
        logits = None
        used = torch.zeros(len(ids), dtype=torch.bool)
        tokens: list[TokenRecovery] = []
        for i in range(n_attack):
            patch.checkpoint()  # other users waiting for the model go first, between positions
            t0 = time.perf_counter()
            row_index = torch.nonzero(~used).flatten() if moves_rows else torch.tensor([i])
            rows = rows_seen[row_index]
            steps_used = [0]

            def invert(steps: int, i=i, rows=rows) -> torch.Tensor:
                steps_used[0] += steps
                return probe.invert(cache, i, rows, sorted_dims, steps)

            if params.exhaustive or not exact_possible:
                chunks: Iterator[torch.Tensor] = iter([torch.arange(vocab)])
            else:
                ctx = _Context(logits, observed[row_index], sorted_dims, embeddings, invert, params.first_batch)
                chunks = order.proposals(ctx)
            best = (math.inf, -1, -1)
            certified, evaluations, tried = False, 0, []
            size = params.first_batch if exact_possible and not params.exhaustive else params.max_batch
            for batch in _candidate_batches(chunks, vocab, size, params.max_batch, tried):
                states = probe.candidates(cache, i, batch.to(device)).cpu()
                dist, which = _distances(states, rows, sorted_dims).min(dim=1)
                evaluations += len(batch)
                j = int(dist.argmin())
                if float(dist[j]) < best[0]:
                    best = (float(dist[j]), int(batch[j]), int(row_index[which[j]]))
                if not params.exhaustive:
                    hits = torch.nonzero(dist <= numerical_eps).flatten()
                    if len(hits):
                        k = int(hits[0])
                        best = (float(dist[k]), int(batch[k]), int(row_index[which[k]]))
                        certified = True
                        break
            certified = certified or best[0] <= epsilon
            distance, token, row = best
            used[row] = True
            true_id = ids[i]
            rank = tried.index(true_id) + 1 if true_id in tried else 0
            if cache is not None:
                _, last = probe.run(torch.tensor([[token]], device=device), i, cache, full=use_logits)
                logits = last[0].cpu() if last is not None else None
            tokens.append(TokenRecovery(
                position=i, true_id=true_id, true_token=token_text(handle, true_id), recovered_id=token,
                recovered_token=token_text(handle, token), correct=token == true_id, distance=distance,
                rank=rank, evaluations=evaluations, gradient_steps=steps_used[0], certified=certified,
                matched_row=row, seconds=time.perf_counter() - t0,
            ))
            if progress:
                progress((i + 1) / n_attack, f"position {i + 1}/{n_attack}")

    return AttackResult(
        params=params, model=handle.spec.label, layers=handle.info.layers, vocab_size=vocab,
        hidden_size=int(clean.shape[1]), tokens=tokens,
        accuracy=sum(t.correct for t in tokens) / max(len(tokens), 1),
        evaluations=sum(t.evaluations for t in tokens),
        proposal_forwards=n_attack if use_logits else 0, gradient_steps=sum(t.gradient_steps for t in tokens),
        calibration_evaluations=calib_evals,
        epsilon=epsilon, numerical_epsilon=numerical_eps,
        state_l1=float(clean.abs().sum(dim=1).mean()), seconds=time.perf_counter() - t_start,
    )


def _with(params: AttackParams, **changes) -> AttackParams:
    return AttackParams.from_dict({**params.to_dict(), **changes})


def sweep_layers(handle: ModelHandle, params: AttackParams, layers: list[int] | None = None,
                 progress: Progress = None) -> LayerSweep:
    """Accuracy of the attack (with the params' defences) at each layer."""
    layers = list(range(handle.info.layers + 1)) if layers is None else layers
    ids = tokenize(handle, params.prompt, params.max_tokens)
    points = []
    for n, layer in enumerate(layers):
        r = reconstruct(handle, _with(params, layer=layer), ids=ids)
        points.append(LayerPoint(layer, r.accuracy, r.evaluations, r.seconds))
        if progress:
            progress((n + 1) / len(layers), f"layer {layer}")
    return LayerSweep(params, points)


def sweep_noise(handle: ModelHandle, params: AttackParams, noises: list[float],
                permutations: list[str] | None = None, progress: Progress = None) -> NoiseSweep:
    """Accuracy vs Gaussian noise (sigma relative to the state's std), for each permutation defence
    ("none" and every registered permutation unless `permutations` names some)."""
    permutations = defence_names("permutation") if permutations is None else permutations
    ids = tokenize(handle, params.prompt, params.max_tokens)
    points, total = [], len(noises) * len(permutations)
    for n, (perm, sigma) in enumerate(itertools.product(permutations, noises)):
        names = ([] if perm == "none" else [perm]) + (["gaussian_noise"] if sigma > 0 else [])
        r = reconstruct(handle, _with(params, defences=names, noise=sigma), ids=ids)
        points.append(NoisePoint(perm, sigma, r.accuracy, r.evaluations))
        if progress:
            progress((n + 1) / total, f"{defence_label(perm)}, sigma {sigma:g}")
    return NoiseSweep(params, points)


def compare_exhaustive(handle: ModelHandle, params: AttackParams, measured_positions: int = 0,
                       progress: Progress = None) -> SpeedComparison:
    """Run the attack, then exhaustive search on the first `measured_positions` positions
    (0 = all) and extrapolate its time to every position."""
    ids = tokenize(handle, params.prompt, params.max_tokens)
    attack = reconstruct(handle, _with(params, exhaustive=False),
                         progress=(lambda f, m: progress(0.5 * f, "attack: " + m)) if progress else None, ids=ids)
    n = len(attack.tokens)
    measured = n if measured_positions <= 0 else min(measured_positions, n)
    exhaustive = reconstruct(handle, _with(params, exhaustive=True, positions=measured),
                             progress=(lambda f, m: progress(0.5 + 0.5 * f, "exhaustive: " + m)) if progress else None,
                             ids=ids)
    per_position = sum(t.seconds for t in exhaustive.tokens) / max(measured, 1)
    total_evals = n * attack.vocab_size
    total_seconds = per_position * n
    identical = all(a.recovered_id == b.recovered_id for a, b in zip(attack.tokens, exhaustive.tokens))
    attack_seconds = sum(t.seconds for t in attack.tokens)
    return SpeedComparison(
        attack=attack, exhaustive=exhaustive, measured_positions=measured, positions=n,
        exhaustive_evaluations_total=total_evals, exhaustive_seconds_total=total_seconds,
        identical_on_measured=identical, evaluation_ratio=total_evals / max(attack.evaluations, 1),
        time_ratio=total_seconds / max(attack_seconds, 1e-9),
    )


# ---------------------------------------------------------------------------------------------
# Cascade: sequence sharding across parties


SHARDINGS: Registry["Sharding"] = Registry("sharding")


@dataclass
class Sharding(Method):
    def assign(self, n: int, parties: int) -> list[int]:
        """The party that sees each position."""
        raise NotImplementedError


@SHARDINGS.register
@dataclass
class RoundRobin(Sharding):
    name: ClassVar[str] = "round_robin"
    label: ClassVar[str] = "round-robin (position i to party i mod k)"

    def assign(self, n, parties):
        return [i % parties for i in range(n)]


@SHARDINGS.register
@dataclass
class Blocks(Sharding):
    name: ClassVar[str] = "blocks"
    label: ClassVar[str] = "contiguous blocks"

    def assign(self, n, parties):
        size = math.ceil(n / parties)
        return [i // size for i in range(n)]


@dataclass
class CascadeParams(Result):
    prompt: str = ""
    layer: int = 1
    parties: int = 2
    sharding: str = "round_robin"
    attacker: int = 0  # the party that tries to invert what it sees
    budget: int = 1_000_000  # largest brute-force run (candidate sequences) actually executed
    max_tokens: int = MAX_TOKENS

    def validate(self) -> None:
        check_range("Layer", self.layer, low=0, integer=True)
        check_range("Parties", self.parties, low=1, integer=True)
        check_range("Attacking party", self.attacker, low=0, high=self.parties - 1, integer=True)
        check_range("Brute-force budget", self.budget, low=1, integer=True)
        check_range("Token limit", self.max_tokens, low=1, integer=True)
        if self.sharding not in SHARDINGS:
            raise InversionError(f"Unknown sharding '{self.sharding}' (choose from {', '.join(SHARDINGS)}).")


@dataclass
class PartyView(Result):
    party: int
    positions: list[int]
    gaps: list[int]  # unseen tokens right before each seen position, since the party's last one
    largest_gap: int
    log10_cost: float  # log10 of sum over seen positions of V^(gap+1) candidate sequences


@dataclass
class CascadeResult(Result):
    params: CascadeParams
    model: str
    vocab_size: int
    tokens: list[str]
    token_ids: list[int]
    assignment: list[int]
    parties: list[PartyView]
    largest_gap: int
    brute_force_ran: bool
    recovered: list[int | None]  # per position: token id the attacker recovered (None: not reached)
    attacker_accuracy: float  # share of the attacker's seen positions recovered correctly
    evaluations: int
    seconds: float
    verdict: str


def _party_view(party: int, assignment: list[int], vocab: int) -> PartyView:
    seen = [i for i, p in enumerate(assignment) if p == party]
    gaps, last = [], -1
    for i in seen:
        gaps.append(i - last - 1)
        last = i
    terms = torch.tensor([(g + 1) * math.log(vocab) for g in gaps], dtype=torch.float64)
    log_cost = float(torch.logsumexp(terms, 0)) / math.log(10) if seen else 0.0
    return PartyView(party, seen, gaps, max(gaps, default=0), log_cost)


def simulate_cascade(handle: ModelHandle, params: CascadeParams, progress: Progress = None) -> CascadeResult:
    """Shard a prompt's positions across parties and let one party brute-force what it sees."""
    params.validate()
    check_layer(handle, params.layer)
    ids = tokenize(handle, params.prompt, params.max_tokens)
    if not 1 <= params.parties <= len(ids):
        raise InversionError(f"Choose between 1 and {len(ids)} parties for a {len(ids)}-token prompt.")
    if not 0 <= params.attacker < params.parties:
        raise InversionError(f"The attacker must be one of parties 0..{params.parties - 1}.")
    vocab = vocab_size(handle)
    assignment = SHARDINGS.create(params.sharding).assign(len(ids), params.parties)
    views = [_party_view(p, assignment, vocab) for p in range(params.parties)]
    view = views[params.attacker]
    recovered: list[int | None] = [None] * len(ids)
    evaluations, t0 = 0, time.perf_counter()
    ran = view.log10_cost <= math.log10(max(params.budget, 1))
    if ran:
        evaluations = _brute_force(handle, params.layer, ids, view, recovered, progress)
    seen_ok = [recovered[i] == ids[i] for i in view.positions]
    accuracy = sum(seen_ok) / max(len(seen_ok), 1) if ran else 0.0
    largest = max(v.largest_gap for v in views)
    return CascadeResult(
        params=params, model=handle.spec.label, vocab_size=vocab,
        tokens=[token_text(handle, t) for t in ids], token_ids=ids,
        assignment=assignment, parties=views, largest_gap=largest, brute_force_ran=ran, recovered=recovered,
        attacker_accuracy=accuracy, evaluations=evaluations, seconds=time.perf_counter() - t0,
        verdict=cascade_verdict(views, vocab),
    )


BREAKABLE_LOG10 = 9  # about 15 minutes at a million candidate sequences a second
EXPENSIVE_LOG10 = 13  # about four months at that rate


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
                 recovered: list[int | None], progress: Progress, batch: int = 2048) -> int:
    """For each seen position, enumerate every sequence for the unseen gap plus the seen token
    after the recovered prefix, and keep the one whose layer-L state matches (L1, epsilon)."""
    device, vocab = handle.device, vocab_size(handle)
    evaluations = 0
    with handle.patch() as patch, torch.no_grad():
        probe = _Probe(handle, patch, layer)
        observed, _ = probe.run(torch.tensor([ids], device=device), 0)
        observed = observed[0]
        epsilon, _ = _calibrate(probe, vocab, min(len(ids), 4), device)
        cache = probe.new_cache() if layer > 0 else None
        known = 0
        for n, (pos, gap) in enumerate(zip(view.positions, view.gaps)):
            width = gap + 1
            best, best_seq = math.inf, None
            combos = itertools.product(range(vocab), repeat=width)
            while True:
                chunk = list(itertools.islice(combos, batch))
                if not chunk:
                    break
                seqs = torch.tensor(chunk, device=device)
                states, _ = probe.run(seqs, known, probe.expanded(cache, len(seqs)))
                dist = (states[:, -1] - observed[pos]).abs().sum(dim=1)
                evaluations += len(seqs)
                j = int(dist.argmin())
                if float(dist[j]) < best:
                    best, best_seq = float(dist[j]), chunk[j]
                if best <= epsilon:
                    break
            for k, tok in enumerate(best_seq):
                recovered[known + k] = tok
            if cache is not None:
                probe.run(torch.tensor([list(best_seq)], device=device), known, cache)
            known = pos + 1
            if progress:
                progress((n + 1) / len(view.positions), f"seen position {pos}")
    return evaluations


# ---------------------------------------------------------------------------------------------
# Command line


def cli(argv: list[str]) -> int:
    import argparse

    from analysis.models import ModelSpec, load_model

    parser = argparse.ArgumentParser(prog="python -m analysis invert",
                                     description="Reconstruct a prompt from its layer-L hidden states.")
    parser.add_argument("--model", default="zoo:shapes-lm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--layer", type=int, default=1)
    parser.add_argument("--defence", action="append", default=[], choices=[NO_DEFENCE, *DEFENCES],
                        help="repeat to combine, e.g. --defence shuffle_both --defence gaussian_noise")
    parser.add_argument("--noise", type=float, default=0.5, help="gaussian_noise sigma / state std (>= 0)")
    parser.add_argument("--bits", type=int, default=4, help="quantise: bits per value (1-32)")
    parser.add_argument("--order", default="hybrid", choices=list(ORDERS))
    parser.add_argument("--gradient-steps", type=int, default=8, help="Adam steps of gradient inversion")
    parser.add_argument("--positions", type=int, default=0, help="attack only the first N positions (0 = all)")
    parser.add_argument("--exhaustive", action="store_true", help="score the whole vocabulary (baseline)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    params = AttackParams(prompt=args.prompt, layer=args.layer, defences=args.defence, noise=args.noise,
                          bits=args.bits, order=args.order, exhaustive=args.exhaustive, seed=args.seed,
                          gradient_steps=args.gradient_steps, positions=args.positions)
    params.validate()  # before loading the model: a bad setting fails at once (SettingsError -> "error: ...")
    handle = load_model(ModelSpec.parse(args.model))
    result = reconstruct(handle, params)
    if args.json:
        print(result.to_json())
        return 0
    print(f"{result.model}, layer {params.layer}, defences: {', '.join(params.defences) or 'none'}")
    print(f"accuracy {result.accuracy:.0%}, {result.evaluations:,} candidate evaluations, {result.seconds:.2f} s")
    for t in result.tokens:
        mark = "ok " if t.correct else "BAD"
        print(f"{t.position:4d} {mark} {t.true_token!s:>14} -> {t.recovered_token!s:<14} "
              f"dist {t.distance:.3g} rank {t.rank} evals {t.evaluations}")
    return 0


# ---------------------------------------------------------------------------------------------
# The panel's declaration (analysis/panels.py)

def _declare():
    from analysis import cost
    from analysis.panels import Analysis, Run

    return Analysis(
        name="invert", title="Prompt reconstruction", icon=":material/lock_open:", page="prompt_reconstruction.py",
        summary="Recover a prompt from hidden states, with and without defences, and see why sequence "
                "sharding (Cascade) resists it.",
        paper="Hidden No More / Cascade (ICML 2025)", kinds=("causal_lm", "vlm"),
        runs=(Run(reconstruct, cost._inv_attack), Run(sweep_layers, cost._inv_layers),
              Run(sweep_noise, cost._inv_noise), Run(compare_exhaustive, cost._inv_speed),
              Run(simulate_cascade, cost._inv_cascade)),
        cli=cli)


ANALYSIS = _declare()

"""Proposal orders: which candidate tokens to try first at a position.

The distance check certifies a match, so an order only changes the cost, never the answer: every order
ends with the rest of the vocabulary. Each order is a small class registered in `ORDERS` that owns its
settings (validated when built). `Vocabulary` holds what the orders rank the embedding table by,
computed once per attack rather than at every position.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Iterator

import torch

from analysis.framework.registry import Method, Registry
from analysis.framework.settings import setting


class Vocabulary:
    """The input-embedding table (V, d) and the derived tables the orders rank it by (built on first use)."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table.detach().float()
        self._directions: dict[bool, torch.Tensor] = {}
        self._square: torch.Tensor | None = None
        self._stats: tuple[torch.Tensor, float] | None = None

    def __len__(self) -> int:
        return len(self.table)

    def directions(self, sorted_dims: bool) -> torch.Tensor:
        """Centred unit rows (each row's values sorted first when the hidden dimensions are permuted)."""
        if sorted_dims not in self._directions:
            emb = self.table.sort(dim=1).values if sorted_dims else self.table
            self._directions[sorted_dims] = torch.nn.functional.normalize(emb - emb.mean(0), dim=1)
        return self._directions[sorted_dims]

    def nearest(self, target: torch.Tensor) -> torch.Tensor:
        """Token ids by squared L2 distance of their embedding to `target` (|e|² − 2 e·t: one matmul)."""
        if self._square is None:
            self._square = self.table.square().sum(dim=1)
        return (self._square - 2 * (self.table @ target.float())).argsort()

    def stats(self) -> tuple[torch.Tensor, float]:
        """(mean embedding, std over every value): where gradient inversion starts and its step size."""
        if self._stats is None:
            self._stats = (self.table.mean(0), float(self.table.std()))
        return self._stats


@dataclass
class Context:
    """What an order may look at for one position."""

    logits: torch.Tensor | None  # next-token logits given the recovered prefix (position 0: the start-of-text prior)
    rows: torch.Tensor  # observed rows still unmatched (R, d), as the attacker sees them
    sorted_dims: bool
    vocabulary: Vocabulary
    invert: Callable[[int], torch.Tensor]  # gradient inversion with n Adam steps: an embedding whose state matches a row
    head: int  # how many top proposals a mixed order takes from each source
    position: int = 0


ORDERS: Registry["Order"] = Registry("proposal order")


@dataclass
class Order(Method):
    """Yields ranked chunks of candidate ids, lazily: later chunks are only computed if the attack
    has not yet found a certified match. Ids already tried are skipped; whatever no chunk named is
    tried last, in vocabulary order, so every order ends in an exhaustive search."""

    needs_logits: ClassVar[bool] = False

    def proposals(self, ctx: Context) -> Iterator[torch.Tensor]:
        raise NotImplementedError


GRADIENT_STEPS = dict(label="Gradient steps", url="gradient_steps", cli="gradient-steps", high=10_000,
                      help="Adam steps of gradient inversion per position (a forward and a backward each).")


@ORDERS.register
@dataclass
class HybridOrder(Order):
    """The model's and the embedding's top proposals interleaved (cheap, and right most of the time
    on a trained model); then, for a large vocabulary, the head of gradient inversion's ranking; then
    both orders in full. With a small vocabulary a full pass costs less than the gradient steps, so
    they are skipped."""

    name: ClassVar[str] = "hybrid"
    label: ClassVar[str] = "model + embedding proposals, then gradient inversion"
    needs_logits: ClassVar[bool] = True
    steps: int = setting(8, low=0, **GRADIENT_STEPS)  # 0: no gradient phase
    gradient_min_vocab: int = setting(
        2048, label="Smallest vocabulary for gradient inversion", low=0, high=10**9,
        help="Below this vocabulary size a full pass costs less than the gradient steps: the phase is skipped.")
    gradient_after: int = setting(
        32, label="Proposals before gradient inversion", low=0, high=10**9,
        help="Model and embedding proposals tried before the gradient phase (on a trained model they usually "
             "hit first; past a few dozen, gradient inversion is the cheaper bet).")
    gradient_after_start: int = setting(
        4096, label="Proposals before gradient inversion at position 0", low=0, high=10**9,
        help="The same at the first position, which holds a trained model's attention sink: there gradient "
             "inversion fails, and the model's start-of-text prior ranks the first token within a few thousand.")

    def gradient(self, vocab: int) -> bool:
        """Whether the gradient phase runs for a vocabulary of this size."""
        return self.steps > 0 and vocab >= self.gradient_min_vocab

    def head_size(self, vocab: int, position: int, head: int) -> int:
        """Proposals tried first: before the gradient phase, or before the rest when it does not run."""
        if not self.gradient(vocab):
            return 2 * head
        return max(2 * head, self.gradient_after_start if position == 0 else self.gradient_after)

    def proposals(self, ctx):
        vocab = len(ctx.vocabulary)
        size = min(self.head_size(vocab, ctx.position, ctx.head), vocab)
        embedding = EmbeddingOrder.scores(ctx)
        # the head needs only the top of each ranking (a top-k is linear in V; the full sorts and their
        # interleave come only when the head misses: most positions of a trained model never get there)
        if ctx.logits is None:
            yield _top(embedding, size)
        else:
            yield _interleave(_top(ctx.logits, (size + 1) // 2), _top(embedding, size // 2))[:size]
        if self.gradient(vocab):
            yield GradientOrder(self.steps).ranking(ctx)[: 2 * ctx.head]
        order = embedding.argsort(descending=True)
        yield order if ctx.logits is None else _interleave(ctx.logits.argsort(descending=True), order)


@ORDERS.register
@dataclass
class GradientOrder(Order):
    """Optimise a free input embedding until its layer-L state matches the observed row, then try
    tokens by distance to it. Works even where the next-token distribution is uninformative
    (random weights); the L1 check stays the certificate, so a poor optimum only costs time."""

    name: ClassVar[str] = "gradient"
    label: ClassVar[str] = "gradient inversion of the embedding"
    steps: int = setting(8, low=1, **GRADIENT_STEPS)

    def ranking(self, ctx: Context) -> torch.Tensor:
        return ctx.vocabulary.nearest(ctx.invert(self.steps))

    def proposals(self, ctx):
        yield self.ranking(ctx)


@ORDERS.register
@dataclass
class ModelOrder(Order):
    """The model's own next-token distribution given the recovered prefix (at position 0, its prior for
    the start of a text; the embedding order where there is none)."""

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

    @staticmethod
    def scores(ctx: Context) -> torch.Tensor:
        """Each token's highest cosine between its centred embedding and an observed row (V,)."""
        rows = ctx.rows.sort(dim=1).values if ctx.sorted_dims else ctx.rows
        rows = torch.nn.functional.normalize(rows - rows.mean(1, keepdim=True) * ctx.sorted_dims, dim=1)
        cosines = ctx.vocabulary.directions(ctx.sorted_dims) @ rows.T
        return cosines[:, 0] if len(rows) == 1 else cosines.amax(dim=1)

    def proposals(self, ctx):
        yield self.scores(ctx).argsort(descending=True)


@ORDERS.register
@dataclass
class VocabOrder(Order):
    name: ClassVar[str] = "vocab"
    label: ClassVar[str] = "vocabulary order (no proposal)"

    def proposals(self, ctx):
        yield torch.arange(len(ctx.vocabulary))


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Ids of the k highest scores, highest first."""
    return scores.topk(min(k, len(scores))).indices


def _interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a[0], b[0], a[1], b[1], ... (repeats are skipped later by the batcher)."""
    n = min(len(a), len(b))
    return torch.cat([torch.stack([a[:n], b[:n]], dim=1).reshape(-1), a[n:], b[n:]])

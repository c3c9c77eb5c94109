"""Train a tuned lens for any loaded model: the tuned-lens repository's recipe, a per-model step, and the
held-out report (Belrose et al. 2023, "Eliciting Latent Predictions from Transformers with the Tuned Lens";
AlignmentResearch/tuned-lens, scripts/train_loop.py and scripts/ingredients.py).

The recipe, as the repository runs it:
- one translator per state 0..L-1, h -> h + W h + b, W and b starting at zero (the identity map: the logit
  lens); state L (what the final norm reads) needs none;
- loss: the sum over states of the mean over tokens of KL(final || lens), `final` the model's own output
  distribution, `lens` the model's final norm and unembedding applied to the translated state;
- optimiser: torch's SGD with Nesterov momentum 0.9, lr 0.1 (the repository writes lr_scale · (1 - momentum)
  with lr_scale 1), weight decay 1e-3 (torch's coupled decay: added to the gradient), the gradients of all
  translators clipped to a global norm of 1.0 before each step, the step decaying linearly to zero over the
  run (no warm-up for SGD).
What differs: the corpus (nothing is downloaded here, so no Pile: the model's own samples, temperature 1, from
English openers; held out: samples from other openers) and its size (tokens per step: `LensRecipe.batch`,
the repository's 2^18 is out of reach on a CPU).

The per-model step: the repository's lr 0.1 is not right for every model (on one real model it ends worse
than the logit lens at its penultimate state, 0.63 -> 2.59 nats, where 0.01 does not), so each of
`LensRecipe.rates` first trains `check_steps` steps and is scored on a check set (held out from training);
the one that ends lowest trains the lens.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from analysis.framework.progress import Progress, silent
from analysis.model_access import anatomy
from analysis.model_access.models import ModelHandle
from analysis.residual.hooks import trace
from analysis.residual.lenses import capped, readout
from analysis.residual.sites import project_out
from analysis.residual.translators import Translators

MOMENTUM = 0.9
WEIGHT_DECAY = 1e-3
CLIP = 1.0

OPENERS = [
    "The history of", "In a small village,", "Scientists have discovered", "Here is a recipe for",
    "The main causes of", "Once upon a time", "My favourite book is", "The weather today", "To learn a new language,",
    "The city of", "A good night's sleep", "When I was young,", "The most important thing about", "In the year 1850,",
    "Photosynthesis is", "The best way to", "Our team decided to", "Music has always", "The ocean covers",
    "Every morning, she", "The committee announced", "Computers work by", "In this article, we", "The old man",
    "Exercise helps", "The price of", "Many people believe that", "The river flows", "During the war,",
    "A healthy diet", "The museum opened", "Children learn", "The company reported", "On the other hand,",
    "The first step is", "Mountains are formed", "He opened the door and", "The law requires", "Birds migrate",
    "The train was late because", "Water boils at", "The students were asked to", "In mathematics, a", "The garden",
    "Doctors recommend", "The story begins", "Electric cars", "The village was",
    # held out: never sampled for training
    "The bridge", "Coffee is", "The painter", "Ancient Rome", "The library", "A volcano", "The election",
    "Bees", "The recipe calls for", "The engine", "In winter,", "The teacher said", "The moon", "Trade between",
    "The forest", "A new study",
]
TRAIN_OPENERS, HELD_OPENERS = OPENERS[:48], OPENERS[48:]


@dataclass(frozen=True)
class LensRecipe:
    """How much of the recipe runs: the page's and the CLI's default for any model."""

    steps: int = 100
    batch: int = 24  # tokens per step
    rates: tuple[float, ...] = (0.1, 0.03, 0.01)  # the per-model step is the one of these that ends lowest
    check_steps: int = 10
    openers: int = 24  # training openers (of TRAIN_OPENERS), one sample each
    check_openers: int = 4  # the check set: the next ones of TRAIN_OPENERS, never trained on
    held_openers: int = 8  # the report: HELD_OPENERS
    new_tokens: int = 32
    seed: int = 0

    def total_steps(self) -> int:
        return self.steps + (len(self.rates) * self.check_steps if len(self.rates) > 1 else 0)


# ---------------------------------------------------------------------------------------------
# Corpus and states


def samples(handle: ModelHandle, openers: list[str], new_tokens: int, seed: int) -> list[list[int]]:
    """The model's own continuations of each opener (temperature 1, no top-k / top-p), one at a time (no padding
    to get wrong on any model), seeded: a rerun draws the same tokens."""
    from transformers import GenerationConfig

    tok, lm = handle.tokenizer, handle.language_model
    eos = tok.eos_token_id
    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, temperature=1.0,
                              top_k=0, top_p=1.0, eos_token_id=eos, pad_token_id=tok.pad_token_id or eos)
    out = []
    with handle.session(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for opener in openers:
            ids = torch.tensor([tok(opener)["input_ids"]], device=handle.device)
            seq = lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
            out.append(seq[0].tolist())
    return out


def states_of(handle: ModelHandle, sequences: list[list[int]]) -> torch.Tensor:
    """The residual states (L + 1, N, D) of every token of every sequence (one forward per sequence), float32."""
    rows = []
    for ids in sequences:
        tr = trace(handle, torch.tensor([ids]), want=("resid",), keep=1)
        rows.append(torch.stack([tr.acts["resid"][i][0] for i in sorted(tr.acts["resid"])]).float().cpu())
    return torch.cat(rows, dim=1)


# ---------------------------------------------------------------------------------------------
# The recipe


def frozen_readout(lm: torch.nn.Module, states: torch.Tensor) -> torch.Tensor:
    """`readout` with the model's own weights held constant: gradients reach `states` only, and nothing of the
    shared model is changed (no requires_grad flipped, no .grad written)."""
    from torch.func import functional_call

    def call(module, x):
        return functional_call(module, {k: v.detach() for k, v in module.named_parameters()}, (x,))

    norm, proj = anatomy.final_norm(lm), project_out(lm)
    x = call(norm, states) if norm is not None else states
    x = call(proj, x) if proj is not None else x
    return capped(lm, call(anatomy.unembedding(lm), x))


def lens_loss(lm: torch.nn.Module, weights: list[torch.Tensor], biases: list[torch.Tensor],
              part: torch.Tensor) -> torch.Tensor:
    """Sum over states 0..L-1 of the mean over tokens of KL(final || lens) on states `part` (L + 1, B, D)."""
    with torch.no_grad():
        final = torch.log_softmax(readout(lm, part[-1]).float(), -1)
    total = part.new_zeros((), dtype=torch.float32)
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = part[i]
        logp = torch.log_softmax(frozen_readout(lm, h + h @ w.T + b).float(), -1)
        total = total + (final.exp() * (final - logp)).sum(-1).mean()
    return total


def train_translators(lm: torch.nn.Module, states: torch.Tensor, *, steps: int, batch: int, lr: float,
                      seed: int = 0, progress: Progress = silent, share: tuple[float, float] = (0.0, 1.0)
                      ) -> tuple[Translators, list[float]]:
    """The recipe from zero for `steps` steps of `batch` random tokens (all tokens, in order, when `batch` covers
    them); (the translators, the loss of every step). `progress` is told `share[0] + share[1] * done`."""
    n_layers, n, d = states.shape[0] - 1, states.shape[1], states.shape[2]
    weights = [torch.zeros(d, d, requires_grad=True) for _ in range(n_layers)]
    biases = [torch.zeros(d, requires_grad=True) for _ in range(n_layers)]
    params = [*weights, *biases]
    opt = torch.optim.SGD(params, lr=lr, momentum=MOMENTUM, nesterov=True, weight_decay=WEIGHT_DECAY)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    with torch.enable_grad():
        for step in range(steps):
            for group in opt.param_groups:  # linear decay to zero, no warm-up (the repository's SGD schedule)
                group["lr"] = lr * (1 - step / steps)
            pick = torch.randperm(n, generator=gen)[:batch] if batch < n else torch.arange(n)
            loss = lens_loss(lm, weights, biases, states[:, pick])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, CLIP)
            opt.step()
            losses.append(float(loss.detach()))
            progress(share[0] + share[1] * (step + 1) / steps, f"step {step + 1} of {steps}, lr {lr:g}")
    return (Translators(n_layers, {i: (w.detach(),) for i, w in enumerate(weights)},
                        {i: b.detach() for i, b in enumerate(biases)}), losses)


def kl_per_state(lm: torch.nn.Module, trans: Translators | None, states: torch.Tensor,
                 chunk: int = 128) -> torch.Tensor:
    """KL(final || lens) of every token at every state (L + 1, N), nats; the logit lens when `trans` is None."""
    out = torch.zeros(states.shape[0], states.shape[1], dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, states.shape[1], chunk):
            part = states[:, start:start + chunk]
            final = torch.log_softmax(readout(lm, part[-1]).float(), -1)
            for layer in range(states.shape[0]):
                x = part[layer] if trans is None else trans.apply(layer, part[layer])
                logp = torch.log_softmax(readout(lm, x).float(), -1)
                out[layer, start:start + chunk] = (final.exp() * (final - logp)).sum(-1).double()
    return out


@dataclass
class HeldOut:
    """Per state on held-out text: the mean KL to the final distribution of both lenses, and the share of tokens
    where the tuned lens is closer (state L: both are the model's output)."""

    tokens: int
    logit: list[float]
    tuned: list[float]
    closer: list[float]

    @classmethod
    def measure(cls, lm: torch.nn.Module, trans: Translators, states: torch.Tensor) -> "HeldOut":
        a, b = kl_per_state(lm, None, states), kl_per_state(lm, trans, states)
        return cls(int(states.shape[1]), a.mean(1).tolist(), b.mean(1).tolist(), (b < a).double().mean(1).tolist())


@dataclass
class Trained:
    translators: Translators
    lr: float
    check: dict[float, float] = field(default_factory=dict)  # lr -> summed mean KL on the check set
    losses: list[float] = field(default_factory=list)
    held: HeldOut | None = None
    seconds: float = 0.0


def pick_rate(lm: torch.nn.Module, train: torch.Tensor, check: torch.Tensor, recipe: LensRecipe,
              progress: Progress = silent, share: tuple[float, float] = (0.0, 1.0)) -> dict[float, float]:
    """Each rate of the recipe trained `check_steps` steps: the summed mean KL it ends with on the check set."""
    scores = {}
    width = share[1] / max(1, len(recipe.rates))
    for k, lr in enumerate(recipe.rates):
        trans, _ = train_translators(lm, train, steps=recipe.check_steps, batch=recipe.batch, lr=lr, seed=recipe.seed,
                                     progress=progress, share=(share[0] + k * width, width))
        kl = kl_per_state(lm, trans, check).mean(1)
        scores[lr] = float(kl[:-1].sum()) if bool(torch.isfinite(kl).all()) else math.inf
    return scores


def fit(lm: torch.nn.Module, train: torch.Tensor, check: torch.Tensor | None, held: torch.Tensor | None,
        recipe: LensRecipe, progress: Progress = silent) -> Trained:
    """The per-model step (when the recipe offers several and a check set is given), then the recipe with it,
    then the held-out report."""
    t0 = time.perf_counter()
    scores = {}
    checking = len(recipe.rates) > 1 and check is not None
    total = recipe.total_steps() if checking else recipe.steps
    before = recipe.check_steps * len(recipe.rates) / total if checking else 0.0
    if checking:
        scores = pick_rate(lm, train, check, recipe, progress, share=(0.0, before))
        lr = min(scores, key=scores.get)
    else:
        lr = recipe.rates[0]
    trans, losses = train_translators(lm, train, steps=recipe.steps, batch=recipe.batch, lr=lr, seed=recipe.seed,
                                      progress=progress, share=(before, 1.0 - before))
    report = HeldOut.measure(lm, trans, held) if held is not None else None
    return Trained(trans, lr, scores, losses, report, time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------
# Any loaded model, on request (the page's "Train a tuned lens", `python -m analysis residual train-lens`)


def rounded(trans: Translators, dtype: torch.dtype = torch.float16) -> Translators:
    """The translators as they are stored (float16), so that what is reported is what is read back."""
    return Translators(trans.layers, {k: tuple(t.to(dtype).float() for t in w) for k, w in trans.weights.items()},
                       {k: b.to(dtype).float() for k, b in trans.biases.items()}, dict(trans.meta))


def train_lens(handle: ModelHandle, params=None, progress: Progress | None = None,
               recipe: LensRecipe = LensRecipe()) -> "LensTraining":
    """Sample the model's own text, pick its step, train its tuned lens by the recipe, measure it on held-out
    samples and store it under the model's weights hash (translators.user_folder)."""
    from analysis.framework import paths
    from analysis.model_access.models import require_kind
    from analysis.residual.analysis import weights_elsewhere
    from analysis.residual.errors import ResidualError
    from analysis.residual.records import LensTraining
    from analysis.residual.translators import probe, user_folder, weights_hash

    require_kind(handle, "causal_lm", "vlm", panel="residual stream")
    why = weights_elsewhere(handle)
    if why:
        raise ResidualError(why)
    report = progress or silent
    t0 = time.perf_counter()
    lm = handle.language_model
    report(0.0, "sampling the model's own text")
    n_train = recipe.openers + recipe.check_openers
    seqs = samples(handle, TRAIN_OPENERS[:n_train], recipe.new_tokens, recipe.seed)
    held_seqs = samples(handle, HELD_OPENERS[:recipe.held_openers], recipe.new_tokens, recipe.seed + 1)
    report(0.1, "reading every layer of the samples")
    train = states_of(handle, seqs[:recipe.openers])
    check = states_of(handle, seqs[recipe.openers:]) if recipe.check_openers else None
    held = states_of(handle, held_seqs)
    with handle.session(), anatomy.model_step(handle, "training a tuned lens"):
        fitted = fit(lm, train, check, None, recipe, lambda f, m="": report(0.15 + 0.8 * f, m))
        stored = rounded(fitted.translators)
        report(0.96, "measuring both lenses on held-out text")
        measured = HeldOut.measure(lm, stored, held)
    digest = weights_hash(lm)
    record = LensTraining(
        model=handle.spec.label, weights_sha256=digest, lr=fitted.lr,
        check={f"{lr:g}": v for lr, v in fitted.check.items()}, steps=recipe.steps, batch=recipe.batch,
        check_steps=recipe.check_steps, train_tokens=int(train.shape[1]), held_tokens=measured.tokens,
        logit_kl=measured.logit, tuned_kl=measured.tuned, closer=measured.closer,
        seconds=time.perf_counter() - t0)
    stored.meta = {"model": handle.spec.label, "weights_sha256": digest, "probe": probe(lm),
                   "paper": "Belrose et al. 2023, Eliciting Latent Predictions from Transformers with the Tuned Lens",
                   "translator": "h + W h + b", "recipe": recipe_meta(recipe, fitted.lr, fitted.check),
                   "corpus": f"the model's own samples (temperature 1, {recipe.new_tokens} new tokens) from "
                             f"{recipe.openers} English openers; check set: {recipe.check_openers} other openers; "
                             f"held out: {recipe.held_openers} further openers",
                   "held_out_kl_nats": {"model samples, held-out openers": {
                       "tokens": measured.tokens, "logit": measured.logit, "tuned": measured.tuned,
                       "tuned_closer_share": measured.closer}},
                   "train_seconds": round(record.seconds, 1)}
    folder = stored.save(user_folder(handle.spec.label, digest))
    record.folder = paths.relative(folder)
    report(1.0, "done")
    return record


def recipe_meta(recipe: LensRecipe, lr: float, check: dict[float, float]) -> dict:
    """The recipe as stored beside a lens (the optimiser stated in full)."""
    return {"start": "zero (the identity map)", "optimizer": f"SGD, Nesterov momentum {MOMENTUM}",
            "lr": lr, "lr_choices": list(recipe.rates), "lr_check_steps": recipe.check_steps,
            "lr_check_kl": {f"{k:g}": v for k, v in check.items()}, "weight_decay": WEIGHT_DECAY,
            "grad_clip_norm": CLIP, "schedule": "linear decay to 0, no warm-up", "steps": recipe.steps,
            "batch_tokens": recipe.batch, "loss": "sum over states of mean KL(final || lens)",
            "dtype_stored": "float16", "source": "AlignmentResearch/tuned-lens scripts/train_loop.py"}

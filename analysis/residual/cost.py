"""How much work a residual-stream analysis is, counted from its settings (analysis/framework/cost.py prices it)."""
from __future__ import annotations

import math

from analysis.model_access import anatomy
from analysis.framework import cost
from analysis.framework.cost import INPUT_GRADIENT, Work
from analysis.model_access.models import ModelHandle
from analysis.residual.pairs import pairs_for
from analysis.residual.params import ResidualParams, validate_params
from analysis.residual.patching import COMPONENTS, Geometry
from analysis.residual.prompts import chosen_pair, prompt_ids

HOOK_OVERHEAD = 0.1  # a forward with a hook at every site against a plain one (Python per hook call)
# A lens cell against one position's unembedding: the final norm, log-softmax, KL, rank and top-k over the
# vocabulary and the top tokens' text. Measured on SmolLM2 (capital-france, one thread, shared machine):
# estimated 0.48 s without it, 1.2-2.1 s measured; 0.77 s with it. `patch`: estimate / measured 0.87-0.89.
LENS_CELL = 4.3


def _forward(tokens: int, rows: int = 1, logits: int = 0) -> Work:
    return Work(calls=1, tokens=tokens * rows, attended=rows * tokens * (tokens + 1) / 2, logits=logits,
                overhead=HOOK_OVERHEAD)


def inspect_work(handle: ModelHandle, params: ResidualParams, kwargs: dict) -> Work:
    """`inspect`: one forward with every position's logits, then the lens's readout of every (state, position)."""
    validate_params(params)
    t = len(prompt_ids(handle.tokenizer, chosen_pair(handle, params).clean))
    layers = handle.info.layers
    return _forward(t, logits=t - 1).add(logits=(layers + 1) * t * LENS_CELL)


def _geometry(handle: ModelHandle, t: int) -> Geometry:
    layout = anatomy.head_layout(handle.language_model)
    return Geometry(handle.info.layers, t, layout.heads, layout.head_dim)


def problem_work(handle: ModelHandle, t: int, components: list[str], methods: list[str], batch: int) -> Work:
    """One pair: the clean run, the corrupted run (with a backward for attribution), every exact cell."""
    work = _forward(t).add(**vars(_forward(t)))
    if "attribution" in methods:
        work.add(**vars(_forward(t)), times=INPUT_GRADIENT - 1)
    if "atp*" in methods:  # the attribution forward, then GradDrop's one row per layer, each with a backward
        work.add(**vars(_forward(t, rows=2)), times=INPUT_GRADIENT)
        layers, calls = handle.info.layers, math.ceil(handle.info.layers / batch)
        work.add(calls=calls, tokens=layers * t, attended=layers * t * (t + 1) / 2, overhead=HOOK_OVERHEAD * calls,
                 times=INPUT_GRADIENT)
    if "exact" in methods:
        g = _geometry(handle, t)
        cells = sum(math.prod(COMPONENTS.create(c).shape(g)) for c in components)
        work.add(calls=math.ceil(cells / batch), tokens=cells * t, attended=cells * t * (t + 1) / 2,
                 overhead=HOOK_OVERHEAD * math.ceil(cells / batch))
    return work


def patch_work(handle: ModelHandle, params: ResidualParams, kwargs: dict) -> Work:
    validate_params(params)
    t = len(prompt_ids(handle.tokenizer, chosen_pair(handle, params).clean))
    return problem_work(handle, t, params.components, params.methods, params.batch)


def side_work(handle: ModelHandle, params: ResidualParams, kwargs: dict) -> Work:
    """`side_by_side`: two inspections (the second on the other model is priced as if on this one)."""
    return inspect_work(handle, params, kwargs).add(**vars(inspect_work(handle, params, kwargs)))


def sweep_work(handle: ModelHandle, params: ResidualParams, kwargs: dict) -> Work:
    validate_params(params)
    work = Work()
    for pair in pairs_for(handle):
        t = len(prompt_ids(handle.tokenizer, pair.clean))
        work.add(**vars(problem_work(handle, t, ["residual"], ["exact", "attribution"], params.batch)))
    return work


def atp_sweep_work(handle: ModelHandle, params: ResidualParams, kwargs: dict) -> Work:
    """`atp_sweep`: every offered pair patched on the chosen components by exact, attribution and AtP*."""
    validate_params(params)
    work = Work()
    for pair in pairs_for(handle):
        t = len(prompt_ids(handle.tokenizer, pair.clean))
        work.add(**vars(problem_work(handle, t, params.components, ["exact", "attribution", "atp*"], params.batch)))
    return work


GENERATE_STEP_CALLS = 0.5  # generate()'s own work per new token beyond the forward (as analysis/sae_v/cost.py)
# Share of a strip's states read over the whole vocabulary (the rest are ruled out by candidate tokens):
# measured 0.19 on SmolLM2 (30 tokens of "The capital of France is"), 0.55 on shapes-lm (colour-0, 32 tokens).
STRIP_FULL_SHARE = 0.5


def generate_work(handle: ModelHandle, params: ResidualParams, kwargs: dict) -> Work:
    """`generate`: the prompt's prefill, one call per further token, and the strip's readouts (per lens)."""
    validate_params(params)
    t = len(prompt_ids(handle.tokenizer, chosen_pair(handle, params).clean))
    n = params.new_tokens
    lenses = 2 if params.lens != "logit" else 1
    work = cost.sequence(t, t, generate=n)
    return work.add(overhead=n * GENERATE_STEP_CALLS, logits=lenses * n * handle.info.layers * STRIP_FULL_SHARE)


def branch_work(handle: ModelHandle, params: ResidualParams, kwargs: dict) -> Work:
    """`branch`: the rest of the generation from the branch point, then one plain forward over each whole text."""
    validate_params(params)
    t = len(prompt_ids(handle.tokenizer, chosen_pair(handle, params).clean))
    main = len(kwargs.get("main") or ()) or params.new_tokens
    at = int(kwargs.get("at", 0))
    rest = max(0, params.new_tokens - at - 1)
    work = cost.sequence(t + at + 1, t + at + 1, generate=rest).add(overhead=rest * GENERATE_STEP_CALLS)
    for _ in range(2):
        work.add(**vars(_forward(t + main, logits=main)))
    return work


# A training step's readout per (state, token): the final norm, the unembedding, log-softmax and KL forward, and
# their backward to the translated state (two more products with the unembedding), against one position's logits.
TRAIN_CELL = 4.0
OPENER_TOKENS = 5  # an opener's tokens (TRAIN_OPENERS: 2 to 7 words)


def train_lens_work(handle: ModelHandle, params: ResidualParams, kwargs: dict) -> Work:
    """`train_lens`: the model's samples and their states, every check and training step's readout over all states
    (forward and backward), and both lenses read over the check and held-out tokens."""
    from analysis.residual.lens_training import LensRecipe

    recipe = kwargs.get("recipe") or LensRecipe()
    layers, info = handle.info.layers, handle.info
    n_seq = recipe.openers + recipe.check_openers + recipe.held_openers
    length = OPENER_TOKENS + recipe.new_tokens
    work = Work()
    work.add(**vars(cost.sequence(OPENER_TOKENS, OPENER_TOKENS, generate=recipe.new_tokens)), times=n_seq)
    work.add(**vars(_forward(length)), times=n_seq)
    steps = recipe.total_steps()
    work.add(logits=steps * recipe.batch * (layers * TRAIN_CELL + 1))
    check = recipe.check_openers * length * (layers + 1) * len(recipe.rates)
    held = recipe.held_openers * length * (layers + 1) * 2
    work.add(logits=(check + held) * LENS_CELL)
    states = (layers + 1) * n_seq * length * info.hidden_size * 4
    work.peak = layers * recipe.batch * info.vocab_size * 4 * 3 + 2 * layers * info.hidden_size ** 2 * 4 * 3
    work.held = states
    return work

"""The attack repeated: accuracy at every layer, accuracy against noise per permutation defence, and the
proposal-ordered attack against exhaustive search on the same prompt."""
from __future__ import annotations

import itertools

from analysis.inversion.attack import reconstruct
from analysis.inversion.defences import NO_DEFENCE, defence_label, defence_names
from analysis.inversion.params import AttackParams
from analysis.inversion.probe import tokenize
from analysis.inversion.records import LayerPoint, LayerSweep, NoisePoint, NoiseSweep, SpeedComparison
from analysis.model_access.models import ModelHandle
from analysis.framework.progress import Progress

NOISE_DEFENCE = "gaussian_noise"  # the defence whose σ the noise sweep varies


def with_changes(params: AttackParams, **changes) -> AttackParams:
    return AttackParams.from_dict({**params.to_dict(), **changes})


def with_noise(params: AttackParams, permutation: str, sigma: float) -> AttackParams:
    """The params with one permutation defence (or none) and, for σ > 0, Gaussian noise of σ on top."""
    names = ([] if permutation == NO_DEFENCE else [permutation]) + ([NOISE_DEFENCE] if sigma > 0 else [])
    methods = {**params.methods, NOISE_DEFENCE: {**params.methods.get(NOISE_DEFENCE, {}), "sigma": sigma}}
    return with_changes(params, defences=names, methods=methods)


def sweep_layers(handle: ModelHandle, params: AttackParams, layers: list[int] | None = None,
                 progress: Progress | None = None) -> LayerSweep:
    """Accuracy of the attack (with the params' defences) at each layer."""
    layers = list(range(handle.info.layers + 1)) if layers is None else layers
    ids = tokenize(handle, params.prompt, params.max_tokens)
    points = []
    for n, layer in enumerate(layers):
        r = reconstruct(handle, with_changes(params, layer=layer), ids=ids)
        points.append(LayerPoint(layer, r.accuracy, r.evaluations, r.seconds))
        if progress:
            progress((n + 1) / len(layers), f"layer {layer}")
    return LayerSweep(params, points)


def sweep_noise(handle: ModelHandle, params: AttackParams, noises: list[float],
                permutations: list[str] | None = None, progress: Progress | None = None) -> NoiseSweep:
    """Accuracy vs Gaussian noise (σ relative to the states' std), for each permutation defence
    ("none" and every registered permutation unless `permutations` names some)."""
    permutations = defence_names("permutation") if permutations is None else permutations
    ids = tokenize(handle, params.prompt, params.max_tokens)
    points, total = [], len(noises) * len(permutations)
    for n, (perm, sigma) in enumerate(itertools.product(permutations, noises)):
        r = reconstruct(handle, with_noise(params, perm, sigma), ids=ids)
        points.append(NoisePoint(perm, sigma, r.accuracy, r.evaluations))
        if progress:
            progress((n + 1) / total, f"{defence_label(perm)}, sigma {sigma:g}")
    return NoiseSweep(params, points)


def compare_exhaustive(handle: ModelHandle, params: AttackParams, measured_positions: int = 0,
                       progress: Progress | None = None) -> SpeedComparison:
    """Run the attack, then exhaustive search on the first `measured_positions` positions
    (0 = all) and extrapolate its time to every position."""
    ids = tokenize(handle, params.prompt, params.max_tokens)
    attack = reconstruct(handle, with_changes(params, exhaustive=False),
                         progress=(lambda f, m: progress(0.5 * f, "attack: " + m)) if progress else None, ids=ids)
    n = len(attack.tokens)
    measured = n if measured_positions <= 0 else min(measured_positions, n)
    exhaustive = reconstruct(handle, with_changes(params, exhaustive=True, positions=measured),
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

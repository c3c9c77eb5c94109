"""SAE-V on one input: the active features at every text token and image patch."""
from __future__ import annotations

from analysis.framework.errors import SettingsError
from analysis.model_access.models import ModelHandle
from analysis.sae_v.activations import collect_activations, scaled
from analysis.sae_v.params import ExplainParams
from analysis.sae_v.prompts import too_long, too_long_reason
from analysis.sae_v.rules import per_pair_max
from analysis.sae_v.sources import locate, open_sae, store_for
from analysis.sae_v.training import encode
from analysis.sae_v.types import (
    IMAGE, TEXT, InputExplanation, Pair, PairSet, PositionFeatures, Progress, SaeMeta, Scored, _noop,
)
from analysis.sae_v.userdata import image_from_ref


def explain(handle: ModelHandle, params: ExplainParams, progress: Progress | None = None) -> InputExplanation:
    """The runner's entry: the features of `params.text` (and its image on a VLM: a pair of the data, or
    an upload)."""
    progress = progress or _noop
    if not params.text.strip():
        raise SettingsError("Enter some text to explain.")
    source = locate(handle, params.sae)  # resolved once
    sae, meta = open_sae(handle, params, source)
    pairs = store_for(handle, params, source=source).pairs if params.image.startswith("pair:") else None
    image = image_from_ref(params.image, pairs)
    progress(0.1, "running the model")
    return explain_input(handle, sae, meta, params.text, image, per_position=params.per_position)


def explain_input(handle: ModelHandle, sae, meta: SaeMeta, text: str, image=None, per_position: int = 8,
                  threshold: float = 0.0) -> InputExplanation:
    """Active features at every text token and image patch of one input."""
    if handle.kind == "vlm" and image is None:
        raise SettingsError("A vision-language model needs an image with the text.")
    if handle.kind != "vlm" and image is not None:
        raise SettingsError(f"{handle.spec.label} is a text-only model; it cannot read an image.")
    long = too_long(handle, [text])
    if long:
        raise SettingsError(f"The text is too long: {too_long_reason(handle, long[0]).partition(': ')[2]}.")
    pairs = PairSet(dataset="", seed=0, image_size=handle.info.image_size, pairs=[Pair(text=text)])
    layer = meta.layer
    acts = collect_activations(handle, pairs, layer, images=[image] if image is not None else None)
    codes = encode(sae, scaled(acts, meta.scales))
    tokens = acts.tokens[0]
    positions = []
    for r in range(len(acts)):
        row = codes[r]
        vals, idx = row.topk(min(per_position, row.numel()))
        feats = [Scored(str(int(i)), round(float(v), 4)) for v, i in zip(vals, idx) if v > threshold]
        m, ix = int(acts.modality[r]), int(acts.index[r])
        positions.append(PositionFeatures(modality=m, index=ix, token=tokens[ix] if m == TEXT else f"patch {ix}",
                                          features=feats))
    text_max = per_pair_max(codes, acts.modality, acts.pair, 1, TEXT)[0]
    image_max = per_pair_max(codes, acts.modality, acts.pair, 1, IMAGE)[0]
    overall = codes.max(0).values
    order = overall.argsort(descending=True)
    totals = [Scored(str(int(f)), round(float(overall[f]), 4)) for f in order if overall[f] > threshold]
    return InputExplanation(
        model=handle.spec.label, layer=layer, tokens=tokens, grid=acts.grid, positions=positions, totals=totals,
        text_max={int(f): round(float(text_max[f]), 4) for f in (text_max > threshold).nonzero().squeeze(1)},
        image_max={int(f): round(float(image_max[f]), 4) for f in (image_max > threshold).nonzero().squeeze(1)},
    )

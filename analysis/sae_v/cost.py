"""How much work each SAE-V run is, counted from its settings (analysis/framework/cost.py prices it).

Collecting activations is a forward per batch stopped after the SAE's layer (`Work.stopped`), with each
image's patches through the vision tower; the SAE's own matmuls (encode, training steps) are counted as
tokens of the model by FLOPs (one model token costs 2 x the body's parameters; one SAE row costs
2 x d_in x d_sae to encode, three times that to train); building a feature store costs a pass per
feature over the tokens it holds (measured: see STORE_CALLS_PER_FEATURE).
"""
from __future__ import annotations

import math

from analysis.framework import cost
from analysis.framework.cost import Work
from analysis.model_access.models import ModelHandle
from analysis.sae_v import userdata
from analysis.sae_v.datasets import default_dataset, make_pairs
from analysis.sae_v.params import BuildParams, ExplainParams, RankParams, SaeChoice, SteerParams, StoreParams
from analysis.sae_v.rules import same_omega
from analysis.sae_v.types import STORE_FILE

# Measured on shapes-vlm on an idle machine (per_call 1.2 ms): a feature card costs Python work of about one
# call plus passes over its column of codes worth 6 embedding rows per token (top tokens, quantiles,
# histogram, densities, concepts: 1,024 cards over 4.8 k tokens take 2.2 s).
STORE_CALLS_PER_FEATURE = 1.0
STORE_ROWS_PER_TOKEN = 6.0
PAIR_CALLS = {"vlm": 2.0, "causal_lm": 0.3}  # the processor's work and bookkeeping per pair
GENERATE_STEP_CALLS = 0.5  # generate()'s own work per new token beyond the forward (logits processing, cache)
STEER_HOOK_OVERHEAD = 1.3  # decode steps with the steering hook (a small matmul per step)
SAMPLE = 24  # pairs tokenized to measure the mean caption length
# Memory of a feature store (benchmarks/memory_bench.py): the collected activations (float32, with their
# scaled copy) are held to the end; the SAE's codes over every token are dense float32 with copies alive
# at once (the codes, the rule's visible codes, the fit's reconstruction pass, the active mask), plus the
# d_sae x d_sae neighbour and co-activation tables.
STORE_CODE_COPIES = 5.5
STORE_ACT_COPIES = 3.0


def _body(handle: ModelHandle) -> float:
    return float(cost.param_split(handle)[0])


def _source(handle: ModelHandle, choice: SaeChoice):
    from analysis.sae_v.sources import locate

    return locate(handle, choice.sae)


def _sae_width(handle: ModelHandle, choice: SaeChoice, source) -> tuple[int, int, int]:
    """(d_in, d_sae, layer) of the chosen SAE, read from its files (no SAE is loaded)."""
    import json

    layer = choice.layer if choice.layer >= 0 else handle.info.layers // 2
    if source.folder is None:
        return handle.info.hidden_size, 16 * handle.info.hidden_size, layer
    cfg = json.loads((source.folder / "cfg.json").read_text())
    meta = source.folder / "sae_v_meta.json"
    if meta.is_file():
        layer = json.loads(meta.read_text())["layer"]
    else:
        from analysis.sae_v.outside import hook_layer

        found = hook_layer((cfg.get("metadata") or {}).get("hook_name"))
        layer = found if found is not None and found >= 0 else layer
    return int(cfg["d_in"]), int(cfg["d_sae"]), layer


def _text_tokens(handle: ModelHandle, texts: list[str]) -> float:
    if not texts:
        return 16.0
    tok = handle.tokenizer
    return sum(len(tok(t)["input_ids"]) for t in texts[:SAMPLE]) / min(len(texts), SAMPLE)


def collection(handle: ModelHandle, pairs: int, text_tokens: float, layer: int, batch: int) -> Work:
    """Forwards over `pairs` pairs, stopped after `layer`, in batches of `batch`."""
    image = (handle.info.image_tokens or 0) if handle.kind == "vlm" else 0
    per = text_tokens + image + 8  # the prompt's own tokens
    depth = min(1.0, (layer + 1) / max(handle.info.layers, 1))
    calls = math.ceil(pairs / max(batch, 1))
    work = Work().stopped(calls, depth, tokens=pairs * per, attended=pairs * per * (per + 1) / 2)
    work.add(peak=cost.forward_bytes(handle, min(batch, pairs), per))
    return work.add(patches=pairs * image, overhead=pairs * PAIR_CALLS.get(handle.kind, 1.0))


def cards(rows: float, d_sae: int, d: int) -> Work:
    """Building `d_sae` feature cards over `rows` token vectors of width `d` (see STORE_CALLS_PER_FEATURE)."""
    return Work(overhead=d_sae * STORE_CALLS_PER_FEATURE, rows=rows * d_sae * STORE_ROWS_PER_TOKEN)


def encoding(handle: ModelHandle, rows: float, d_in: int, d_sae: int, passes: float = 1.0) -> Work:
    """The SAE's matmuls over `rows` token vectors, in model tokens of equal FLOPs."""
    return Work(tokens=rows * passes * d_in * d_sae / _body(handle))


def _pairs_of(handle: ModelHandle, choice: SaeChoice) -> tuple[int, float]:
    """(pairs, mean text tokens) of the chosen data, without running the model."""
    data = choice.data
    if data and not data.startswith("dataset:"):
        loaded = userdata.load(data, handle.kind)
        return len(loaded.pairs.pairs), _text_tokens(handle, [p.text for p in loaded.pairs.pairs])
    name = (data.partition(":")[2] if data else "") or default_dataset(handle)
    sample = make_pairs(handle, name, SAMPLE, 2, corrupted=0.5)
    return choice.store_pairs, _text_tokens(handle, [p.text for p in sample.pairs])


def _store_cached(handle: ModelHandle, choice: SaeChoice, source) -> bool:
    from analysis.sae_v.sources import store_folder

    if not source.outside and not choice.data:
        return True
    return (store_folder(handle, choice) / STORE_FILE).is_file()


def store_work(handle: ModelHandle, choice: SaeChoice, kwargs: dict, source=None) -> Work:
    """`sources.store_for`: nothing when the store is on disk; else the sample's activations and its cards."""
    source = source or _source(handle, choice)
    if _store_cached(handle, choice, source):
        return Work()
    d_in, d_sae, layer = _sae_width(handle, choice, source)
    pairs, text = _pairs_of(handle, choice)
    pairs = min(pairs, choice.store_pairs)
    rows = pairs * (text + ((handle.info.image_tokens or 0) if handle.kind == "vlm" else 0))
    work = collection(handle, pairs, text, layer, choice.batch_pairs)
    work.add(**vars(encoding(handle, rows, d_in, d_sae, passes=2)))  # codes, and the fit's reconstruction
    work.add(held=rows * d_in * 4 * STORE_ACT_COPIES,
             peak=rows * d_sae * 4 * STORE_CODE_COPIES + rows * d_sae + 3 * d_sae * d_sae * 4)
    return work.add(**vars(cards(rows, d_sae, d_in)))


def rank_work(handle: ModelHandle, params: RankParams, kwargs: dict) -> Work:
    """`filtering.rank`: the store (if not on disk), omega again for a rule that computes it otherwise, and
    every pair of the data through the model and the SAE."""
    params.validate()
    source = _source(handle, params)  # resolved once for the whole estimate
    d_in, d_sae, layer = _sae_width(handle, params, source)
    pairs, text = _pairs_of(handle, params)
    image = (handle.info.image_tokens or 0) if handle.kind == "vlm" else 0
    work = store_work(handle, params, kwargs, source)
    if not same_omega(params.score_rule(), StoreParams().rule()):  # omega computed again for this rule
        sample = min(pairs, params.store_pairs)
        work.add(**vars(collection(handle, sample, text, layer, 32)))
        work.add(rows=sample * (text + image) * 5)  # omega: cosines of the top tokens of every feature
    work.add(**vars(collection(handle, pairs, text, layer, params.batch_pairs)))
    return work.add(**vars(encoding(handle, pairs * (text + image), d_in, d_sae)))


def explain_work(handle: ModelHandle, params: ExplainParams, kwargs: dict) -> Work:
    d_in, d_sae, layer = _sae_width(handle, params, _source(handle, params))
    text = _text_tokens(handle, [params.text])
    image = (handle.info.image_tokens or 0) if handle.kind == "vlm" else 0
    work = collection(handle, 1, text, layer, 1)
    return work.add(**vars(encoding(handle, text + image, d_in, d_sae)))


def steer_work(handle: ModelHandle, params: SteerParams, kwargs: dict) -> Work:
    """`steering.steer`: two greedy generations of the prompt (one with the hook)."""
    image = (handle.info.image_tokens or 0) if handle.kind == "vlm" else 0
    prompt = int(_text_tokens(handle, [params.prompt or "describe the image"]) + image + 8)
    work = Work().add(**vars(cost.sequence(prompt, prompt, generate=params.max_new_tokens)))
    work.add(**vars(cost.sequence(prompt, prompt, generate=params.max_new_tokens, overhead=STEER_HOOK_OVERHEAD)))
    return work.add(patches=2 * image, overhead=2 * params.max_new_tokens * GENERATE_STEP_CALLS
                    + 2 * PAIR_CALLS.get(handle.kind, 1.0))


def train_work(handle: ModelHandle, params: BuildParams, kwargs: dict) -> Work:
    """`build.train`: the training and evaluation pairs through the model, the SAE's training steps, the store."""
    params.validate()
    name = params.dataset or default_dataset(handle)
    text = _text_tokens(handle, [p.text for p in make_pairs(handle, name, SAMPLE, 1).pairs])
    image = (handle.info.image_tokens or 0) if handle.kind == "vlm" else 0
    d_in = handle.info.hidden_size
    d_sae = params.train.d_sae
    work = collection(handle, params.train_pairs + params.eval_pairs, text, params.layer, 32)
    steps = params.train.steps
    work.add(**vars(encoding(handle, steps * params.train.batch_size, d_in, d_sae, passes=6)))  # fwd + bwd, enc + dec
    work.add(overhead=steps * 2)  # the optimiser's Python per step
    rows = params.eval_pairs * (text + image)
    return work.add(**vars(cards(rows, d_sae, d_in)))

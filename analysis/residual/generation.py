"""Generate and inspect: the commitment strip.

The clean prompt is continued by the model (greedy, or sampled with a seed), and for every generated token
the strip says at which residual-stream states a lens already has that token on top. Two definitions (the
NDIF Workbench shows both as a choice): the *first* state where it is the lens's top-1, and the state from
which it *stays* top-1 through the output.

Cost. The states are the generation's own: `generate(output_hidden_states=True)` keeps, for the token each
step produces, the residual stream entering every layer (states 0..L-1; HF's last entry is already through
the final norm, so state L is read from the step's own logits, which it is by definition). Reading every
state through the unembedding would cost L vocabulary-sized products per token, several forwards' worth on
a small model with a large vocabulary (SmolLM2: 30 x 49,152 x 576). Most states are not top-1 for the
token, and proving that needs one token that beats it, not the whole vocabulary: each state is first scored
on a small set of candidate tokens (the generated tokens, the model's top tokens at each step, and the top
tokens of every state read in full so far); a candidate that beats the generated token by more than a
float-rounding margin rules the state out exactly. Only the states left are read over the whole vocabulary,
in chunks, each chunk's top tokens joining the candidates. The result is exactly the full readout's
(`argmax == token` of the lens's logits), cheaper by the share of states ruled out (benchmarks/
residual_generate.py).
"""
from __future__ import annotations

import time

import torch

from analysis import backends
from analysis.framework.progress import Progress
from analysis.model_access import anatomy
from analysis.model_access.models import ModelHandle, require_kind
from analysis.residual.errors import ResidualError
from analysis.residual.lenses import LENSES, Lens, capped, unembedding_input
from analysis.residual.params import ResidualParams, validate_params
from analysis.residual.prompts import chosen_pair, encoded, show
from analysis.residual.records import Generation, Strip

MARGIN = 1e-4  # relative: a candidate rules a state out only when it beats the token by more than this
CHUNK = 32  # states read over the whole vocabulary per product
SMALL = 1 << 21  # states x vocabulary up to which reading everything at once beats screening (Python per step)
CANDIDATES_PER_ROW = 4  # top tokens of each fully read state added to the candidates
MODEL_TOP = 4  # the model's own top tokens at each step, candidates from the start


def generate(handle: ModelHandle, params: ResidualParams, progress: Progress | None = None) -> Generation:
    """The clean prompt of the chosen pair continued by the model, with the commitment strip of the chosen
    lens (and of the logit lens beside a tuned one)."""
    require_kind(handle, "causal_lm", "vlm", panel="residual stream")
    validate_params(params)
    why = backends.local_only(handle, "Generating text")
    if why:
        raise ResidualError(why)
    lenses = [LENSES.create(name) for name in dict.fromkeys(["logit", params.lens])]
    for lens in lenses:
        lens.prepare(handle)  # a missing tuned lens refuses before any generation
    pair = chosen_pair(handle, params)
    ids = encoded(handle, pair.clean, "prompt")
    room = (handle.info.max_positions or 1 << 30) - ids.shape[1]
    if room < 1:
        raise ResidualError(f"The prompt fills all {handle.info.max_positions} positions of {handle.spec.label}: "
                            "there is no room to generate.")
    if progress:
        progress(0.0, "generating")
    t0 = time.perf_counter()
    tokens, states, logits, ended = _generate(handle, params, ids, min(params.new_tokens, room))
    t1 = time.perf_counter()
    if progress:
        progress(0.6, "reading every layer of every generated token")
    strips = [commitment_strip(handle, lens, states, logits, tokens) for lens in lenses]
    t2 = time.perf_counter()
    tok = handle.tokenizer
    logp = torch.log_softmax(logits.float(), -1)
    if progress:
        progress(1.0, "done")
    return Generation(
        model=handle.spec.label, params=params, prompt=pair.clean, prompt_tokens=show(tok, ids[0].tolist()),
        text=tok.decode(tokens.tolist()), tokens=show(tok, tokens.tolist()), token_ids=tokens.tolist(),
        prob=logp.gather(1, tokens[:, None])[:, 0].exp().tolist(),
        top=show(tok, logits.argmax(-1).tolist()), ended=ended, layers=states.shape[1], strips=strips,
        seconds={"generate": t1 - t0, "strip": t2 - t1}, **alternatives(tok, logits, params.top_k))


def alternatives(tokenizer, logits: torch.Tensor, k: int) -> dict[str, list[list]]:
    """Per generated token, the model's k most likely tokens at the step that produced it (temperature 1):
    the choices a branch may take there."""
    probs = torch.softmax(logits.double(), -1)
    top = probs.topk(min(k, probs.shape[-1]), -1)
    ids = top.indices.tolist()
    return {"alternative_ids": ids, "alternative_tokens": [show(tokenizer, row) for row in ids],
            "alternative_probs": top.values.tolist()}


def _generate(handle: ModelHandle, params: ResidualParams, ids: torch.Tensor, n: int):
    """(generated ids (K,), states (K, L, D) entering every layer at the position that produced each token,
    the model's logits there (K, V), whether the model ended the text)."""
    out, eos_ids = decode(handle, params, ids, n, output_hidden_states=True, output_logits=True)
    new = out.sequences[0, ids.shape[1]:].cpu()
    layers = anatomy.n_layers(handle.language_model)
    # step k's hidden states: a tuple of L + 1 tensors (1, t, D); entry L is after the final norm (unused)
    states = torch.stack([torch.stack([step[s][0, -1] for s in range(layers)]) for step in out.hidden_states])
    logits = torch.stack([step[0] for step in out.logits]).float()
    ended = bool(len(new)) and int(new[-1]) in eos_ids
    return new, states[: len(new)], logits[: len(new)].cpu(), ended


def decode(handle: ModelHandle, params: ResidualParams, ids: torch.Tensor, n: int, **outputs):
    """`generate` on `ids` (1, t) for up to n tokens with the settings' decoding (greedy, or sampled at the
    temperature from the seed, drawn afresh from it); (its output, the end-of-text ids)."""
    from transformers import GenerationConfig

    lm = handle.language_model
    tok = handle.tokenizer
    eos = _eos(handle)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos if isinstance(eos, int) else None)
    sample = params.decoding == "sample"
    config = GenerationConfig(  # only these settings: no processors from the model's own generation config
        max_new_tokens=n, do_sample=sample, temperature=params.temperature if sample else None,
        top_k=0 if sample else None, top_p=1.0 if sample else None, eos_token_id=eos, pad_token_id=pad,
        return_dict_in_generate=True, **outputs)
    device = handle.device
    cuda = [device.index or 0] if device.type == "cuda" else []
    with handle.session(), anatomy.model_step(handle, "generating"), torch.random.fork_rng(devices=cuda):
        torch.manual_seed(params.seed)  # this generation's own draws; the process's generator is restored
        out = lm.generate(input_ids=ids.to(device), attention_mask=torch.ones_like(ids).to(device),
                          generation_config=config)
    return out, end_ids(handle)


def _eos(handle: ModelHandle):
    """The model's end-of-text token id (or ids): its generation config's, else its tokenizer's."""
    eos = getattr(getattr(handle.language_model, "generation_config", None), "eos_token_id", None)
    return handle.tokenizer.eos_token_id if eos is None else eos


def end_ids(handle: ModelHandle) -> set[int]:
    eos = _eos(handle)
    return {eos} if isinstance(eos, int) else set(eos or ())


def commitment_strip(handle: ModelHandle, lens: Lens, states: torch.Tensor, logits: torch.Tensor,
                     tokens: torch.Tensor) -> Strip:
    """At which states (0..L) `lens` has each generated token on top; `states` (K, L, D) enter every layer,
    `logits` (K, V) are the model's own at each step (state L)."""
    lm = handle.language_model
    k_tokens, layers = states.shape[:2]
    unembed = anatomy.unembedding(lm)
    weight = unembed.weight.detach()
    bias = unembed.bias.detach() if getattr(unembed, "bias", None) is not None else None
    with torch.no_grad():
        x = torch.stack([unembedding_input(lm, lens.translate(handle, s, states[:, s].to(weight.device)))
                         for s in range(layers)], 1).reshape(k_tokens * layers, -1).to(weight.dtype)
    row_token = tokens.to(weight.device).repeat_interleave(layers)
    top1 = torch.zeros(k_tokens * layers, dtype=torch.bool)
    prob = torch.full((k_tokens * layers,), float("nan"))
    open_rows = torch.arange(k_tokens * layers)
    candidates = set(tokens.tolist()) | set(logits.topk(min(MODEL_TOP, logits.shape[1]), -1).indices.flatten().tolist())
    tried: set[int] = set()
    full_rows = 0
    with torch.no_grad():
        own = _scores(lm, x, weight, bias, row_token)  # each state's logit of its own token
        while len(open_rows):
            small = len(open_rows) * weight.shape[0] <= SMALL  # a small vocabulary: one product reads them all
            if not small:
                fresh = sorted(candidates - tried)  # a row that survived a candidate survives it again
                tried |= candidates
                open_rows = _rule_out(lm, x, weight, bias, own, open_rows, fresh)
                if not len(open_rows):
                    break
            chunk = open_rows if small else _spread(open_rows, CHUNK)
            rest = open_rows[~torch.isin(open_rows, chunk)]
            full = capped(lm, torch.nn.functional.linear(x[chunk], weight, bias)).float()
            on = (full.argmax(-1) == row_token[chunk]).cpu()
            top1[chunk] = on
            if on.any():  # P(token) where it is on top (the strip shows it at the first such state)
                kept = full[on.to(full.device)]
                hit = kept.gather(1, row_token[chunk][on.to(full.device)][:, None])[:, 0]
                prob[chunk[on]] = (hit - torch.logsumexp(kept, -1)).exp().cpu()
            candidates |= set(full.topk(CANDIDATES_PER_ROW, -1).indices.flatten().tolist())
            full_rows += len(chunk)
            open_rows = rest
    table = top1.reshape(k_tokens, layers)
    final = (logits.argmax(-1) == tokens)[:, None]
    table = torch.cat([table, final], 1).tolist()  # state L: the model's own output
    probs = prob.reshape(k_tokens, layers).tolist()
    own = torch.log_softmax(logits.float(), -1).gather(1, tokens[:, None])[:, 0].exp().tolist()
    first = [next((s for s, on in enumerate(row) if on), None) for row in table]
    first_prob = [None if f is None else (own[k] if f == layers else probs[k][f]) for k, f in enumerate(first)]
    return Strip(lens=lens.name, top1=table, first=first, stays=[_stays(row) for row in table],
                 first_prob=first_prob, full_rows=full_rows, rows=k_tokens * layers)


def _stays(row: list[bool]) -> int | None:
    """The first state from which the token stays top-1 through the last (None: not top-1 at the last)."""
    if not row[-1]:
        return None
    s = len(row) - 1
    while s > 0 and row[s - 1]:
        s -= 1
    return s


def _scores(lm, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            row_token: torch.Tensor) -> torch.Tensor:
    """Each row's (capped) logit of its own token, the way `_rule_out` scores candidates."""
    own = (x * weight[row_token]).sum(-1) + (bias[row_token] if bias is not None else 0.0)
    return capped(lm, own).float()


def _rule_out(lm, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, own: torch.Tensor,
              rows: torch.Tensor, candidates: list[int]) -> torch.Tensor:
    """The rows of `rows` that no candidate rules out: a row is ruled out (its token is not the lens's top-1)
    when a candidate's logit exceeds the token's by more than the rounding margin."""
    if not candidates or not len(rows):
        return rows
    cand = torch.tensor(candidates, device=weight.device)
    scores = capped(lm, torch.nn.functional.linear(x[rows], weight[cand], None if bias is None else bias[cand])).float()
    mine = own[rows.to(own.device)]
    beaten = (scores.max(-1).values - mine) > MARGIN * (1.0 + mine.abs())
    return rows[~beaten.cpu()]


def _spread(rows: torch.Tensor, n: int) -> torch.Tensor:
    """Up to n of `rows`, evenly spread (states of many layers and tokens: their top tokens rule out most)."""
    if len(rows) <= n:
        return rows
    return rows[torch.linspace(0, len(rows) - 1, n).round().long().unique()]

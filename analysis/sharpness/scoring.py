"""Scoring answers: the first token over the vocabulary, or whole answers over the prompt's candidates.

A candidate of several tokens (a two-digit code on a tokenizer that splits digits) is scored by the
sum of its tokens' log-probabilities. Its later tokens are read in the same forward as the prompt:
every distinct proper prefix of the chunk's candidates is appended once after the prompt as a tree
(each appended token attends to the prompt and to its own prefix only, at the position it would have
after the prompt), so scoring n candidates costs a few extra tokens, not n more forwards.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from analysis.model_access.models import ModelHandle
from analysis.sharpness.attention import Recorder, tempered_logits
from analysis.sharpness.rules import Temperature
from analysis.tasks.retrieval import RetrievalPrompt


@dataclass
class Outcome:
    correct: bool  # the answer ranks first (among the candidates, or over the vocabulary)
    near: bool  # max retrieval: answered with the second-largest value instead
    prob: float  # probability the model gives the whole answer


@dataclass
class Packed:
    input_ids: torch.Tensor  # (B, T + K): the prompts, then the K tree tokens
    nodes: list[tuple[int, ...]]  # the candidate prefixes appended, in order
    attention_mask: torch.Tensor | None  # (1, 1, T + K, T + K) additive, None without a tree
    position_ids: torch.Tensor | None


def tree_nodes(chunk: list[RetrievalPrompt]) -> list[tuple[int, ...]]:
    """Every distinct proper prefix of every candidate in the chunk, shorter first."""
    nodes = {tuple(c[:j]) for p in chunk for c in p.candidates for j in range(1, len(c))}
    return sorted(nodes, key=lambda node: (len(node), node))


def pack(chunk: list[RetrievalPrompt], dtype: torch.dtype) -> Packed:
    """The chunk's prompts (all of one length T) with the candidate tree appended."""
    ids = torch.tensor([p.input_ids for p in chunk])
    nodes = tree_nodes(chunk)
    if not nodes:
        return Packed(ids, [], None, None)
    t, k = ids.shape[1], len(nodes)
    index = {node: t + i for i, node in enumerate(nodes)}
    allowed = torch.zeros(t + k, t + k, dtype=torch.bool)
    allowed[:t, :t] = torch.ones(t, t, dtype=torch.bool).tril()
    allowed[t:, :t] = True
    positions = list(range(t))
    for node in nodes:
        row = index[node]
        for j in range(1, len(node) + 1):  # its own prefix, itself included
            allowed[row, index[node[:j]]] = True
        positions.append(t - 1 + len(node))
    tree = torch.tensor([list(node[-1:]) for node in nodes]).T.expand(len(chunk), k)
    mask = torch.zeros(1, 1, t + k, t + k, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return Packed(torch.cat([ids, tree], dim=1), nodes, mask, torch.tensor([positions]).expand(len(chunk), -1))


def _candidate_logprobs(logp: torch.Tensor, prompt: RetrievalPrompt, column: dict) -> torch.Tensor:
    """log P(candidate) for each candidate of one prompt; `logp` (K + 1, V): the prompt's last position, then
    each tree node's."""
    out = []
    for cand in prompt.candidates:
        total = logp[0, cand[0]]
        for j in range(1, len(cand)):
            total = total + logp[column[tuple(cand[:j])], cand[j]]
        out.append(total)
    return torch.stack(out)


def score_chunk(handle: ModelHandle, chunk: list[RetrievalPrompt], rule: Temperature,
                recorder: Recorder | None) -> list[Outcome]:
    """One forward of the chunk under `rule` (recording the answer position); each prompt's outcome."""
    dtype = handle.language_model.get_input_embeddings().weight.dtype
    packed = pack(chunk, dtype if dtype.is_floating_point else torch.float32)
    if recorder is not None:
        recorder.row = len(chunk[0].input_ids) - 1
    logits = tempered_logits(handle, packed.input_ids, rule, recorder, keep=len(packed.nodes) + 1,
                             attention_mask=packed.attention_mask, position_ids=packed.position_ids)
    logp = torch.log_softmax(logits, dim=-1)
    column = {node: 1 + i for i, node in enumerate(packed.nodes)}
    outcomes = []
    for b, prompt in enumerate(chunk):
        if prompt.candidates:
            lp = _candidate_logprobs(logp[b], prompt, column)
            best = int(lp.argmax())
            outcomes.append(Outcome(best == prompt.answer_index, False, float(lp[prompt.answer_index].exp())))
        else:
            top = int(logp[b, 0].argmax())
            outcomes.append(Outcome(top == prompt.answer_id, top == prompt.runner_up_id,
                                    float(logp[b, 0, prompt.answer_id].exp())))
    return outcomes

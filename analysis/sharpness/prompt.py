"""One prompt of the user's own: how its last token attends, under softmax and under a chosen rule."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from analysis.model_access.models import ModelHandle
from analysis.framework.results import Result
from analysis.framework.settings import check_settings, setting
from analysis.sharpness.attention import Recorder, tempered_logits
from analysis.sharpness.errors import SharpnessError
from analysis.sharpness.heads import HeadStats, head_stats, mean_stats
from analysis.sharpness.rules import Temperature
from analysis.tasks.retrieval import encode, leading_specials


@dataclass
class PromptParams(Result):
    text: str = setting("", label="Prompt", high=20_000, widget="area", url="prompt", cli=None)
    target: str = setting("", label="Target span (text whose weight is reported)", high=2_000, cli=None,
                          help="Its last occurrence in the prompt; empty: none.")
    rule: Temperature = field(default_factory=Temperature.adaptive)


@dataclass
class PromptResult(Result):
    params: PromptParams
    tokens: list[str]
    target_positions: list[int]
    softmax: HeadStats
    softmax_no_sink: HeadStats
    tempered: HeadStats
    tempered_no_sink: HeadStats
    weights_softmax: list[list[list[float]]]  # [layer][head][key] last-row weights
    weights_tempered: list[list[list[float]]]
    next_token_softmax: str
    next_token_tempered: str


def prompt_ids(tokenizer, text: str) -> list[int]:
    """The prompt's tokens as the model reads them (its BOS, if the tokenizer adds one, first)."""
    return leading_specials(tokenizer) + encode(tokenizer, text)


def find_span(tokenizer, ids: list[int], target: str) -> list[int]:
    """Token positions of the last occurrence of `target` (tokenised as in the prompt)."""
    if not target.strip():
        return []
    for variant in (" " + target.strip(), target.strip()):
        piece = encode(tokenizer, variant)
        for start in range(len(ids) - len(piece), -1, -1):
            if piece and ids[start:start + len(piece)] == piece:
                return list(range(start, start + len(piece)))
    raise SharpnessError(f"The target '{target}' does not occur in the prompt's tokens.")


def analyse_prompt(handle: ModelHandle, params: PromptParams, progress=None) -> PromptResult:
    """Per layer/head sharpness of the last token's attention on a user prompt (two forwards: `progress`
    is told after each, as the runner's other analyses tell it)."""
    if not params.text.strip():
        raise SharpnessError("Enter a prompt: the statistics are about how its last token attends.")
    check_settings(params)
    tok = handle.tokenizer
    ids = prompt_ids(tok, params.text)
    limit = handle.info.max_positions or 4096
    if len(ids) > limit:
        raise SharpnessError(f"The prompt has {len(ids)} tokens, more than the model's {limit} positions.")
    if len(ids) < 2:
        raise SharpnessError("The prompt needs at least two tokens.")
    span = find_span(tok, ids, params.target)
    x = torch.tensor([ids])
    runs = {}
    for name, rule in (("softmax", Temperature()), ("tempered", params.rule)):
        rec = Recorder()
        logits = tempered_logits(handle, x, rule, rec, keep=1)
        runs[name] = (rec, tok.decode([int(logits[0, -1].argmax())]))
        if progress is not None:
            progress(len(runs) / 2, name)
    stats = {}
    for name, (rec, _) in runs.items():
        stats[name] = mean_stats([head_stats(rec, [span], False)])
        stats[name + "_no_sink"] = mean_stats([head_stats(rec, [span], True)])
    weights = {name: [rec.probs[k][0].tolist() for k in sorted(rec.probs)] for name, (rec, _) in runs.items()}
    return PromptResult(
        params=params, tokens=[tok.decode([i]) for i in ids], target_positions=span,
        weights_softmax=weights["softmax"], weights_tempered=weights["tempered"],
        next_token_softmax=runs["softmax"][1], next_token_tempered=runs["tempered"][1], **stats,
    )

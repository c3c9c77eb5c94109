"""Attention sharpness: dispersion as inputs grow, temperature sweeps, adaptive temperature.

Reproduces "Softmax is not enough (for sharp size generalisation)" (Veličković et al., ICML 2025)
on a loaded model. With logits of spread δ every softmax weight lies in [e^(-δ/θ)/n, e^(δ/θ)/n],
so a fixed head disperses as the number of items n grows; the paper's inference-time fix picks a
per-row inverse temperature β from the row's entropy.

How the model is touched: one attention function, registered once with transformers'
`AttentionInterface` under `ATTENTION_NAME`, computes eager attention with a temperature rule and
records the last query row. It is switched on only inside `handle.patch()` (config
`_attn_implementation` swapped and restored), and its settings travel in a `ContextVar`, so two
sessions never see each other's temperature.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import random
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from analysis.models import ModelHandle, ModelSpec, load_model, require_kind
from analysis.results import Result

ATTENTION_NAME = "model_inspector_temperature"
# "Softmax is not enough", adaptive temperature: β = max(poly(H), 1) for H > 0.5, coefficients
# highest degree first.
ADAPTIVE_POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)
ADAPTIVE_MIN_ENTROPY = 0.5
MODES = ("softmax", "fixed", "adaptive")
DEFAULT_NS = (4, 8, 16, 32, 64, 128)
DEFAULT_THETAS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0)

ProgressFn = Callable[[float, str], None]


class SharpnessError(Exception):
    """The analysis cannot run on this input or model; the message is meant for the user."""


# ---------------------------------------------------------------------------------------------
# The temperature rule (pure tensor maths)


def entropy_nats(p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """-Σ p ln p along `dim`, with 0 ln 0 = 0 (masked keys carry exactly zero weight)."""
    return -torch.special.xlogy(p, p).sum(dim)


def adaptive_beta(entropy: torch.Tensor) -> torch.Tensor:
    """Inverse temperature of the adaptive rule for rows with the given entropy (nats)."""
    poly = torch.zeros_like(entropy)
    for c in ADAPTIVE_POLY:  # Horner
        poly = poly * entropy + c
    return torch.where(entropy > ADAPTIVE_MIN_ENTROPY, poly.clamp(min=1.0), torch.ones_like(entropy))


def beta_curve(h_max: float = 8.0, points: int = 321) -> tuple[list[float], list[float]]:
    """(H, β(H)) samples of the adaptive rule, for the β(H) view."""
    h = torch.linspace(0.0, h_max, points, dtype=torch.float64)
    return h.tolist(), adaptive_beta(h).tolist()


def sharpening_interval() -> tuple[float, float]:
    """Entropies (nats) between which the adaptive rule actually sharpens (poly(H) > 1)."""
    h, beta = beta_curve(10.0, 100_001)
    inside = [x for x, b in zip(h, beta) if b > 1.0]
    return (inside[0], inside[-1]) if inside else (float("nan"), float("nan"))


@dataclass(frozen=True)
class Temperature(Result):
    """Which temperature rule the attention function applies."""

    mode: str = "softmax"  # "softmax" | "fixed" | "adaptive"
    theta: float = 1.0  # used when mode == "fixed": softmax(s / θ)
    layers: tuple[int, ...] | None = None  # layers the rule applies in (None: all); others use softmax

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SharpnessError(f"Unknown temperature mode '{self.mode}' (use {', '.join(MODES)}).")
        if not (self.theta > 0 and math.isfinite(self.theta)):
            raise SharpnessError(f"The temperature θ must be a positive number (got {self.theta}).")
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(sorted(set(int(x) for x in self.layers))))

    def in_layer(self, layer: int | None) -> "Temperature":
        """The rule for one layer: itself, or plain softmax where it is not applied."""
        return self if self.layers is None or layer in self.layers else SOFTMAX

    @property
    def label(self) -> str:
        return {"softmax": "softmax", "adaptive": "adaptive θ"}.get(self.mode, f"θ = {self.theta:g}")


SOFTMAX = Temperature()


def tempered_softmax(scores: torch.Tensor, rule: Temperature, inplace: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Apply `rule` to attention logits `s` (already scaled and masked) along the last axis.

    Returns (probabilities used, entropy of plain softmax(s), β per row); for plain softmax the last
    two are None (they are not needed to compute the output; `row_entropy` gives them when wanted).
    `inplace` lets it overwrite float32 `scores` (saves one allocation per attention call).
    """
    s = scores.to(torch.promote_types(scores.dtype, torch.float32))  # never softmax in half precision
    if rule.mode == "softmax":
        return torch.softmax(s, dim=-1), None, None
    # β·s of a masked key overflows to -inf, which softmax handles (and fast); a fully masked row
    # (a padding query) would become all -inf, so it keeps β = 1 and stays uniform as in eager.
    top = s.amax(-1)
    live = top > torch.finfo(s.dtype).min / 2
    if rule.mode == "fixed":
        scale = torch.where(live, 1.0 / rule.theta, 1.0).unsqueeze(-1)
        return torch.softmax(s.mul_(scale) if inplace else s * scale, dim=-1), None, None
    p = torch.softmax(s, dim=-1)
    h = softmax_entropy(s, p, top, live)
    beta = torch.where(live, adaptive_beta(h), 1.0)
    scale = beta.unsqueeze(-1)
    return torch.softmax(s.mul_(scale) if inplace else s * scale, dim=-1), h, beta


def softmax_entropy(s: torch.Tensor, p: torch.Tensor, top: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """Entropy of p = softmax(s) as logsumexp(s) - Σ p s, with logsumexp(s) = max s - ln max p.

    Reductions only, no second exp pass (exp of very negative masked logits is slow on CPU).
    `top` = max s per row; rows not `live` (fully masked) are uniform: H = ln(keys).
    """
    h = top - p.amax(-1).log() - torch.linalg.vecdot(p, s)
    if torch.isnan(h).any():  # a -inf logit gives 0 * -inf; redo with finite logits
        h = top - p.amax(-1).log() - torch.linalg.vecdot(p, s.clamp_min(torch.finfo(s.dtype).min))
    return torch.where(live, h, math.log(s.shape[-1])).clamp_min(0.0)


def row_entropy(scores: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(scores) along the last axis, without forming p ln p with p = 0."""
    log_p = torch.log_softmax(scores, dim=-1)
    return -(log_p.exp().mul_(log_p)).sum(-1)


def rule_beta(rule: Temperature, entropy: torch.Tensor) -> torch.Tensor:
    """β the rule applies to rows with the given softmax entropy."""
    if rule.mode == "softmax":
        return torch.ones_like(entropy)
    if rule.mode == "fixed":
        return torch.full_like(entropy, 1.0 / rule.theta)
    return adaptive_beta(entropy)


# ---------------------------------------------------------------------------------------------
# The attention function and the patch that switches it on


@dataclass
class Recorder:
    """Last query row of every attention layer in the latest forward: logits, probs, β."""

    scores: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (B, H, T) logits s
    probs: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (B, H, T) used
    raw_entropy: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (B, H)
    beta: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (B, H)
    calls: int = 0

    def clear(self) -> None:
        self.scores.clear(), self.probs.clear(), self.raw_entropy.clear(), self.beta.clear()
        self.calls = 0


@dataclass
class _Active:
    rule: Temperature
    recorder: Recorder | None


_ACTIVE: contextvars.ContextVar[_Active | None] = contextvars.ContextVar("sharpness_active", default=None)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, H_kv, T, d) -> (B, H_kv * groups, T, d), each KV head serving `groups` query heads."""
    if groups == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


def temperature_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention with a temperature rule; signature of transformers' attention functions.

    Dropout is never applied (analysis runs in eval mode). Returns (output, probabilities used).
    """
    active = _ACTIVE.get()
    rule = active.rule.in_layer(getattr(module, "layer_idx", None)) if active is not None else SOFTMAX
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    groups = query.shape[1] // key.shape[1]
    key = _repeat_kv(key, groups)
    value = _repeat_kv(value, groups)
    scores = torch.matmul(query, key.transpose(2, 3)).mul_(scaling)
    softcap = kwargs.get("softcap")
    if softcap:  # Gemma 2: the logits as used are soft-capped, cap * tanh(s / cap), before the mask
        scores = torch.tanh(scores / softcap).mul_(softcap)
    if attention_mask is not None:
        scores.add_(attention_mask[:, :, :, : key.shape[-2]])
    recorder = active.recorder if active is not None else None
    last = scores[:, :, -1, :].float().clone() if recorder is not None else None
    probs, _, _ = tempered_softmax(scores, rule, inplace=True)  # scores is ours: overwrite it
    probs = probs.to(value.dtype)
    output = torch.matmul(probs, value).transpose(1, 2).contiguous()
    if recorder is not None:
        layer = getattr(module, "layer_idx", None)
        layer = recorder.calls if layer is None else int(layer)
        recorder.calls += 1
        raw_entropy = row_entropy(last)
        recorder.scores[layer] = last
        recorder.probs[layer] = probs[:, :, -1, :].float().detach()
        recorder.raw_entropy[layer] = raw_entropy
        recorder.beta[layer] = rule_beta(rule, raw_entropy)
    return output, probs


def register_attention() -> None:
    """Register the attention function (and the eager mask it needs) under `ATTENTION_NAME`.

    Registering only adds a name; nothing uses it until a patch switches a model's config to it.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTENTION_NAME, temperature_attention)
    # Without a mask entry transformers treats an unknown implementation as mask-free.
    AttentionMaskInterface.register(ATTENTION_NAME, eager_mask)


@contextlib.contextmanager
def temperature_patch(handle: ModelHandle, rule: Temperature, recorder: Recorder | None = None,
                      model: torch.nn.Module | None = None) -> Iterator[torch.nn.Module]:
    """Inside: `model` (default: the handle's language model) attends with `rule`; restored after."""
    register_attention()
    model = handle.language_model if model is None else model
    with handle.patch() as p, torch.no_grad():
        p.attn_implementation(model, ATTENTION_NAME)
        token = _ACTIVE.set(_Active(rule, recorder))
        p.call_on_exit(lambda: _ACTIVE.reset(token))
        yield model


def tempered_logits(handle: ModelHandle, input_ids: torch.Tensor, rule: Temperature,
                    recorder: Recorder | None = None) -> torch.Tensor:
    """Next-token logits (B, T, V) of the language model with `rule` applied in every head."""
    with temperature_patch(handle, rule, recorder) as lm:
        if recorder is not None:
            recorder.clear()
        logits = lm(input_ids=input_ids.to(handle.device), use_cache=False).logits
    if recorder is not None:
        _check_recorded(handle, recorder)
    return logits.float()


def _check_recorded(handle: ModelHandle, recorder: Recorder) -> None:
    if not recorder.probs:
        raise SharpnessError(
            f"{handle.spec.label} does not compute attention through transformers' attention interface "
            "(no attention layer called it), so its attention weights cannot be read or re-tempered. "
            "Pick a Llama-, GPT-2- or LLaVA-family model."
        )


# ---------------------------------------------------------------------------------------------
# Model-free lemma demo


@dataclass
class LemmaParams(Result):
    ns: list[int] = field(default_factory=lambda: [2 ** k for k in range(1, 15)])
    thetas: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0])
    spread: float = 4.0  # δ: the maximum's logit minus every other logit


@dataclass
class LemmaCurve(Result):
    label: str
    p_max: list[float]
    entropy: list[float]


@dataclass
class LemmaResult(Result):
    params: LemmaParams
    curves: list[LemmaCurve]
    uniform: list[float]  # 1/n
    log_n: list[float]  # ln n, the entropy of the uniform distribution
    upper_bound: dict[float, list[float]]  # θ -> e^(δ/θ)/n, the lemma's ceiling on any weight


def lemma_demo(params: LemmaParams | None = None) -> LemmaResult:
    """n logits with one maximum δ above the rest: p_max and entropy vs n, per θ and adaptive."""
    params = params or LemmaParams()
    if not params.ns or min(params.ns) < 2:
        raise SharpnessError("The lemma demo needs item counts n >= 2.")
    rules = [Temperature("fixed", t) for t in params.thetas] + [Temperature("adaptive")]
    curves = []
    for rule in rules:
        p_max, ent = [], []
        for n in params.ns:
            s = torch.zeros(1, n, dtype=torch.float64)
            s[0, 0] = params.spread
            p = tempered_softmax(s, rule)[0]
            p_max.append(float(p[0, 0]))
            ent.append(float(entropy_nats(p)[0]))
        curves.append(LemmaCurve(rule.label, p_max, ent))
    return LemmaResult(
        params=params, curves=curves, uniform=[1.0 / n for n in params.ns],
        log_n=[math.log(n) for n in params.ns],
        upper_bound={t: [min(1.0, math.exp(params.spread / t) / n) for n in params.ns] for t in params.thetas},
    )


# ---------------------------------------------------------------------------------------------
# Max-retrieval prompts for any tokenizer


@dataclass
class RetrievalPrompt(Result):
    """A list of n items and a request for the largest; `target` are the max item's positions."""

    n: int
    text: str
    input_ids: list[int]
    answer_id: int
    answer: str
    target: list[int]
    values: list[int]
    format: str  # "shapes-world" | "numbers" | "vocabulary"
    runner_up_id: int = -1  # token of the second-largest distinct value (-1: all values equal)


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _leading_specials(tokenizer) -> list[int]:
    """Tokens the tokenizer puts before any text (a BOS), so prompts look like its usual input."""
    plain = _encode(tokenizer, "a")
    full = list(tokenizer("a")["input_ids"])
    return full[: len(full) - len(plain)] if full[-len(plain):] == plain else []


@dataclass
class ItemFormat:
    """How numbers become tokens for a tokenizer: value k is written `items[k]`."""

    name: str
    items: list[str]  # value -> text piece (with its leading space where the tokenizer needs one)
    prefix: str
    suffix: str
    bos: list[int]


def item_format(tokenizer) -> ItemFormat:
    """Numbers 0-99 as single tokens if the tokenizer has them, else its plain vocabulary words."""
    unk = tokenizer.unk_token_id
    bos = _leading_specials(tokenizer)
    numbers = [f" {k}" for k in range(100)]
    ok = all(len(ids := _encode(tokenizer, x)) == 1 and ids[0] != unk for x in numbers)
    prefix, suffix = "Numbers:", " The largest number is"
    if ok:
        words_ok = unk is None or unk not in _encode(tokenizer, prefix + suffix)
        return ItemFormat("numbers", numbers, prefix if words_ok else "", suffix if words_ok else "", bos)
    special = set(tokenizer.all_special_ids)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    # A vocabulary entry is an item when " " + its text encodes back to it alone; the text comes from
    # decode(), so byte-level BPE entries ("Ġcat" -> " cat") qualify as well as word-level ones.
    pieces = []
    for w, i in vocab:
        if i in special or w.startswith("<"):
            continue
        text = tokenizer.decode([i]).strip()
        if text.isalnum() and _encode(tokenizer, " " + text) == [i]:
            pieces.append(" " + text)
    if len(pieces) < 8:
        raise SharpnessError("Could not find enough single-token items in this tokenizer to build "
                             "a max-retrieval prompt.")
    return ItemFormat("vocabulary", pieces[:100], "", "", bos)


def _sample_values(n: int, vmax: int, rng: random.Random) -> list[int]:
    """n values in [0, vmax) with a unique maximum at a random position."""
    top = rng.randrange(max(1, min(n, vmax // 2)), vmax) if vmax > 1 else 0
    values = [rng.randrange(0, top) for _ in range(n - 1)] if top > 0 else [0] * (n - 1)
    values.insert(rng.randrange(n), top)
    return values


def prompt_builder(tokenizer) -> Callable[[int, int], RetrievalPrompt]:
    """`build(n, seed)` for this tokenizer, from the task provider: Shapes World's training format for a
    tokenizer that speaks it, else numbers or vocabulary words."""
    from analysis.tasks import tasks_for

    return tasks_for(tokenizer).retrieval_builder(tokenizer)


def build_prompt(tokenizer, n: int, seed: int = 0) -> RetrievalPrompt:
    """A max-retrieval prompt with n items; the model should answer with the largest."""
    return prompt_builder(tokenizer)(n, seed)


def _generic_builder(tokenizer, fmt: ItemFormat) -> Callable[[int, int], RetrievalPrompt]:
    def build(n: int, seed: int) -> RetrievalPrompt:
        rng = random.Random(seed * 1_000_003 + n)
        values = _sample_values(n, len(fmt.items), rng)
        ids = list(fmt.bos) + (_encode(tokenizer, fmt.prefix) if fmt.prefix else [])
        target: list[int] = []
        top = max(values)
        for v in values:
            piece = _encode(tokenizer, fmt.items[v])
            if v == top:
                target = list(range(len(ids), len(ids) + len(piece)))
            ids += piece
        if fmt.suffix:
            ids += _encode(tokenizer, fmt.suffix)
        answer = fmt.items[top]
        second = [v for v in values if v != top]
        return RetrievalPrompt(
            n=n, text=tokenizer.decode(ids), input_ids=ids, answer_id=_encode(tokenizer, answer)[0],
            answer=answer.strip(), target=target, values=values, format=fmt.name,
            runner_up_id=_encode(tokenizer, fmt.items[max(second)])[0] if second else -1,
        )

    return build


def _zoo_builder(tokenizer) -> Callable[[int, int], RetrievalPrompt] | None:
    """The Shapes World training format ("<s> max : 12 7 93 41 =" -> "93") for the zoo's tokenizer."""
    try:
        from analysis.zoo import shapes_world as sw
    except Exception:
        return None
    vocab = tokenizer.get_vocab()
    if not hasattr(sw, "max_retrieval_example") or not all(w in vocab for w in (*sw.NUMBERS, "max", sw.BOS)):
        return None

    def build(n: int, seed: int) -> RetrievalPrompt:
        text, answer = sw.max_retrieval_example(random.Random(seed * 1_000_003 + n), n)
        words = text.split()
        ids = _encode(tokenizer, text)
        if len(ids) != len(words):
            raise SharpnessError("The zoo tokenizer does not map the prompt's words one to one.")
        items = words[words.index(":") + 1: -1]
        first = words.index(":") + 1
        second = [int(w) for w in items if w != answer]
        return RetrievalPrompt(
            n=n, text=text, input_ids=ids, answer_id=_encode(tokenizer, answer)[0], answer=answer,
            target=[first + i for i, w in enumerate(items) if w == answer], values=[int(w) for w in items],
            format="shapes-world",
            runner_up_id=_encode(tokenizer, str(max(second)))[0] if second else -1,
        )

    return build


# ---------------------------------------------------------------------------------------------
# Per layer/head statistics of the last query row


@dataclass
class HeadStats(Result):
    """Per [layer][head] statistics of the answer position's attention row."""

    entropy: list[list[float]]  # nats
    entropy_norm: list[list[float]]  # H / ln(keys attended)
    max_weight: list[list[float]]
    target_weight: list[list[float]]  # weight on the max item's tokens
    spread: list[list[float]]  # δ = max - min logit over attended keys
    raw_entropy: list[list[float]]  # entropy of plain softmax(s) in this run (what β is chosen from)
    beta: list[list[float]]  # inverse temperature applied


def _row_stats(scores: torch.Tensor, probs: torch.Tensor, target: list[list[int]], drop_sink: bool) -> dict:
    """Statistics of rows (B, H, T). `target[b]` are positions; with drop_sink key 0 is removed."""
    valid = scores > torch.finfo(torch.float32).min / 2
    if drop_sink:
        scores, probs, valid = scores[..., 1:], probs[..., 1:], valid[..., 1:]
        probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-30)
        target = [[t - 1 for t in ts if t > 0] for ts in target]
    keys = valid.sum(-1).clamp_min(2).float()
    ent = entropy_nats(probs)
    big = torch.where(valid, scores, torch.full_like(scores, -float("inf"))).amax(-1)
    small = torch.where(valid, scores, torch.full_like(scores, float("inf"))).amin(-1)
    mask = torch.zeros_like(probs, dtype=torch.bool)
    for b, ts in enumerate(target):
        mask[b, :, ts] = True
    return dict(
        entropy=ent, entropy_norm=ent / keys.log(), max_weight=probs.amax(-1),
        target_weight=(probs * mask).sum(-1), spread=big - small,
    )


def head_stats(recorder: Recorder, target: list[list[int]], drop_sink: bool) -> list[dict]:
    """Per-sample statistics from a recorded forward: a list over layers of dicts of (B, H) tensors."""
    out = []
    for layer in sorted(recorder.probs):
        st = _row_stats(recorder.scores[layer], recorder.probs[layer], target, drop_sink)
        st["raw_entropy"] = recorder.raw_entropy[layer]
        st["beta"] = recorder.beta[layer]
        out.append(st)
    return out


def _mean_stats(per_batch: list[list[dict]]) -> HeadStats:
    """Average batches' per-layer stats over samples -> HeadStats."""
    keys = [f for f in HeadStats.__dataclass_fields__]
    layers = len(per_batch[0])
    values = {}
    for k in keys:
        rows = []
        for layer in range(layers):
            stacked = torch.cat([batch[layer][k] for batch in per_batch], dim=0)  # (N, H)
            rows.append(stacked.mean(0).tolist())
        values[k] = rows
    return HeadStats(**values)


# ---------------------------------------------------------------------------------------------
# Single prompt: stats under softmax and under a chosen temperature


@dataclass
class PromptParams(Result):
    text: str = ""
    target: str = ""  # text of the span whose weight is reported (last occurrence); "" = none
    rule: Temperature = field(default_factory=lambda: Temperature("adaptive"))


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


def _find_span(tokenizer, ids: list[int], target: str) -> list[int]:
    """Token positions of the last occurrence of `target` (tokenised as in the prompt)."""
    if not target.strip():
        return []
    for variant in (" " + target.strip(), target.strip()):
        piece = _encode(tokenizer, variant)
        for start in range(len(ids) - len(piece), -1, -1):
            if piece and ids[start:start + len(piece)] == piece:
                return list(range(start, start + len(piece)))
    raise SharpnessError(f"The target '{target}' does not occur in the prompt's tokens.")


def analyse_prompt(handle: ModelHandle, params: PromptParams) -> PromptResult:
    """Per layer/head sharpness of the last token's attention on a user prompt."""
    if not params.text.strip():
        raise SharpnessError("Enter a prompt: the statistics are about how its last token attends.")
    tok = handle.tokenizer
    ids = _leading_specials(tok) + _encode(tok, params.text)
    limit = handle.info.max_positions or 4096
    if len(ids) > limit:
        raise SharpnessError(f"The prompt has {len(ids)} tokens, more than the model's {limit} positions.")
    if len(ids) < 2:
        raise SharpnessError("The prompt needs at least two tokens.")
    span = _find_span(tok, ids, params.target)
    x = torch.tensor([ids])
    runs = {}
    for name, rule in (("softmax", Temperature()), ("tempered", params.rule)):
        rec = Recorder()
        logits = tempered_logits(handle, x, rule, rec)
        runs[name] = (rec, tok.decode([int(logits[0, -1].argmax())]))
    stats = {}
    for name, (rec, _) in runs.items():
        stats[name] = _mean_stats([head_stats(rec, [span], False)])
        stats[name + "_no_sink"] = _mean_stats([head_stats(rec, [span], True)])
    weights = {name: [rec.probs[k][0].tolist() for k in sorted(rec.probs)] for name, (rec, _) in runs.items()}
    return PromptResult(
        params=params, tokens=[tok.decode([i]) for i in ids], target_positions=span,
        weights_softmax=weights["softmax"], weights_tempered=weights["tempered"],
        next_token_softmax=runs["softmax"][1], next_token_tempered=runs["tempered"][1], **stats,
    )


# ---------------------------------------------------------------------------------------------
# Sizes, θ sweep and accuracy on synthetic max-retrieval prompts


@dataclass
class SweepParams(Result):
    ns: list[int] = field(default_factory=lambda: list(DEFAULT_NS))
    thetas: list[float] = field(default_factory=lambda: list(DEFAULT_THETAS))
    samples: int = 32  # prompts per n
    seed: int = 0
    batch: int = 64
    layers: list[int] | None = None  # layers the temperatures apply in (None: every layer)


@dataclass
class RunStats(Result):
    """One temperature rule at one n, averaged over the prompts."""

    rule: Temperature
    accuracy: float  # argmax of the answer position == the largest item
    answer_prob: float  # mean probability of the correct answer token
    runner_up: float  # share of prompts answered with the second-largest value (a near miss)
    with_sink: HeadStats
    without_sink: HeadStats


@dataclass
class SizePoint(Result):
    n: int
    tokens: int  # prompt length in tokens (mean)
    runs: list[RunStats]  # one per rule: softmax, adaptive, then each θ of the sweep

    def run(self, label: str) -> RunStats:
        return next(r for r in self.runs if r.rule.label == label)


@dataclass
class SweepResult(Result):
    model: str
    params: SweepParams
    format: str
    example: RetrievalPrompt  # the first prompt at the smallest n, to show what the model sees
    points: list[SizePoint]
    skipped: list[int]  # n values whose prompts exceed the model's positions
    layers: int
    heads: int

    def rules(self) -> list[str]:
        return [r.rule.label for r in self.points[0].runs] if self.points else []

    def retrieval_head(self) -> tuple[int, int]:
        """(layer, head) putting the most softmax weight on the max item at the smallest n."""
        tw = self.points[0].run("softmax").with_sink.target_weight
        return max(((l, h) for l in range(len(tw)) for h in range(len(tw[l]))), key=lambda lh: tw[lh[0]][lh[1]])

    def accuracy_table(self) -> list[dict]:
        """Per n: accuracy and max-item weight (mean over heads, and the retrieval head), softmax vs adaptive."""
        l, h = self.retrieval_head()
        rows = []
        for p in self.points:
            soft, ada = p.run("softmax"), p.run("adaptive θ")
            rows.append({
                "n": p.n, "tokens": p.tokens,
                "softmax accuracy": soft.accuracy, "adaptive accuracy": ada.accuracy,
                "softmax P(answer)": soft.answer_prob, "adaptive P(answer)": ada.answer_prob,
                "softmax runner-up": soft.runner_up, "adaptive runner-up": ada.runner_up,
                f"softmax max-item weight L{l}H{h}": soft.with_sink.target_weight[l][h],
                f"adaptive max-item weight L{l}H{h}": ada.with_sink.target_weight[l][h],
                "softmax max-item weight, mean of heads": _mean2(soft.with_sink.target_weight),
                "adaptive max-item weight, mean of heads": _mean2(ada.with_sink.target_weight),
            })
        return rows


def _mean2(rows: list[list[float]]) -> float:
    flat = [v for row in rows for v in row]
    return sum(flat) / len(flat) if flat else float("nan")


def _evaluate(handle: ModelHandle, prompts: list[RetrievalPrompt], rule: Temperature, batch: int) -> RunStats:
    """Run `rule` on prompts (batched by length, no padding) and average the statistics."""
    by_len: dict[int, list[RetrievalPrompt]] = {}
    for pr in prompts:
        by_len.setdefault(len(pr.input_ids), []).append(pr)
    sink, no_sink = [], []
    correct, runner_up, prob = 0, 0, 0.0
    for group in by_len.values():
        for i in range(0, len(group), batch):
            chunk = group[i:i + batch]
            rec = Recorder()
            logits = tempered_logits(handle, torch.tensor([p.input_ids for p in chunk]), rule, rec)[:, -1]
            answers = torch.tensor([p.answer_id for p in chunk], device=logits.device)
            predicted = logits.argmax(-1)
            correct += int((predicted == answers).sum())
            runner_up += int((predicted == torch.tensor([p.runner_up_id for p in chunk], device=logits.device)).sum())
            prob += float(torch.softmax(logits, -1).gather(1, answers[:, None]).sum())
            targets = [p.target for p in chunk]
            sink.append(head_stats(rec, targets, False))
            no_sink.append(head_stats(rec, targets, True))
    return RunStats(rule=rule, accuracy=correct / len(prompts), answer_prob=prob / len(prompts),
                    runner_up=runner_up / len(prompts),
                    with_sink=_mean_stats(sink), without_sink=_mean_stats(no_sink))


def size_sweep(handle: ModelHandle, params: SweepParams | None = None,
               progress: ProgressFn | None = None) -> SweepResult:
    """Softmax, adaptive θ and each fixed θ at every n: head statistics, accuracy, answer probability."""
    params = params or SweepParams()
    require_kind(handle, "causal_lm", "vlm", panel="attention sharpness")
    if not params.ns or min(params.ns) < 2:
        raise SharpnessError("Choose at least one item count n >= 2.")
    if params.samples < 1:
        raise SharpnessError("Use at least one prompt per n.")
    tok = handle.tokenizer
    limit = handle.info.max_positions or 4096
    only = tuple(params.layers) if params.layers is not None else None
    if only is not None and not set(only) <= set(range(handle.info.layers)):
        raise SharpnessError(f"The model has layers 0-{handle.info.layers - 1}; cannot apply a temperature in {list(only)}.")
    rules = [Temperature(), Temperature("adaptive", layers=only)] + [
        Temperature("fixed", t, layers=only) for t in params.thetas if t != 1.0]
    points, skipped, example, fmt_name = [], [], None, ""
    ns = sorted(set(params.ns))
    build = prompt_builder(tok)
    total = len(ns) * len(rules)
    for i, n in enumerate(ns):
        prompts = [build(n, params.seed + k) for k in range(params.samples)]
        if max(len(p.input_ids) for p in prompts) > limit:
            skipped.append(n)
            continue
        example = example or prompts[0]
        fmt_name = prompts[0].format
        runs = []
        for j, rule in enumerate(rules):
            if progress:
                progress((i * len(rules) + j) / total, f"n = {n}, {rule.label}")
            runs.append(_evaluate(handle, prompts, rule, params.batch))
        tokens = round(sum(len(p.input_ids) for p in prompts) / len(prompts))
        points.append(SizePoint(n=n, tokens=tokens, runs=runs))
    if not points:
        raise SharpnessError(f"Every chosen n gives a prompt longer than the model's {limit} positions.")
    if progress:
        progress(1.0, "done")
    return SweepResult(model=handle.spec.label, params=params, format=fmt_name, example=example,
                       points=points, skipped=skipped, layers=handle.info.layers, heads=handle.info.heads)


# ---------------------------------------------------------------------------------------------
# Command line


def _cli_numbers(text: str, what: str, cast) -> list:
    """A comma-separated list of numbers, or SettingsError naming the bad item."""
    from analysis.registry import SettingsError

    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            out.append(cast(item))
        except ValueError:
            kind = "whole numbers" if cast is int else "numbers"
            raise SettingsError(f"{what} must be comma-separated {kind}; '{item}' is not one.") from None
    return out


def _cli_params(args) -> SweepParams:
    """The CLI's settings as SweepParams, every number range-checked (SettingsError: one line)."""
    from analysis.registry import SettingsError, check_range

    ns = _cli_numbers(args.n, "--n (item counts)", int)
    if not ns:
        raise SettingsError("--n needs at least one item count n >= 2.")
    for n in ns:
        check_range("Each item count n", n, low=2, high=100_000, integer=True)
    thetas = _cli_numbers(args.thetas, "--thetas (temperatures)", float)
    for theta in thetas:
        check_range("Each temperature θ", theta, low=1e-6, high=1e6)
    check_range("--samples (prompts per n)", args.samples, low=1, high=100_000, integer=True)
    check_range("--seed", args.seed, low=0, integer=True)
    layers = _cli_numbers(args.layers, "--layers", int)
    for layer in layers:
        check_range("Each layer in --layers", layer, low=0, integer=True)
    return SweepParams(ns=ns, thetas=thetas, samples=args.samples, seed=args.seed, layers=layers or None)


def cli(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m analysis sharpness",
                                     description="Attention sharpness vs n, θ sweep, adaptive temperature.")
    parser.add_argument("--model", default="zoo:shapes-lm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    parser.add_argument("--n", default=",".join(map(str, DEFAULT_NS)), help="item counts, comma separated")
    parser.add_argument("--thetas", default=",".join(map(str, DEFAULT_THETAS)), help="fixed temperatures")
    parser.add_argument("--samples", type=int, default=32, help="prompts per n")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", default="", help="apply the temperatures only in these layers (default: all)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    try:
        params = _cli_params(args)  # checked before the model loads
        result = size_sweep(load_model(ModelSpec.parse(args.model)), params)
    except (SharpnessError, ValueError) as exc:  # ValueError includes registry.SettingsError
        import sys

        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(result.to_json())
        return 0
    print(f"{result.model}: max retrieval ({result.format} format), {params.samples} prompts per n\n")
    rows = result.accuracy_table()
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
    if result.skipped:
        print(f"\nskipped (longer than the context): {result.skipped}")
    return 0


# ---------------------------------------------------------------------------------------------
# The panel's declaration (analysis/panels.py)

def _declare():
    from analysis import cost
    from analysis.panels import Analysis, Run

    return Analysis(
        name="sharpness", title="Attention sharpness", icon=":material/blur_on:", page="attention_sharpness.py",
        summary="Entropy and max weight of every head as inputs grow; temperature sweeps and the "
                "adaptive-temperature rule.",
        paper="Softmax is not enough (ICML 2025)", kinds=("causal_lm", "vlm"),
        runs=(Run(size_sweep, cost._sharpness_sweep), Run(analyse_prompt, cost._sharpness_prompt)),
        cli=cli)


ANALYSIS = _declare()

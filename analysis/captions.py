"""Caption hallucination correction: decompose, verify each claim alone, rewrite (CapMAS, ICML 2025).

Three agents, each a small object behind one method and looked up by a stable name:

- a decomposer turns a caption into atomic claims;
- a verifier asks the vision-language model a yes/no question about one claim at a time and reads
  p_True and p_False off its next-token distribution;
- a rewriter turns (caption, true claims, false claims) into a caption without the false content.

A claim u is flagged when H(u) = -log max(p_T - p_F, eps) exceeds the threshold pi (CapMAS's
hallucination score). By default p_T and p_F are the raw next-token probabilities, as the paper
writes H; the labelled option "renormalised" reads p_T / (p_T + p_F) instead. The yes+no mass
p_T + p_F is kept per claim: when it is small the verifier is not answering the question.

Every agent and every probability form is a small dataclass registered by its stable name
(`DECOMPOSERS`, `REWRITERS`, `VERIFIERS`, `PROBABILITY_FORMS`), holding and checking its own settings.
Grounding attributes each verification answer to image patches with Captum's Integrated
Gradients. On Shapes World the ground truth is known, so factuality, coverage, CHAIR and
POPE-style verifier scores are exact.
"""
from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

from analysis import anatomy
from analysis.images import open_image  # noqa: F401  (uploads: one decoder for every panel)
from analysis.models import ModelHandle, ModelLoadError, ModelSpec, load_model, require_kind
from analysis.registry import Method, Registry, SettingsError, check_range
from analysis.results import Result
from analysis.tasks import tasks_for

Progress = Callable[[float, str], None]

DEFAULT_PI = 1.0
DEFAULT_EPS = 1e-4
DEFAULT_PROBABILITIES = "raw"  # the paper's H reads the raw p(T|x,Q(u)), p(F|x,Q(u))
LOW_MASS = 0.5  # below this yes+no mass the verifier is mostly answering something else
GENERIC_CAPTION_PROMPT = "Describe this image in detail."
CAPTION_TOKENS = 96  # tokens a generated caption may have


class CaptionError(SettingsError):
    """Bad input for the caption panel; the message is meant for a user (one line)."""


# ---------------------------------------------------------------------------------------------
# Params and results


@dataclass
class CorrectionParams(Result):
    caption: str = ""
    pi: float = DEFAULT_PI  # flag a claim when H(u) > pi
    eps: float = DEFAULT_EPS
    decomposer: str = "auto"
    verifier: str = "auto"
    rewriter: str = "auto"
    ground: bool = True  # Captum heatmap per claim
    ig_steps: int = 8
    scene_seed: int | None = None  # a Shapes World scene: enables ground truth
    probabilities: str = DEFAULT_PROBABILITIES  # name in PROBABILITY_FORMS: how H reads p_T and p_F

    def validate(self) -> None:
        """Every setting in range, or SettingsError with a message for the user (CLI, URL and page)."""
        check_range("The threshold π", self.pi, low=0)
        check_range("ε", self.eps, low=1e-12, high=0.5)
        check_range("Integrated Gradients steps", self.ig_steps, low=1, high=512, integer=True)
        if self.scene_seed is not None:
            check_range("The scene seed", self.scene_seed, low=0, integer=True)
        probability_form(self.probabilities)


@dataclass
class ClaimVerdict(Result):
    claim: str
    p_true: float
    p_false: float
    score: float  # H(u), from p_T and p_F as the params' probability form reads them
    flagged: bool
    truth: bool | None = None  # ground truth when the scene is known
    heatmap: list[list[float]] | None = None  # patch grid, signed attribution of the answer
    asked: bool = True  # False when the verifier's question format cannot express the claim

    @property
    def mass(self) -> float:
        """p_T + p_F: how much of the next-token distribution answers the yes/no question at all."""
        return self.p_true + self.p_false

    @property
    def low_mass(self) -> bool:
        return self.asked and self.mass < LOW_MASS


@dataclass
class CaptionMetrics(Result):
    claims: int
    true_claims: int
    factuality: float  # share of the caption's claims that are true
    facts: int
    facts_stated: int
    coverage: float  # share of the scene's facts the caption states
    objects_mentioned: int
    objects_hallucinated: int
    chair_i: float  # share of mentioned objects not in the scene (CHAIR_i)
    chair_s: float  # 1.0 if any mentioned object is not in the scene (CHAIR_s for one caption)


@dataclass
class PopeMetrics(Result):
    n: int
    accuracy: float
    precision: float
    recall: float
    f1: float
    yes_ratio: float


@dataclass
class SweepPoint(Result):
    pi: float
    kept: int
    factuality: float | None  # of the kept claims (None without ground truth)
    coverage: float | None


@dataclass
class DiffSpan(Result):
    op: str  # "same" | "removed" | "added"
    text: str


@dataclass
class SceneCaptionParams(Result):
    """Caption one Shapes World scene (so a generated caption is keyed, shared and shipped by its seed)."""

    scene_seed: int = 0
    max_new_tokens: int = CAPTION_TOKENS

    def validate(self) -> None:
        check_range("The scene seed", self.scene_seed, low=0, integer=True)
        _check_new_tokens(self.max_new_tokens)


@dataclass
class GeneratedCaption(Result):
    text: str
    scene_seed: int | None = None


@dataclass
class Verification(Result):
    """Claims with their verifier probabilities and heatmaps: everything that does not depend on pi."""

    caption: str
    claims: list[ClaimVerdict]
    grid: int  # patches per side of the heatmaps (0 when not grounded)
    agents: dict[str, str]
    scene_seed: int | None = None


@dataclass
class CorrectionResult(Result):
    params: CorrectionParams
    caption: str
    corrected: str
    claims: list[ClaimVerdict]
    diff: list[DiffSpan]
    agents: dict[str, str]
    grid: int  # patches per side of the heatmaps (0 when not grounded)
    before: CaptionMetrics | None = None
    after: CaptionMetrics | None = None
    sweep: list[SweepPoint] = field(default_factory=list)
    rewrite_note: str = ""  # set when the rewriter's own output was rejected (see ShapesLMRewriter)

    @property
    def kept(self) -> list[str]:
        return [c.claim for c in self.claims if not c.flagged]

    @property
    def dropped(self) -> list[str]:
        return [c.claim for c in self.claims if c.flagged]


# ---------------------------------------------------------------------------------------------
# Shapes World (the zoo's generator) is optional: loaded lazily so real models work without it


def shapes_world():
    try:
        from analysis.zoo import shapes_world as world
    except ImportError as exc:
        raise CaptionError("Shapes World is not installed (analysis/zoo/shapes_world.py is missing).") from exc
    return world


def has_shapes_world() -> bool:
    try:
        shapes_world()
    except CaptionError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# The score and the flag


def hallucination_score(p_true: float, p_false: float, eps: float = DEFAULT_EPS,
                        probabilities: str = DEFAULT_PROBABILITIES) -> float:
    """H(u) = -log max(p_T - p_F, eps) (CapMAS): 0 for a certain 'true', -log eps for 'false'.
    `probabilities` names how p_T and p_F are read first (raw by default, as in the paper)."""
    p_true, p_false = probability_form(probabilities).read(p_true, p_false)
    return -math.log(max(p_true - p_false, eps))


PROBABILITY_FORMS: Registry["ProbabilityForm"] = Registry("p_True/p_False form")


@dataclass
class ProbabilityForm(Method):
    """How the hallucination score reads the verifier's (p_T, p_F)."""

    def read(self, p_true: float, p_false: float) -> tuple[float, float]:
        raise NotImplementedError


@PROBABILITY_FORMS.register
@dataclass
class RawProbabilities(ProbabilityForm):
    """The paper's form: the raw next-token probabilities of yes and no. Mass that leaks to other
    tokens lowers both, so p_T - p_F shrinks and H rises."""

    name: ClassVar[str] = "raw"
    label: ClassVar[str] = "raw p_T, p_F (CapMAS, as in the paper)"

    def read(self, p_true, p_false):
        return p_true, p_false


@PROBABILITY_FORMS.register
@dataclass
class RenormalisedProbabilities(ProbabilityForm):
    """p_T / (p_T + p_F) and p_F / (p_T + p_F): the answer among yes and no only, whatever mass
    went elsewhere (0, 0 when no mass is on either: nothing to read)."""

    name: ClassVar[str] = "renormalised"
    label: ClassVar[str] = "renormalised p_T/(p_T+p_F) (variant)"

    def read(self, p_true, p_false):
        mass = p_true + p_false
        return (p_true / mass, p_false / mass) if mass > 0 else (0.0, 0.0)


def probability_form(name: str) -> ProbabilityForm:
    if name not in PROBABILITY_FORMS:
        raise CaptionError(f"Unknown p_True/p_False form '{name}' (choose one of {', '.join(PROBABILITY_FORMS)}).")
    return PROBABILITY_FORMS.create(name)


# ---------------------------------------------------------------------------------------------
# Text generation and next-token probabilities on a shared model (always under its lock)


def generate_text(handle: ModelHandle, prompt: str, max_new_tokens: int = 64,
                  add_special_tokens: bool = True) -> str:
    """Greedy continuation of `prompt` by the handle's language model (a VLM's own LM too)."""
    tok = handle.tokenizer
    ids = tok(prompt, return_tensors="pt", add_special_tokens=add_special_tokens).to(handle.device)
    room = (handle.info.max_positions or 1 << 30) - ids["input_ids"].shape[1]
    if room <= 0:
        raise CaptionError(f"The prompt is longer than {handle.spec.label} can read "
                           f"({handle.info.max_positions} tokens); use a shorter caption.")
    max_new_tokens = min(max_new_tokens, room)
    with handle.session(), anatomy.model_step(handle, "generating text"):
        out = handle.language_model.generate(
            **ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=_pad_id(tok),
        )
    return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def caption_image(handle: ModelHandle, image, prompt: str | None = None,
                  max_new_tokens: int = CAPTION_TOKENS) -> str:
    """Greedy caption of `image` by a VLM, with its chat template when it has one."""
    require_kind(handle, "vlm", panel="Caption correction")
    if prompt is None:
        prompt = caption_prompt(handle)
    inputs = vlm_inputs(handle, [image], [prompt])
    with handle.session(), anatomy.model_step(handle, "captioning the image"):
        out = handle.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                    pad_token_id=_pad_id(handle.tokenizer))
    text = handle.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
    return shapes_text(text) if speaks_shapes_world(handle) else text


def caption_prompt(handle: ModelHandle) -> str:
    """The captioning prompt: the task provider's (the demo VLMs' trained one), else a generic request
    through the chat template."""
    return tasks_for(handle).caption_prompt(handle) or vlm_prompt(handle, GENERIC_CAPTION_PROMPT)


def vlm_prompt(handle: ModelHandle, text: str) -> str:
    """A one-image user turn: the chat template's when there is one, else '<image> text'."""
    return anatomy.image_prompt(handle, text)


def speaks_shapes_world(handle: ModelHandle) -> bool:
    """True for the demo models: the task provider gives them Shapes World tasks."""
    return tasks_for(handle).shapes_world


def shapes_text(text: str) -> str:
    """Shapes World spacing: every punctuation mark is its own word ('left.' -> 'left .').

    The word-level tokenizers' decoder glues punctuation to the previous word; the grammar needs it apart.
    """
    return " ".join(re.sub(r"([.;?:=])", r" \1 ", text).split())


def vlm_inputs(handle: ModelHandle, images: list, prompts: list[str]) -> dict[str, torch.Tensor]:
    """The processor's tensors for one image per prompt, left-padded (every row's next-token logits sit
    at its last position), on the model's device."""
    processor = anatomy.require_processor(handle, "Caption correction")
    with anatomy.model_step(handle, "preparing the image and prompt"):
        inputs = processor(images=[[_rgb(i)] for i in images], text=prompts, return_tensors="pt",
                           padding=True, padding_side="left")
    return {k: v.to(handle.device) for k, v in inputs.items()}


def _rgb(image):
    return image.convert("RGB") if getattr(image, "mode", "RGB") != "RGB" else image


def _pad_id(tok) -> int | None:
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


def answer_token_ids(tokenizer, word: str) -> list[int]:
    """Ids of single tokens that spell `word` (any case, with or without a leading space)."""
    ids: set[int] = set()
    for variant in {word, word.lower(), word.capitalize(), word.upper()}:
        for text in (variant, " " + variant):
            enc = tokenizer.encode(text, add_special_tokens=False)
            if len(enc) == 1 and enc[0] != tokenizer.unk_token_id:
                if tokenizer.decode(enc).strip().lower() == word.lower():
                    ids.add(enc[0])
    return sorted(ids)


# ---------------------------------------------------------------------------------------------
# Agents: small dataclasses registered by stable name (names appear in URLs and saved analyses)

DECOMPOSERS: Registry["Decomposer"] = Registry("decomposer")
REWRITERS: Registry["Rewriter"] = Registry("rewriter")
VERIFIERS: Registry["YesNoVerifier"] = Registry("verifier")


@dataclass
class Agent(Method):
    """A decomposer or rewriter. `needs_lm`: it runs a language model (given as `lm`).

    `prompt(...)` is what it asks that model (None: it runs none) and `new_tokens(...)` how many tokens
    the model generates at most: the cost estimate (`analysis/cost.py`) counts both before it runs."""

    needs_lm: ClassVar[bool] = False


@dataclass
class Decomposer(Agent):
    def decompose(self, caption: str) -> list[str]:
        raise NotImplementedError

    def prompt(self, caption: str) -> str | None:
        return None

    def new_tokens(self, caption: str) -> int:
        return 0


@dataclass
class Rewriter(Agent):
    def rewrite(self, caption: str, true_claims: list[str], false_claims: list[str]) -> str:
        raise NotImplementedError

    def prompt(self, caption: str, true_claims: list[str], false_claims: list[str]) -> str | None:
        return None

    def new_tokens(self, caption: str, true_claims: list[str], false_claims: list[str]) -> int:
        return 0


def _answer_tokens(lm: ModelHandle, answer: str, limit: int) -> int:
    """Tokens of `answer` and the end-of-text token after it, at most `limit`: the length of an answer
    the demo LM was trained to give."""
    return min(limit, len(lm.tokenizer(answer, add_special_tokens=False)["input_ids"]) + 1)


def _check_new_tokens(value: int) -> None:
    check_range("Tokens to generate", value, low=1, high=4096, integer=True)


@DECOMPOSERS.register
@dataclass
class GrammarDecomposer(Decomposer):
    """Shapes World reference: the caption grammar parsed by rule."""

    name: ClassVar[str] = "grammar"
    label: ClassVar[str] = "Shapes World grammar (reference)"

    def decompose(self, caption: str) -> list[str]:
        return list(shapes_world().decompose(shapes_text(caption)))


@DECOMPOSERS.register
@dataclass
class ShapesLMDecomposer(Decomposer):
    """The demo LM (`shapes-lm`) trained on Shapes World's 'decompose : CAPTION =' task."""

    name: ClassVar[str] = "shapes-lm"
    label: ClassVar[str] = "demo LM (shapes-lm)"
    needs_lm: ClassVar[bool] = True
    lm: ModelHandle | None = None
    max_new_tokens: int = 160

    def validate(self) -> None:
        _check_new_tokens(self.max_new_tokens)

    def decompose(self, caption: str) -> list[str]:
        text = generate_text(self.lm, self.prompt(caption), self.max_new_tokens, add_special_tokens=False)
        return list(dict.fromkeys(c.strip() for c in shapes_text(text).split(";") if c.strip()))

    def prompt(self, caption: str) -> str:
        return f"<s> decompose : {shapes_text(caption)} ="

    def new_tokens(self, caption: str) -> int:
        # trained to answer the grammar's claims joined by ' ; ' (100 % exact on held-out captions)
        claims = GrammarDecomposer().decompose(caption)
        return _answer_tokens(self.lm, " ; ".join(claims), self.max_new_tokens) if claims else self.max_new_tokens


@DECOMPOSERS.register
@dataclass
class ChatDecomposer(Decomposer):
    """Prompt-based decomposition by an instruct LM through its chat template."""

    name: ClassVar[str] = "lm-chat"
    label: ClassVar[str] = "instruct LM, chat prompt"
    needs_lm: ClassVar[bool] = True
    lm: ModelHandle | None = None
    max_new_tokens: int = 200

    def validate(self) -> None:
        _check_new_tokens(self.max_new_tokens)

    def decompose(self, caption: str) -> list[str]:
        text = generate_text(self.lm, self.prompt(caption), self.max_new_tokens, add_special_tokens=False)
        return parse_claim_lines(text)

    def prompt(self, caption: str) -> str:
        return chat_prompt(self.lm, DECOMPOSE_INSTRUCTION.format(caption=caption))

    def new_tokens(self, caption: str) -> int:
        return self.max_new_tokens  # an instruct model's answer length is not known before it runs


@REWRITERS.register
@dataclass
class GrammarRewriter(Rewriter):
    """Shapes World reference: the caption restricted to the true claims (adds nothing)."""

    name: ClassVar[str] = "grammar"
    label: ClassVar[str] = "Shapes World grammar (reference: removes, never adds)"

    def rewrite(self, caption: str, true_claims: list[str], false_claims: list[str]) -> str:
        return shapes_world().rewrite(shapes_text(caption), true_claims)


@REWRITERS.register
@dataclass
class ShapesLMRewriter(Rewriter):
    """The demo LM (`shapes-lm`) trained on 'rewrite : CAPTION drop : CLAIM ; CLAIM =' (CapMAS's rewriter)."""

    name: ClassVar[str] = "shapes-lm"
    label: ClassVar[str] = "demo LM (shapes-lm), checked"
    needs_lm: ClassVar[bool] = True
    lm: ModelHandle | None = None
    max_new_tokens: int = 120
    checked: bool = True  # parse the LM's rewrite; if it states a claim that was not kept, use the grammar's
    note: str = ""  # why the last rewrite was replaced ("" when it was kept)

    def validate(self) -> None:
        _check_new_tokens(self.max_new_tokens)

    def prompt(self, caption: str, true_claims: list[str], false_claims: list[str]) -> str:
        drop = " ; ".join(false_claims) if false_claims else "none"
        return f"<s> rewrite : {shapes_text(caption)} drop : {drop} ="

    def new_tokens(self, caption: str, true_claims: list[str], false_claims: list[str]) -> int:
        # trained to answer the grammar's rewrite (90.5 % exact on held-out captions)
        if not GrammarDecomposer().decompose(caption):
            return self.max_new_tokens
        return _answer_tokens(self.lm, GrammarRewriter().rewrite(caption, true_claims, false_claims),
                              self.max_new_tokens)

    def rewrite(self, caption: str, true_claims: list[str], false_claims: list[str]) -> str:
        prompt = self.prompt(caption, true_claims, false_claims)
        text = shapes_text(generate_text(self.lm, prompt, self.max_new_tokens, add_special_tokens=False))
        self.note = ""
        if not self.checked:
            return text
        world = shapes_world()
        kept = {world.normalize(c) for c in true_claims}
        added = [c for c in world.decompose(text) if c not in kept]
        if added:
            # The rewriter is 90% exact on held-out captions; its misses mostly restate a dropped claim
            # or invent one, which would put a hallucination back. The grammar rewrite adds nothing.
            self.note = (f"The {self.name} rewrite stated {len(added)} claim(s) that were not kept "
                         f"({'; '.join(added[:3])}{' ...' if len(added) > 3 else ''}), so the grammar "
                         "rewrite is shown instead.")
            return GrammarRewriter().rewrite(caption, true_claims, false_claims)
        return text


@REWRITERS.register
@dataclass
class ChatRewriter(Rewriter):
    """Prompt-based rewriting by an instruct LM through its chat template."""

    name: ClassVar[str] = "lm-chat"
    label: ClassVar[str] = "instruct LM, chat prompt"
    needs_lm: ClassVar[bool] = True
    lm: ModelHandle | None = None
    max_new_tokens: int = 200

    def validate(self) -> None:
        _check_new_tokens(self.max_new_tokens)

    def rewrite(self, caption: str, true_claims: list[str], false_claims: list[str]) -> str:
        if not false_claims:
            return caption
        # The chat template already starts with the model's BOS token.
        return generate_text(self.lm, self.prompt(caption, true_claims, false_claims), self.max_new_tokens,
                             add_special_tokens=False)

    def prompt(self, caption: str, true_claims: list[str], false_claims: list[str]) -> str | None:
        if not false_claims:
            return None
        return chat_prompt(self.lm, REWRITE_INSTRUCTION.format(
            caption=caption, false="\n".join(f"- {c}" for c in false_claims),
            true="\n".join(f"- {c}" for c in true_claims) or "- (none)",
        ))

    def new_tokens(self, caption: str, true_claims: list[str], false_claims: list[str]) -> int:
        return self.max_new_tokens if false_claims else 0


DECOMPOSE_INSTRUCTION = (
    "Split the image caption below into short atomic claims, each stating one fact "
    "(an object, one attribute of an object, or one relation). Write one claim per line and "
    "nothing else.\n\nCaption: {caption}"
)
REWRITE_INSTRUCTION = (
    "Rewrite the image caption below so that it no longer states any of the false claims. "
    "Keep everything else as it is and add no new information. Reply with the caption only.\n\n"
    "Caption: {caption}\nFalse claims:\n{false}\nTrue claims:\n{true}"
)


def chat_prompt(handle: ModelHandle, text: str) -> str:
    tok = handle.tokenizer
    if not getattr(tok, "chat_template", None):
        raise CaptionError(f"{handle.spec.label} has no chat template, so it cannot follow the "
                           "prompt-based agents; choose the Shapes World agents instead.")
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                   tokenize=False)


def parse_claim_lines(text: str) -> list[str]:
    """Claims from a one-per-line answer, without bullets or numbering; duplicates dropped."""
    claims: list[str] = []
    for line in text.splitlines():
        line = re.sub(r"^\s*(?:[-*\u2022]|\d+[.)])\s*", "", line).strip()
        if line and line not in claims:
            claims.append(line)
    return claims


@dataclass
class YesNoVerifier(Method):
    """p_True, p_False from the VLM's next token after a yes/no question about one claim alone.

    Subclasses say how a claim becomes the full prompt (`question`, image token included). Claims
    are batched, but each row holds one claim only, so no claim sees another.
    """

    vlm: ModelHandle
    batch_size: int = 16
    answers: ClassVar[tuple[str, str]] = ("yes", "no")

    def validate(self) -> None:
        check_range("Verifier batch size", self.batch_size, low=1, high=1024, integer=True)
        tok = self.vlm.tokenizer
        self.yes_ids = answer_token_ids(tok, self.answers[0])
        self.no_ids = answer_token_ids(tok, self.answers[1])
        if not self.yes_ids or not self.no_ids:
            raise CaptionError(f"{self.vlm.spec.label}'s vocabulary has no single token for "
                               f"'{self.answers[0]}' and '{self.answers[1]}', so it cannot answer "
                               "the verification questions.")

    def question(self, claim: str) -> str:
        raise NotImplementedError

    @property
    def grid(self) -> int:
        vc = self.vlm.model.config.vision_config
        return int(vc.image_size) // int(vc.patch_size)

    def can_ask(self, claim: str) -> bool:
        try:
            self.question(claim)
        except ValueError:
            return False
        return True

    def verify(self, image, claims: list[str]) -> list[tuple[float, float]]:
        """(p_T, p_F) per claim; a claim the question format cannot express gets (0, 0): unverified."""
        out = {i: (0.0, 0.0) for i, c in enumerate(claims) if not self.can_ask(c)}
        todo = [i for i in range(len(claims)) if i not in out]
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start:start + self.batch_size]
            inputs = vlm_inputs(self.vlm, [image] * len(chunk), [self.question(claims[i]) for i in chunk])
            with self.vlm.session(), anatomy.model_step(self.vlm, "verifying claims"):
                logits = self.vlm.model(**inputs).logits[:, -1].float()
            probs = logits.softmax(-1)
            p_true = probs[:, self.yes_ids].sum(-1)
            p_false = probs[:, self.no_ids].sum(-1)
            out.update({i: (float(t), float(f)) for i, t, f in zip(chunk, p_true, p_false)})
        return [out[i] for i in range(len(claims))]

    def answer_margin(self, logits: torch.Tensor) -> torch.Tensor:
        """log p_T - log p_F from next-token logits (B, V): what the grounding attributes."""
        return logits[:, self.yes_ids].logsumexp(-1) - logits[:, self.no_ids].logsumexp(-1)


GENERIC_QUESTION = "Is the following statement about this image true? Answer yes or no.\nStatement: {claim}"


@VERIFIERS.register
@dataclass
class ShapesVLMVerifier(YesNoVerifier):
    """The demo VLM's trained question format: '<s> <image> question : is there a red circle ? answer :'."""

    name: ClassVar[str] = "shapes-vlm"
    label: ClassVar[str] = "demo VLM question format (Shapes World)"

    def question(self, claim: str) -> str:
        return shapes_world().vlm_question_prompt(claim)


@VERIFIERS.register
@dataclass
class ChatYesNoVerifier(YesNoVerifier):
    """Any VLM: a yes/no question about the claim, through the processor's chat template if any."""

    name: ClassVar[str] = "vlm-yesno"
    label: ClassVar[str] = "any VLM, yes/no question"

    def question(self, claim: str) -> str:
        return vlm_prompt(self.vlm, GENERIC_QUESTION.format(claim=claim))


def make_verifier(name: str, vlm: ModelHandle) -> YesNoVerifier:
    if name != "auto" and name not in VERIFIERS:
        raise CaptionError(f"Unknown verifier '{name}' (choose one of auto, {', '.join(VERIFIERS)}).")
    require_kind(vlm, "vlm", panel="Caption correction")
    if name == "auto":
        name = tasks_for(vlm).verifier
    return VERIFIERS.create(name, vlm=vlm)


def default_agent(lm: ModelHandle | None) -> str:
    """Decomposer/rewriter used for 'auto': the demo LM, else an instruct LM, else the grammar."""
    if lm is not None and lm.kind == "causal_lm" and speaks_shapes_world(lm):
        return "shapes-lm"
    if lm is not None and getattr(lm.tokenizer, "chat_template", None):
        return "lm-chat"
    return "grammar"


def make_agent(kind: str, name: str, lm: ModelHandle | None):
    registry = {"decomposer": DECOMPOSERS, "rewriter": REWRITERS}[kind]
    if name == "auto":
        name = default_agent(lm)
    if name not in registry:
        raise CaptionError(f"Unknown {kind} '{name}' (choose one of auto, {', '.join(registry)}).")
    cls = registry.get(name)
    if cls.needs_lm and lm is None:
        raise CaptionError(f"The '{name}' agent needs a language model; none was given.")
    return registry.create(name, lm=lm)


# ---------------------------------------------------------------------------------------------
# Grounding: Integrated Gradients of the answer margin w.r.t. pixels, summed per patch


def ground_claims(verifier: YesNoVerifier, image, claims: list[str], steps: int = 8,
                  progress: Progress | None = None) -> list[list[list[float]]]:
    """One patch-grid heatmap (grid x grid) per claim: signed attribution of log p_T - log p_F."""
    from captum.attr import IntegratedGradients

    vlm = verifier.vlm
    grid = verifier.grid
    maps = []
    for i, claim in enumerate(claims):
        inputs = vlm_inputs(vlm, [image], [verifier.question(claim)])
        pixels = inputs.pop("pixel_values")

        def margin(px: torch.Tensor) -> torch.Tensor:
            rows = px.shape[0]
            batch = {k: v.expand(rows, *v.shape[1:]) for k, v in inputs.items()}
            logits = vlm.model(pixel_values=px, **batch).logits[:, -1].float()
            return verifier.answer_margin(logits)

        with vlm.patch(), torch.enable_grad():
            attr = IntegratedGradients(margin).attribute(pixels, baselines=torch.zeros_like(pixels),
                                                         n_steps=steps, internal_batch_size=steps)
        tile = attr[0]
        while tile.dim() > 3:  # tiled processors (LLaVA-NeXT, Idefics3): the first tile is the whole image
            tile = tile[0]
        per_pixel = tile.sum(0).detach()  # (H, W)
        patch = per_pixel.shape[-1] // grid
        maps.append(per_pixel.reshape(grid, patch, grid, patch).sum((1, 3)).tolist())
        if progress:
            progress((i + 1) / len(claims), f"grounding claim {i + 1}/{len(claims)}")
    return maps


# ---------------------------------------------------------------------------------------------
# The pipeline


def verify_caption(vlm: ModelHandle, image, params: CorrectionParams, lm: ModelHandle | None = None,
                   progress: Progress | None = None, verifier: YesNoVerifier | None = None) -> Verification:
    """Decompose the caption and verify (and ground) every claim alone. Independent of pi.

    `verifier` overrides `params.verifier` (e.g. a ground-truth oracle in an evaluation).
    """
    report = progress or (lambda f, m: None)
    params.validate()
    caption = " ".join(params.caption.split())
    if not caption:
        raise CaptionError("The caption is empty: generate one with the VLM or paste one.")
    decomposer = make_agent("decomposer", params.decomposer, lm)
    rewriter = make_agent("rewriter", params.rewriter, lm)  # fail early on a bad name
    verifier = verifier or make_verifier(params.verifier, vlm)

    report(0.05, "decomposing the caption")
    claims = decomposer.decompose(caption)
    if not claims:
        raise CaptionError(f"The {decomposer.name} decomposer found no claims in this caption, so "
                           "there is nothing to verify. Describe objects in the image (for a demo "
                           "scene, e.g. 'there is a large red circle at the top left .').")
    report(0.15, f"verifying {len(claims)} claims")
    probs = verifier.verify(image, claims)
    can_ask = getattr(verifier, "can_ask", lambda claim: True)
    verdicts = [ClaimVerdict(c, pt, pf, hallucination_score(pt, pf, params.eps, params.probabilities), False,
                             asked=can_ask(c))
                for c, (pt, pf) in zip(claims, probs)]
    grid = 0
    if params.ground:
        askable = [i for i, c in enumerate(claims) if verifier.can_ask(c)]
        maps = ground_claims(verifier, image, [claims[i] for i in askable], params.ig_steps,
                             lambda f, m: report(0.3 + 0.7 * f, m))
        for i, m in zip(askable, maps):
            verdicts[i].heatmap = m
        grid = verifier.grid
    if params.scene_seed is not None:
        scene = shapes_world().generate_scene(params.scene_seed)
        for v in verdicts:
            v.truth = shapes_world().claim_truth(scene, v.claim)
    report(1.0, "verified")
    return Verification(caption=caption, claims=verdicts, grid=grid, scene_seed=params.scene_seed,
                        agents={"decomposer": decomposer.name, "verifier": verifier.name,
                                "rewriter": rewriter.name})


def flag_claims(verification: Verification, params: CorrectionParams) -> list[ClaimVerdict]:
    """The verified claims scored with the params' probability form, flagged when H(u) > pi."""
    verdicts = []
    for v in verification.claims:
        score = hallucination_score(v.p_true, v.p_false, params.eps, params.probabilities)
        verdicts.append(ClaimVerdict(**{**vars(v), "score": score, "flagged": score > params.pi}))
    return verdicts


def apply_threshold(verification: Verification, params: CorrectionParams,
                    lm: ModelHandle | None = None) -> CorrectionResult:
    """Score each claim with the params' probability form, flag H(u) > pi and rewrite the caption
    without the flagged claims; metrics on Shapes World. Verification (p_T, p_F) is reused as is."""
    params.validate()
    verdicts = flag_claims(verification, params)
    true_claims = [v.claim for v in verdicts if not v.flagged]
    false_claims = [v.claim for v in verdicts if v.flagged]
    caption = verification.caption
    rewriter = make_agent("rewriter", params.rewriter, lm)
    corrected = " ".join(rewriter.rewrite(caption, true_claims, false_claims).split()) if false_claims else caption
    result = CorrectionResult(
        params=params, caption=caption, corrected=corrected, claims=verdicts,
        diff=word_diff(caption, corrected), grid=verification.grid, agents=dict(verification.agents),
        rewrite_note=getattr(rewriter, "note", "") if false_claims else "",
    )
    if verification.scene_seed is not None:
        scene = shapes_world().generate_scene(verification.scene_seed)
        result.before = score_caption(scene, caption)
        result.after = score_caption(scene, corrected)
        result.sweep = pi_sweep(verdicts, scene)
    else:
        result.sweep = pi_sweep(verdicts)
    return result


def correct_caption(vlm: ModelHandle, image, params: CorrectionParams, lm: ModelHandle | None = None,
                    progress: Progress | None = None) -> CorrectionResult:
    """The whole pipeline: decompose, verify every claim alone, flag H > pi, rewrite."""
    return apply_threshold(verify_caption(vlm, image, params, lm, progress), params, lm)


def verification_params(params: CorrectionParams) -> CorrectionParams:
    """The settings verification depends on: pi and the probability form only re-score its p_T, p_F."""
    return CorrectionParams(**{**vars(params), "pi": DEFAULT_PI, "probabilities": DEFAULT_PROBABILITIES})


# Scene-keyed steps: the image is the Shapes World scene `params.scene_seed`, so each step is fully
# determined by its settings and models (the app shares them between users and ships the default
# view's results; see components/runs.py).


def _scene_of(params) -> Any:
    if params.scene_seed is None:
        raise CaptionError("This step needs a Shapes World scene seed.")
    return scene_image(params.scene_seed)


def caption_scene(handle: ModelHandle, params: SceneCaptionParams,
                  progress: Progress | None = None) -> GeneratedCaption:
    """The VLM's greedy caption of scene `params.scene_seed`."""
    params.validate()
    text = caption_image(handle, _scene_of(params), max_new_tokens=params.max_new_tokens)
    return GeneratedCaption(text=text, scene_seed=params.scene_seed)


def verify_scene(vlm: ModelHandle, params: CorrectionParams, progress: Progress | None = None,
                 lm: ModelHandle | None = None) -> Verification:
    """`verify_caption` on scene `params.scene_seed`."""
    return verify_caption(vlm, _scene_of(params), params, lm, progress)


def correct_scene(vlm: ModelHandle, params: CorrectionParams, progress: Progress | None = None,
                  lm: ModelHandle | None = None) -> CorrectionResult:
    """`correct_caption` on scene `params.scene_seed`, verifying with `verification_params(params)`
    as the page does (the same result: pi and the probability form do not change p_T, p_F)."""
    verification = verify_scene(vlm, verification_params(params), progress, lm)
    return apply_threshold(verification, params, lm)


def word_diff(before: str, after: str) -> list[DiffSpan]:
    """Word-level diff of two captions as same / removed / added spans."""
    a, b = before.split(), after.split()
    spans: list[DiffSpan] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            spans.append(DiffSpan("same", " ".join(a[i1:i2])))
            continue
        if i2 > i1:
            spans.append(DiffSpan("removed", " ".join(a[i1:i2])))
        if j2 > j1:
            spans.append(DiffSpan("added", " ".join(b[j1:j2])))
    return spans


# ---------------------------------------------------------------------------------------------
# Metrics (exact on Shapes World)


def factuality(truths: list[bool]) -> float:
    """Share of claims that are true; an empty caption states nothing false (1.0)."""
    return sum(truths) / len(truths) if truths else 1.0


def coverage(stated: set[str], facts: set[str]) -> float:
    """Share of the scene's facts among the stated claims."""
    return len(stated & facts) / len(facts) if facts else 1.0


def chair(mentioned: list, present: set) -> tuple[float, float]:
    """CHAIR_i (share of object mentions not in the scene) and CHAIR_s (any such mention)."""
    bad = [m for m in mentioned if m not in present]
    return (len(bad) / len(mentioned) if mentioned else 0.0), float(bool(bad))


def pope(predicted_yes: list[bool], is_true: list[bool]) -> PopeMetrics:
    """POPE-style yes/no scores: 'yes' is the positive class."""
    pairs = list(zip(predicted_yes, is_true))
    tp = sum(p and t for p, t in pairs)
    fp = sum(p and not t for p, t in pairs)
    fn = sum(t and not p for p, t in pairs)
    n = len(pairs)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return PopeMetrics(n=n, accuracy=sum(p == t for p, t in pairs) / n if n else 0.0,
                       precision=precision, recall=recall, f1=f1,
                       yes_ratio=sum(predicted_yes) / n if n else 0.0)


def score_caption(scene, caption: str) -> CaptionMetrics:
    """Factuality, coverage and CHAIR of a caption against a Shapes World scene (grammar parse)."""
    return score_claims(scene, shapes_world().decompose(shapes_text(caption)))


def score_claims(scene, claims: list[str]) -> CaptionMetrics:
    """Exact metrics of a set of claims; objects are the (colour, shape) of existence claims."""
    world = shapes_world()
    truths = [world.claim_truth(scene, c) for c in claims]
    facts = {f.text for f in world.scene_facts(scene)}
    objects = [(p[1], p[2]) for p in map(world.parse_claim, claims) if p and p[0] == "existence"]
    present = {(o.colour, o.shape) for o in scene.objects}
    chair_i, chair_s = chair(objects, present)
    return CaptionMetrics(
        claims=len(claims), true_claims=sum(truths), factuality=factuality(truths),
        facts=len(facts), facts_stated=len(set(claims) & facts), coverage=coverage(set(claims), facts),
        objects_mentioned=len(objects), objects_hallucinated=sum(o not in present for o in objects),
        chair_i=chair_i, chair_s=chair_s,
    )


def pi_sweep(verdicts: list[ClaimVerdict], scene=None, pis: list[float] | None = None) -> list[SweepPoint]:
    """Factuality and coverage of the kept claims as pi varies (claim level, no rewriting)."""
    if pis is None:
        top = 1.1 * max([v.score for v in verdicts] + [1.0])
        pis = sorted({round(top * k / 40, 4) for k in range(41)} | {0.0})
    points = []
    for pi in pis:
        kept = [v.claim for v in verdicts if v.score <= pi]
        fact = cov = None
        if scene is not None:
            m = score_claims(scene, kept)
            fact, cov = m.factuality, m.coverage
        points.append(SweepPoint(pi=pi, kept=len(kept), factuality=fact, coverage=cov))
    return points


# ---------------------------------------------------------------------------------------------
# Command line


def cli(argv: list[str]) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m analysis captions",
                                     description="Verify and correct an image caption claim by claim.")
    parser.add_argument("--model", default="zoo:shapes-vlm", help="the VLM (verifier): zoo:NAME, hub:ID or local:PATH")
    parser.add_argument("--lm", default=None, help="LM for the decomposer/rewriter (default: zoo:shapes-lm if present)")
    parser.add_argument("--seed", type=int, default=None, help="Shapes World scene seed")
    parser.add_argument("--image", default=None, help="an image file instead of a scene")
    parser.add_argument("--caption", default=None, help="caption to check (default: the VLM's own)")
    parser.add_argument("--pi", type=float, default=DEFAULT_PI, help="drop a claim when H > pi (>= 0)")
    parser.add_argument("--eps", type=float, default=DEFAULT_EPS, help="floor of p_T - p_F in H (0 < eps <= 0.5)")
    parser.add_argument("--probabilities", default=DEFAULT_PROBABILITIES, choices=list(PROBABILITY_FORMS),
                        help="how H reads p_T and p_F: raw (the paper) or renormalised p_T/(p_T+p_F)")
    parser.add_argument("--decomposer", default="auto", choices=["auto", *DECOMPOSERS])
    parser.add_argument("--verifier", default="auto", choices=["auto", *VERIFIERS])
    parser.add_argument("--rewriter", default="auto", choices=["auto", *REWRITERS])
    parser.add_argument("--ig-steps", type=int, default=8, help="Integrated Gradients steps per claim")
    parser.add_argument("--no-ground", action="store_true", help="skip the Captum heatmaps")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    seed = None if args.image else (0 if args.seed is None else args.seed)
    params = CorrectionParams(caption=args.caption or "", pi=args.pi, eps=args.eps, decomposer=args.decomposer,
                              verifier=args.verifier, rewriter=args.rewriter, ground=not args.no_ground,
                              ig_steps=args.ig_steps, scene_seed=seed, probabilities=args.probabilities)
    if args.seed is not None:
        check_range("The scene seed", args.seed, low=0, integer=True)
    params.validate()  # before any model loads: SettingsError -> one "error: ..." line (analysis/__main__.py)
    try:
        vlm = load_model(ModelSpec.parse(args.model))
        lm = load_agent_lm(args.lm, vlm)
        if args.image:
            with open(args.image, "rb") as fh:
                image = open_image(fh.read())
        else:
            image = scene_image(seed)
        params.caption = args.caption if args.caption is not None else caption_image(vlm, image)
        result = correct_caption(vlm, image, params, lm)
    except (CaptionError, ModelLoadError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(result.to_json())
        return 0
    print(f"caption:   {result.caption}")
    for c in result.claims:
        truth = "" if c.truth is None else f"  truth={'T' if c.truth else 'F'}"
        low = "  LOW yes+no MASS" if c.low_mass else ""
        print(f"  {'DROP' if c.flagged else 'keep'}  H={c.score:6.3f}  pT={c.p_true:.3f} pF={c.p_false:.3f}  "
              f"{c.claim}{truth}{low}")
    low = [c for c in result.claims if c.low_mass]
    if low:
        print(f"note: for {len(low)} of {len(result.claims)} claims p_T + p_F < {LOW_MASS:g} "
              f"(lowest {min(c.mass for c in low):.3f}): the verifier is mostly not answering yes or no, "
              "so its p_True and p_False say little about the claim.")
    print(f"corrected: {result.corrected}")
    if result.before and result.after:
        print(f"factuality {result.before.factuality:.3f} -> {result.after.factuality:.3f}, "
              f"coverage {result.before.coverage:.3f} -> {result.after.coverage:.3f}")
    return 0


def scene_image(seed: int):
    world = shapes_world()
    return world.render(world.generate_scene(seed))


def load_agent_lm(text: str | None, vlm: ModelHandle) -> ModelHandle | None:
    """The decomposer/rewriter LM: the given spec, else zoo shapes-lm, else the VLM's own LM."""
    if text:
        return load_model(ModelSpec.parse(text))
    from analysis.models import zoo_models

    if "shapes-lm" in zoo_models():
        return load_model(ModelSpec("zoo", "shapes-lm"))
    return vlm


# ---------------------------------------------------------------------------------------------
# The panel's declaration (analysis/panels.py)

def _declare():
    from analysis import cost
    from analysis.panels import Analysis, Run

    return Analysis(
        name="captions", title="Caption correction", icon=":material/fact_check:", page="caption_correction.py",
        summary="Split a detailed caption into claims, verify each against the image, rewrite without "
                "the hallucinated ones.",
        paper="CapMAS (ICML 2025)", kinds=("vlm",),
        runs=(Run(caption_scene, cost._captions_scene_caption), Run(caption_image, cost._captions_image_caption),
              Run(verify_scene, cost._captions_scene_verification),
              Run(verify_caption, cost._captions_image_verification),
              Run(apply_threshold, cost._captions_rewrite)),
        cli=cli)


ANALYSIS = _declare()

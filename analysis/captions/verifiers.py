"""The verifier: p_True, p_False from the VLM's next token after a yes/no question about one claim alone.

A verifier is a small dataclass registered by stable name in `VERIFIERS`, owning its settings (the batch
size); subclasses say how a claim becomes the full prompt (`question`, image token included). Claims are
batched, but each row holds one claim only, so no claim sees another.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from analysis.model_access import anatomy
from analysis import backends
from analysis.captions.generation import answer_token_ids, vlm_inputs, vlm_prompt
from analysis.captions.world import CaptionError, grammar_claim, shapes_world
from analysis.model_access.models import ModelHandle, require_kind
from analysis.framework.registry import Method, Registry
from analysis.framework.settings import setting
from analysis.tasks import tasks_for

VERIFIERS: Registry["YesNoVerifier"] = Registry("verifier")
GENERIC_QUESTION = "Is the following statement about this image true? Answer yes or no.\nStatement: {claim}"


@dataclass
class YesNoVerifier(Method):
    """Asks the VLM `vlm` about each claim; its settings are checked without a model (`vlm` None)."""

    vlm: ModelHandle | None = None
    batch_size: int = setting(16, label="Verifier batch size", low=1, high=1024, url="batch", cli="batch-size",
                              help="Claims verified in one forward pass (each row its own claim).")
    answers: ClassVar[tuple[str, str]] = ("yes", "no")
    yes_ids: list[int] = field(default_factory=list, init=False, repr=False)
    no_ids: list[int] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vlm is not None:
            self._find_answers()

    def _find_answers(self) -> None:
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
            with anatomy.model_step(self.vlm, "verifying claims"):
                logits = backends.run(self.vlm, backends.Request(inputs=inputs, logits=0)).logits[:, -1]
            probs = logits.softmax(-1)
            p_true = probs[:, self.yes_ids].sum(-1)
            p_false = probs[:, self.no_ids].sum(-1)
            out.update({i: (float(t), float(f)) for i, t, f in zip(chunk, p_true, p_false)})
        return [out[i] for i in range(len(claims))]

    def answer_margin(self, logits: torch.Tensor) -> torch.Tensor:
        """log p_T - log p_F from next-token logits (B, V): what the grounding attributes."""
        return logits[:, self.yes_ids].logsumexp(-1) - logits[:, self.no_ids].logsumexp(-1)


@VERIFIERS.register
@dataclass
class ShapesVLMVerifier(YesNoVerifier):
    """The demo VLM's trained question format: '<s> <image> question : is there a red circle ? answer :'."""

    name: ClassVar[str] = "shapes-vlm"
    label: ClassVar[str] = "demo VLM question format (Shapes World)"

    def question(self, claim: str) -> str:
        return shapes_world().vlm_question_prompt(grammar_claim(claim))


@VERIFIERS.register
@dataclass
class ChatYesNoVerifier(YesNoVerifier):
    """Any VLM: a yes/no question about the claim, through the processor's chat template if any."""

    name: ClassVar[str] = "vlm-yesno"
    label: ClassVar[str] = "any VLM, yes/no question"

    def question(self, claim: str) -> str:
        return vlm_prompt(self.vlm, GENERIC_QUESTION.format(claim=claim))


def resolve_verifier(name: str, vlm: ModelHandle) -> str:
    """The verifier `name` stands for on `vlm` ('auto': the one its task provider names)."""
    if name != "auto" and name not in VERIFIERS:
        raise CaptionError(f"Unknown verifier '{name}' (choose one of auto, {', '.join(VERIFIERS)}).")
    require_kind(vlm, "vlm", panel="Caption correction")
    return tasks_for(vlm).verifier if name == "auto" else name


def make_verifier(name: str, vlm: ModelHandle, settings: dict | None = None) -> YesNoVerifier:
    """The verifier `name` on `vlm` with its settings, validated."""
    return VERIFIERS.create(resolve_verifier(name, vlm), **(settings or {}), vlm=vlm)

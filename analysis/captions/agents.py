"""The decomposer and the rewriter: small dataclasses registered by stable name (the names appear in URLs and
saved analyses), each owning and checking its settings (`setting(...)` fields, analysis/framework/settings.py).

- a decomposer turns a caption into atomic claims;
- a rewriter turns (caption, true claims, false claims) into a caption without the false content.

Three of each: the Shapes World grammar (the reference), the demo LM trained on the grammar's tasks, and
an instruct LM prompted through its chat template with worked examples (`lm-chat`). What a language
model writes is checked before it is used: the demo LM must read the caption's words, an instruct LM's
claims must be sentences about the caption, and its rewrite may not be longer than the caption nor say
anything the caption does not.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from analysis.captions import generation
from analysis.captions.world import CaptionError, shapes_text, shapes_world
from analysis.model_access.models import ModelHandle
from analysis.framework.registry import Method, Registry
from analysis.framework.settings import setting

DECOMPOSERS: Registry["Decomposer"] = Registry("decomposer")
REWRITERS: Registry["Rewriter"] = Registry("rewriter")
TOKENS_HIGH = 4096


def _tokens(default: int, role: str) -> int:
    """The `max_new_tokens` setting of a decomposer or rewriter (one control per role: `dec_tokens`, `rew_tokens`)."""
    short = {"decomposer": "dec", "rewriter": "rew"}[role]
    return setting(default, label=f"{role.capitalize()}: tokens to generate", low=1, high=TOKENS_HIGH,
                   url=f"{short}_tokens", cli=f"{role}-tokens",
                   help=f"The most tokens the {role}'s language model writes per call (it usually stops sooner).")


def _checked(what: str) -> bool:
    return setting(True, label="Check the rewrite", url="rew_checked", cli="rewriter-checked",
                   help=f"Refuse a rewrite that {what}, and show the fallback instead (with a note).")


@dataclass
class Agent(Method):
    """A decomposer or rewriter. `needs_lm`: it runs a language model (given as `lm`).

    `calls(...)` lists the model calls it will make, as (prompt, most tokens generated): the cost estimate
    (`analysis/captions/cost.py`) counts them before it runs. `note` says what was refused in the last run."""

    needs_lm: ClassVar[bool] = False
    lm: ModelHandle | None = None
    note: str = ""


@dataclass
class Decomposer(Agent):
    def decompose(self, caption: str) -> list[str]:
        raise NotImplementedError

    def prompt(self, caption: str) -> str | None:
        return None

    def new_tokens(self, caption: str) -> int:
        return 0

    def calls(self, caption: str) -> list[tuple[str, int]]:
        prompt = self.prompt(caption)
        return [] if prompt is None else [(prompt, self.new_tokens(caption))]


@dataclass
class Rewriter(Agent):
    def rewrite(self, caption: str, true_claims: list[str], false_claims: list[str]) -> str:
        raise NotImplementedError

    def prompt(self, caption: str, true_claims: list[str], false_claims: list[str]) -> str | None:
        return None

    def new_tokens(self, caption: str, true_claims: list[str], false_claims: list[str]) -> int:
        return 0

    def calls(self, caption: str, true_claims: list[str], false_claims: list[str]) -> list[tuple[str, int]]:
        prompt = self.prompt(caption, true_claims, false_claims)
        return [] if prompt is None else [(prompt, self.new_tokens(caption, true_claims, false_claims))]


def _answer_tokens(lm: ModelHandle, answer: str, limit: int) -> int:
    """Tokens of `answer` and the end-of-text token after it, at most `limit`: the length of an answer
    the demo LM was trained to give."""
    return min(limit, len(lm.tokenizer(answer, add_special_tokens=False)["input_ids"]) + 1)


def require_shapes_words(lm: ModelHandle, caption: str, agent: str) -> None:
    """The demo LM reads only Shapes World's words: refuse a caption with any other (it would answer noise)."""
    tok = getattr(lm, "tokenizer", None)
    unk = getattr(tok, "unk_token_id", None)
    if unk is None:  # no model (its answers are given) or a vocabulary without an unknown word
        return
    unknown = [w for w in dict.fromkeys(shapes_text(caption).split())
               if unk in tok(w, add_special_tokens=False)["input_ids"]]
    if unknown:
        raise CaptionError(
            f"The {agent} agent ({lm.spec.label}) reads only Shapes World captions, and this one has words "
            f"it does not know ({', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}). Choose the "
            "instruct-LM agents (lm-chat) with an instruct model, or a Shapes World caption.")


# --- the Shapes World grammar and the demo LM ---------------------------------------------------


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
    max_new_tokens: int = _tokens(160, "decomposer")

    def decompose(self, caption: str) -> list[str]:
        require_shapes_words(self.lm, caption, self.name)
        text = generation.generate_text(self.lm, self.prompt(caption), self.max_new_tokens, add_special_tokens=False)
        return list(dict.fromkeys(c.strip() for c in shapes_text(text).split(";") if c.strip()))

    def prompt(self, caption: str) -> str:
        return f"<s> decompose : {shapes_text(caption)} ="

    def new_tokens(self, caption: str) -> int:
        # trained to answer the grammar's claims joined by ' ; ' (100 % exact on held-out captions)
        claims = GrammarDecomposer().decompose(caption)
        return _answer_tokens(self.lm, " ; ".join(claims), self.max_new_tokens) if claims else self.max_new_tokens


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
    max_new_tokens: int = _tokens(120, "rewriter")
    # parse the LM's rewrite; if it states a claim that was not kept, use the grammar's
    checked: bool = _checked("states a claim that was not kept")

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
        require_shapes_words(self.lm, caption, self.name)
        prompt = self.prompt(caption, true_claims, false_claims)
        text = shapes_text(generation.generate_text(self.lm, prompt, self.max_new_tokens, add_special_tokens=False))
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


# --- an instruct LM through its chat template ---------------------------------------------------
# A small instruct model (SmolLM2-135M-Instruct) asked in one instruction copies the caption back as its
# only "claim"; shown worked examples as earlier turns of the conversation, and with its answer already
# begun as a list, it writes short sentences about the caption (benchmarks/captions_instruct.py measures
# how many). One call per sentence of the caption keeps each answer short and on its sentence.

DECOMPOSE_SYSTEM = ("You list the facts that an image caption states. Write each fact as one short sentence on "
                    "its own line, starting with '- '. Use only what the caption says; add nothing.")
DECOMPOSE_EXAMPLES = (
    ("A black cat sleeps on a red sofa next to a window.",
     "- There is a black cat.\n- The cat sleeps on a sofa.\n- The sofa is red.\n- The sofa is next to a window."),
    ("A man in a blue jacket walks two dogs in a snowy park.",
     "- There is a man.\n- The man wears a blue jacket.\n- The man walks two dogs.\n- The park is snowy."),
    ("Two boats float on a calm lake. A small house stands on the shore.",
     "- There are two boats.\n- The boats float on a lake.\n- The lake is calm.\n- There is a small house.\n"
     "- The house stands on the shore."),
)
LIST_START = "- "  # the assistant's answer starts here, so the model continues a list
REWRITE_SYSTEM = ("You correct image captions. Remove every false fact from the caption and keep the rest of "
                  "its words. Never add anything. Reply with the corrected caption only.")
REWRITE_EXAMPLES = (
    ("A black cat sleeps on a red sofa next to a window.", ["The sofa is red."],
     "A black cat sleeps on a sofa next to a window."),
    ("A man in a blue jacket walks two dogs in a snowy park.", ["The man walks two dogs."],
     "A man in a blue jacket walks in a snowy park."),
    ("Two boats float on a calm lake. A small house stands on the shore.", ["There is a small house."],
     "Two boats float on a calm lake."),
)
LIGHT_WORDS = {"wear", "wears", "wearing", "have", "has"}  # relations a claim may name that a caption implies
STOP_WORDS = set(
    "a an the is are was were be been being am of in on at to for with by from and or but as it its this that "
    "these those there here they them their he she his her him we you i one two three four five some several "
    "many into onto over under above below near beside next while where who which what than then also very "
    "not no".split())


def sentences(text: str) -> list[str]:
    """The caption's sentences (split after '.', '!' or '?')."""
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s.strip()]


def content_words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z]+", text.lower()) if w not in STOP_WORDS and len(w) > 1]


def _stem(word: str) -> str:
    for suffix in ("ing", "es", "ed", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def same_word(a: str, b: str) -> bool:
    """'runs' ~ 'running' ~ 'run': equal after a plain suffix, or one a prefix of the other (3+ letters)."""
    a, b = _stem(a), _stem(b)
    return a == b or (min(len(a), len(b)) >= 3 and (a.startswith(b) or b.startswith(a)))


def is_sentence(line: str) -> bool:
    """Three or more words, mostly letters, no code and no heading (a line ending with ':')."""
    line = line.strip()
    if len(line.split()) < 3 or "`" in line or line.endswith(":"):
        return False
    return sum(ch.isalpha() for ch in line) >= 0.6 * len(line.replace(" ", ""))


def about_caption(claim: str, caption: str) -> bool:
    """Every content word of the claim (but a few light relations: 'wears', 'has') is a word of the caption."""
    words = [w for w in content_words(claim) if w not in LIGHT_WORDS]
    known = content_words(caption)
    return bool(words) and all(any(same_word(w, k) for k in known) for w in words)


def parse_claim_lines(text: str) -> list[str]:
    """Claims from a one-per-line answer, without bullets or numbering; duplicates dropped."""
    claims: list[str] = []
    for line in text.splitlines():
        line = re.sub(r"^(?:\s*(?:[-*\u2022]|\d+[.)]))+\s*", "", line).strip()
        if line and line not in claims:
            claims.append(line)
    return claims


def says_nothing(claim: str) -> bool:
    """'The laptop is a laptop.': what follows 'is'/'are' only repeats the subject's words."""
    parts = re.split(r"\b(?:is|are)\b", claim.lower(), maxsplit=1)
    if len(parts) < 2:
        return False
    subject, rest = set(content_words(parts[0])), content_words(parts[1])
    return bool(subject) and all(any(same_word(w, s) for s in subject) for w in rest)


def _plain(text: str) -> str:
    """Lower-case words without articles ('An old man.' -> 'old man')."""
    return " ".join(w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in ("a", "an", "the"))


def copies(line: str, caption: str, short: int = 5) -> bool:
    """The line repeats the caption or one of its sentences of more than `short` words (it splits nothing)."""
    return any(_plain(line) == _plain(s) and len(s.split()) > short for s in [caption, *sentences(caption)])


def claims_about(lines: list[str], caption: str) -> tuple[list[str], list[str]]:
    """(claims, refused): the lines that are one sentence about the caption, no longer than it, not a copy of
    it and saying something; and the rest."""
    kept, refused = [], []
    for line in lines:
        ok = (is_sentence(line) and len(sentences(line)) == 1 and about_caption(line, caption)
              and len(line.split()) <= len(caption.split()) and not copies(line, caption) and not says_nothing(line))
        (kept if ok else refused).append(line)
    return kept, refused


def _shown(items: list[str], n: int = 3) -> str:
    return "; ".join(f"“{i}”" for i in items[:n]) + (" ..." if len(items) > n else "")


@DECOMPOSERS.register
@dataclass
class ChatDecomposer(Decomposer):
    """An instruct LM through its chat template: worked examples, one call per sentence of the caption; lines
    that are not sentences about the caption are refused (and named in `note`)."""

    name: ClassVar[str] = "lm-chat"
    label: ClassVar[str] = "instruct LM, chat prompt"
    needs_lm: ClassVar[bool] = True
    max_new_tokens: int = _tokens(80, "decomposer")

    def decompose(self, caption: str) -> list[str]:
        lines: list[str] = []
        for prompt, tokens in self.calls(caption):
            answer = generation.generate_text(self.lm, prompt, tokens, add_special_tokens=False)
            lines += [line for line in parse_claim_lines(LIST_START + answer) if line not in lines]
        claims, refused = claims_about(lines, caption)
        self.note = (f"The {self.name} decomposer also wrote {len(refused)} line(s) that are not short sentences "
                     f"about the caption, left out: {_shown(refused)}." if refused else "")
        return claims

    def sentence_prompt(self, sentence: str) -> str:
        messages = [{"role": "system", "content": DECOMPOSE_SYSTEM}]
        for example, answer in DECOMPOSE_EXAMPLES:
            messages += [{"role": "user", "content": f"Caption: {example}"}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": f"Caption: {sentence}"})
        return generation.chat_prompt(self.lm, messages) + LIST_START

    def prompt(self, caption: str) -> str:
        """The first call's prompt (the whole caption's, when it is one sentence)."""
        return self.sentence_prompt(sentences(caption)[0] if sentences(caption) else caption)

    def new_tokens(self, caption: str) -> int:
        return self.max_new_tokens  # an instruct model's answer length is not known before it runs

    def calls(self, caption: str) -> list[tuple[str, int]]:
        return [(self.sentence_prompt(s), self.max_new_tokens) for s in sentences(caption)]


@REWRITERS.register
@dataclass
class ChatRewriter(Rewriter):
    """An instruct LM through its chat template, with worked examples. Checked: a rewrite that is empty,
    longer than the caption or has words the caption does not is refused, and the kept claims, joined,
    are the corrected caption instead (they say only what the verifier confirmed)."""

    name: ClassVar[str] = "lm-chat"
    label: ClassVar[str] = "instruct LM, chat prompt, checked"
    needs_lm: ClassVar[bool] = True
    max_new_tokens: int = _tokens(120, "rewriter")
    checked: bool = _checked("is empty, longer than the caption or says what the caption does not")

    def rewrite(self, caption: str, true_claims: list[str], false_claims: list[str]) -> str:
        self.note = ""
        if not false_claims:
            return caption
        if not true_claims:  # nothing is left to write: no rewrite (a model asked anyway writes something)
            self.note = "Every claim was dropped, so there is no corrected caption (the rewriter was not run)."
            return ""
        text = " ".join(generation.generate_text(self.lm, self.prompt(caption, true_claims, false_claims),
                                                 self.max_new_tokens, add_special_tokens=False).split())
        problem = self.problem(text, caption) if self.checked else ""
        if problem:
            self.note = (f"The {self.name} rewrite ({text!r}) {problem}, so the kept claims, joined, are shown "
                         "instead.")
            return " ".join(c if c.rstrip().endswith((".", "!", "?")) else c + "." for c in true_claims)
        return text

    @staticmethod
    def problem(text: str, caption: str) -> str:
        """Why a rewrite cannot be used ('' when it can)."""
        if not text:
            return "is empty"
        if len(text.split()) > len(caption.split()):
            return "is longer than the caption"
        if not about_caption(text, caption):
            return "has words the caption does not"
        return ""

    def prompt(self, caption: str, true_claims: list[str], false_claims: list[str]) -> str | None:
        if not false_claims or not true_claims:
            return None
        messages = [{"role": "system", "content": REWRITE_SYSTEM}]
        for example, false, answer in REWRITE_EXAMPLES:
            messages += [{"role": "user", "content": rewrite_request(example, false)},
                         {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": rewrite_request(caption, false_claims)})
        return generation.chat_prompt(self.lm, messages)

    def new_tokens(self, caption: str, true_claims: list[str], false_claims: list[str]) -> int:
        return self.max_new_tokens if false_claims and true_claims else 0


def rewrite_request(caption: str, false_claims: list[str]) -> str:
    return f"Caption: {caption}\nFalse facts:\n" + "\n".join(f"- {c}" for c in false_claims)


# --- choosing agents ----------------------------------------------------------------------------


def default_agent(lm: ModelHandle | None) -> str:
    """Decomposer/rewriter used for 'auto': the demo LM, else an instruct LM, else the grammar."""
    if lm is not None and lm.kind == "causal_lm" and generation.speaks_shapes_world(lm):
        return "shapes-lm"
    if lm is not None and getattr(lm.tokenizer, "chat_template", None):
        return "lm-chat"
    return "grammar"


def resolve_agent(kind: str, name: str, lm: ModelHandle | None) -> str:
    """The agent `name` stands for ('auto': `default_agent(lm)`); CaptionError for an unknown name."""
    registry = {"decomposer": DECOMPOSERS, "rewriter": REWRITERS}[kind]
    if name == "auto":
        name = default_agent(lm)
    if name not in registry:
        raise CaptionError(f"Unknown {kind} '{name}' (choose one of auto, {', '.join(registry)}).")
    return name


def make_agent(kind: str, name: str, lm: ModelHandle | None, settings: dict | None = None):
    """The decomposer or rewriter `name` on model `lm`, with its settings (`{setting: value}`), validated."""
    registry = {"decomposer": DECOMPOSERS, "rewriter": REWRITERS}[kind]
    name = resolve_agent(kind, name, lm)
    if registry.get(name).needs_lm and lm is None:
        raise CaptionError(f"The '{name}' agent needs a language model; none was given.")
    return registry.create(name, **(settings or {}), lm=lm)

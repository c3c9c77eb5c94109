"""The settings of one caption correction: the pipeline's own, and each agent's, by agent name.

An agent owns its settings (its `setting(...)` fields in agents.py, verifiers.py, score.py); the params
hold them per role as `{agent name: {setting: value}}` (`decomposers`, `verifiers`, `rewriters`, `forms`),
never a flat copy. A link and the command line carry each setting once (`?dec_tokens=60`,
`--decomposer-tokens 60`): `agent_settings(role, **flat)` gives it to every agent of that role that
declares it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property

from analysis.captions.agents import DECOMPOSERS, REWRITERS
from analysis.captions.generation import CAPTION_TOKENS
from analysis.captions.score import DEFAULT_EPS, DEFAULT_PI, DEFAULT_PROBABILITIES, PROBABILITY_FORMS
from analysis.captions.verifiers import VERIFIERS
from analysis.framework.errors import SettingsError
from analysis.framework.registry import Registry, check_range
from analysis.framework.results import Result
from analysis.framework.settings import Flat, check_settings, labelled, setting

CAPTION_CHARS = 20_000
ROLES: dict[str, Registry] = {"decomposer": DECOMPOSERS, "verifier": VERIFIERS, "rewriter": REWRITERS,
                              "probabilities": PROBABILITY_FORMS}
SETTINGS_FIELD = {"decomposer": "decomposers", "verifier": "verifiers", "rewriter": "rewriters",
                  "probabilities": "forms"}


def agent_settings(role: str, **flat) -> dict[str, dict]:
    """{agent name: its settings} of one role from settings named by field (`max_new_tokens=60`): each goes
    to every agent of the role that declares a field of that name; names no such agent declares are refused."""
    return ROLES[role].split_settings(**flat)


def _agent_choice(role: str, url: str, help_text: str):
    registry = ROLES[role]
    return setting("auto", label=role.capitalize(), choices=lambda: ["auto", *registry], url=url, help=help_text,
                   labels=lambda name: "auto" if name == "auto" else registry.label(name), group="agents",
                   width=200)  # the longest agent label whole


@dataclass
class CorrectionParams(Flat, Result):
    """Page groups: `caption` (drawn when a caption is pasted), `agents`, `threshold`, `ground`; each agent's
    own settings are drawn for the agent a role resolves to (components/views/captions.py)."""

    METHODS = (("decomposers", DECOMPOSERS), ("verifiers", VERIFIERS), ("rewriters", REWRITERS),
               ("forms", PROBABILITY_FORMS))

    caption: str = setting("", label="Caption to check", high=CAPTION_CHARS, url="text", cli="caption",
                           widget="area", group="caption",
                           help="The caption to verify (default on the command line: the VLM's own).")
    pi: float = setting(DEFAULT_PI, label="The threshold π", low=0, url="pi", cli="pi", group="threshold",
                        help="Drop a claim when its hallucination score H(u) > π (nats).")
    eps: float = setting(DEFAULT_EPS, label="ε", low=1e-12, high=0.5, url=None, cli="eps",
                         help="Floor of p_T − p_F in H = −log max(p_T − p_F, ε).")
    decomposer: str = _agent_choice("decomposer", "dec", "Splits the caption into claims.")
    verifier: str = _agent_choice("verifier", "ver", "Asks the loaded VLM about each claim alone.")
    rewriter: str = _agent_choice("rewriter", "rew", "Writes the caption without the dropped claims.")
    ground: bool = setting(True, label="Ground each answer in the image (Captum Integrated Gradients)",
                           url="ground", cli=None, group="ground",
                           help="Integrated Gradients costs about 8 forward/backward passes per claim.")
    ig_steps: int = setting(8, label="Integrated Gradients steps", low=1, high=512, url=None, cli="ig-steps",
                            help="Integrated Gradients steps per claim.")
    scene_seed: int | None = None  # a Shapes World scene: enables ground truth (checked in validate)
    probabilities: str = setting(DEFAULT_PROBABILITIES, label="p_True/p_False form", choices=PROBABILITY_FORMS.names,
                                 url="prob", cli="probabilities", labels=PROBABILITY_FORMS.label, widget="radio",
                                 group="threshold", width=220,
                                 help="How H reads p_T and p_F: raw (the paper) or renormalised p_T/(p_T+p_F).")
    decomposers: dict[str, dict] = field(default_factory=dict)  # agent name -> its settings (defaults when absent)
    verifiers: dict[str, dict] = field(default_factory=dict)
    rewriters: dict[str, dict] = field(default_factory=dict)
    forms: dict[str, dict] = field(default_factory=dict)  # probability form name -> its settings

    def validate(self) -> None:
        """Every setting in range, or SettingsError with a message for the user (CLI, URL and page): the
        pipeline's fields from their descriptions, then each agent's settings by the agent's own class."""
        check_settings(self)
        if self.scene_seed is not None:
            check_range("The scene seed", self.scene_seed, low=0, integer=True)
        for role, registry in ROLES.items():
            for name, values in self.settings_of(role).items():
                cls = registry.get(name)  # an unknown name: UnknownMethod
                unknown = set(values) - {f.name for f in labelled(cls)}
                if unknown:
                    raise SettingsError(f"{registry.label(name)} has no setting(s) {', '.join(sorted(unknown))}.")
                registry.create(name, **values)  # the class checks its own settings

    def settings_of(self, role: str) -> dict[str, dict]:
        """{agent name: its settings} of one role ('decomposer', 'verifier', 'rewriter', 'probabilities')."""
        return getattr(self, SETTINGS_FIELD[role])

    def agent(self, role: str, name: str) -> dict:
        """The settings of agent `name` in `role` (empty: its defaults)."""
        return dict(self.settings_of(role).get(name, {}))


def verification_params(params: CorrectionParams) -> CorrectionParams:
    """The settings verification depends on: pi, the probability form and the rewriter's settings only
    re-score or re-write its p_T, p_F."""
    return CorrectionParams(**{**vars(params), "pi": DEFAULT_PI, "probabilities": DEFAULT_PROBABILITIES,
                               "forms": {}, "rewriters": {}})


@dataclass
class CaptionParams(Result):
    """Caption an image with the VLM."""

    max_new_tokens: int = setting(CAPTION_TOKENS, label="Tokens to generate", low=1, high=4096, url=None, cli=None)

    def validate(self) -> None:
        check_settings(self)


@dataclass
class SceneCaptionParams(CaptionParams):
    """Caption one Shapes World scene (so a generated caption is keyed, shared and shipped by its seed)."""

    scene_seed: int = setting(0, label="The scene seed", low=0, url=None, cli=None)


SHAPES_LM = "zoo:shapes-lm"
OWN_LM = "the VLM's own language model"


@dataclass
class CaptionState:
    """The caption page's own controls: which image (a scene by seed, or an upload), where the caption
    comes from, and which model the decomposer and rewriter run on."""

    source: str = setting("scene", label="Image", choices=["scene", "upload"], url="src", widget="radio",
                          labels={"scene": "Shapes World scene", "upload": "Upload an image"})
    seed: int = setting(0, label="Scene seed (test split starts at 20,000,000)", low=0, high=2**31 - 1,
                        width="stretch")
    cap: str = setting("vlm", label="Caption", choices=["vlm", "weak", "paste"], widget="radio")
    lm: str = setting(OWN_LM, label="Decomposer/rewriter model", choices=[SHAPES_LM, OWN_LM],
                      width=200)


class Upload:
    """An uploaded image's bytes, decoded once (analysis/framework/images.py). Its repr names its SHA-256, so a run
    given it is keyed, and shared between sessions, by the bytes (components/runs.py)."""

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)
        self.sha256 = hashlib.sha256(self.data).hexdigest()

    @cached_property
    def image(self):
        from analysis.framework.images import open_image

        return open_image(self.data)

    def __repr__(self) -> str:
        return f"Upload(sha256={self.sha256[:32]}, {len(self.data)} bytes)"

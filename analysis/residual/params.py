"""The settings of the residual-stream panel: one dataclass, every labelled field validated from its
description (analysis/framework/settings.py), so the page, a link and the command line check them the same way."""
from __future__ import annotations

from dataclasses import dataclass, field

from analysis.framework.registry import SettingsError
from analysis.residual.errors import ResidualError
from analysis.residual.lenses import LENSES
from analysis.residual.pairs import OWN, all_names
from analysis.residual.patching import COMPONENTS, METHODS
from analysis.residual import atp as _atp  # noqa: F401  (registers the query/key components and AtP*)
from analysis.framework.results import Result
from analysis.framework.settings import MAX_WHOLE, check_settings, setting

SIDES = ["corrupt", "model"]
SIDE_LABELS = {"corrupt": "corrupted prompt", "model": "other model"}
SECTIONS = {"lens": "Lens & logit attribution", "patching": "Activation patching", "side": "Side by side",
            "pairs": "All offered pairs", "generate": "Generate & commit"}
DECODING = {"greedy": "greedy", "sample": "sampled (seeded)"}
COMMITS = {"first": "first top-1", "stays": "top-1 from there on"}
MAX_NEW_TOKENS = 64
COLOURS = {"target_prob": "P(target)", "kl": "KL to the final layer", "top_prob": "P(top token)"}


def _pair_choices() -> list[str]:
    return ["", *all_names()]


@dataclass
class ResidualParams(Result):
    pair: str = setting("", label="Prompt pair", choices=_pair_choices, widget="select", group="pair", span=5,
                        help="A clean prompt and a corrupted one with known answers (empty: the first offered "
                             "for this model); 'own' uses the two prompts typed below.")
    lens: str = setting("logit", label="Lens", choices=LENSES.names, labels=LENSES.label, widget="pills",
                        group="pair", span=3)
    prompt: str = setting("", label="Clean prompt (own pair)", high=4_000, widget="area", group="own",
                          help="The prompt the lens reads and whose activations are patched in.")
    corrupt: str = setting("", label="Corrupted prompt (own pair)", high=4_000, widget="area", group="own",
                           help="Same number of tokens as the clean prompt; the run that gets patched.")
    answer: str = setting("", label="Target token", high=200, group="tokens",
                          help="Scored token of the clean answer (empty: the pair's answer, or the model's "
                               "top prediction on the clean prompt).")
    foil: str = setting("", label="Foil token", high=200, group="tokens",
                        help="The corrupted answer (empty: the pair's, or the model's top prediction on the "
                             "corrupted prompt). The metric is logit(target) - logit(foil).")
    top_k: int = setting(5, label="Top tokens per cell", low=1, high=10, group="tokens")
    components: list[str] = setting(label="Patched components", item=str, choices=COMPONENTS.names,
                                    labels=COMPONENTS.label, min_items=1, group="patching", width=540,
                                    default_factory=lambda: ["residual", "heads", "mlp"],
                                    help="Residual stream at every (layer, position); each head's output; "
                                         "each layer's attention or MLP output; each head's queries or keys "
                                         "(every position).")
    methods: list[str] = setting(label="Patching methods", item=str, choices=METHODS.names, labels=METHODS.label,
                                 min_items=1, group="patching", width=420, default_factory=lambda: ["exact", "attribution"],
                                 help="Exact: one forward per cell. Attribution: a gradient estimate of "
                                      "every cell from 2 forwards and 1 backward. AtP*: attribution with the "
                                      "QK fix and GradDrop (Kramár et al. 2024), one more forward and backward "
                                      "of one row per layer.")
    side: str = setting("corrupt", label="Side by side", choices=SIDES, labels=SIDE_LABELS, widget="pills",
                        group="side", width=300, help="Beside the clean prompt: the corrupted prompt on this model, or the "
                                           "clean prompt on another model.")
    other_model: str = setting("", label="Other model", high=300, cli="other-model", group="side", width=260,
                               help="zoo:NAME, hub:ID or local:PATH; its tokenizer must match this model's.")
    new_tokens: int = setting(16, label="Tokens to generate", low=1, high=MAX_NEW_TOKENS, group="generate",
                              cli="new-tokens", width=160,
                              help="Generate & commit: the continuation of the clean prompt, up to this many tokens "
                                   "(fewer if the model ends it).")
    decoding: str = setting("greedy", label="Decoding", choices=list(DECODING), labels=DECODING, widget="pills",
                            group="generate", width=260,
                            help="Greedy: the model's top token each step. Sampled: from the model's distribution "
                                 "at the temperature below, with the seed (the same seed gives the same text).")
    seed: int = setting(0, label="Seed", low=0, high=2**31 - 1, group="generate", width=140)
    temperature: float = setting(1.0, label="Temperature", low=0.05, high=2.0, step=0.05, group="generate",
                                 width=140, help="Sampled decoding only.")
    batch: int = field(default=32)  # patched rows per forward


@dataclass
class ResidualState:
    """The page's own controls: which section it shows and how the lens grid is coloured (never passed to
    the analysis)."""

    view: str = setting("lens", label="View", choices=list(SECTIONS), labels=SECTIONS, widget="radio",
                        help="Each section runs its own analysis; the lens opens at once, patching takes one "
                             "forward per cell.")
    colour: str = setting("target_prob", label="Colour", choices=list(COLOURS), labels=COLOURS, widget="radio",
                          help="What the lens grid's colour shows.")
    commit: str = setting("first", label="Commitment layer", choices=list(COMMITS), labels=COMMITS, widget="radio",
                          help="First top-1: the first state at which the lens has the generated token on top. "
                               "Top-1 from there on: the first state from which it stays on top through the output.")
    branch_at: int = setting(-1, label="Branch at generated token", low=-1, high=MAX_NEW_TOKENS - 1,
                             help="Generate & commit: the generated token where another of the model's top tokens "
                                  "is taken (-1: no branch).")
    branch_token: int = setting(-1, label="Take instead", low=-1, high=MAX_WHOLE,
                                help="The token id the branch takes there; the text is regenerated from it with the "
                                     "same decoding.")


def validate_params(params: ResidualParams) -> None:
    """One validation path for the CLI, the URL and the page: SettingsError / ResidualError, one line."""
    check_settings(params)
    if params.pair == OWN and not (params.prompt.strip() and params.corrupt.strip()):
        raise ResidualError("An own pair needs both a clean and a corrupted prompt.")
    if not isinstance(params.batch, int) or not 1 <= params.batch <= 4096:
        raise SettingsError(f"batch must be a whole number in 1..4096, got {params.batch!r}.")
    for name in params.components:
        COMPONENTS.get(name)
    for name in params.methods:
        METHODS.get(name)

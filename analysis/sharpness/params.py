"""The settings of one size sweep; every labelled field is validated from its description
(analysis/framework/settings.py), so the page, the link and the command line check them the same way.

The temperature rules own their settings (`rules.py`); `SweepParams.rules` holds them as
`{rule name: {setting: value}}` (the adaptive rule's; the fixed θs of the sweep are `thetas`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from analysis.framework.results import Result
from analysis.framework.settings import Flat, check_settings, like, setting
from analysis.sharpness.errors import SharpnessError
from analysis.sharpness.lemma import LemmaParams
from analysis.sharpness.prompt import PromptParams
from analysis.sharpness.rules import RULES, Temperature

DEFAULT_NS = (4, 8, 16, 32, 64, 128)
DEFAULT_THETAS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0)
# A model above analysis.framework.cost.LARGE_MODEL parameters (a real LM) starts from fewer, shorter prompts: the sizes
# a small instruct LM still answers, and few enough forwards to open without asking.
LARGE_MODEL_NS = (2, 4, 8, 16)
LARGE_MODEL_SAMPLES = 4
LARGE_MODEL_THETAS = (0.5, 1.0, 2.0)  # softmax, adaptive θ and two fixed θ: 4 rules instead of 7


N_CHOICES = [2, 4, 8, 16, 32, 64, 128, 256, 512]  # the item counts the page offers (the CLI takes any)
THETA_CHOICES = ["0.125", "0.25", "0.5", "1", "2", "4", "adaptive"]


@dataclass
class SweepParams(Flat, Result):
    """Page groups: `lists` (the item counts, beside the view state's layers), `row` (with the rules')."""

    METHODS = (("rules", RULES),)  # the adaptive rule's threshold travels flat: ?min_entropy=0.5

    # pills, not a multiselect: every choice a one-click toggle, wrapped (a multiselect's chips scrolled
    # sideways and hid 64 and 128 at 1024 px)
    ns: list[int] = setting(label="Item counts n", item=int, low=2, high=100_000, min_items=1, cli="n",
                            default_factory=lambda: list(DEFAULT_NS), widget="pills",
                            offer=N_CHOICES, group="lists",
                            help="How many items each retrieval prompt lists (comma-separated on the command line).")
    thetas: list[float] = setting(label="Fixed temperatures θ", item=float, low=1e-6, high=1e6, url=None,
                                  default_factory=lambda: list(DEFAULT_THETAS),
                                  help="Every head runs at each of these θ in turn (θ = 1 is softmax itself).")
    samples: int = setting(32, label="Prompts per n", low=1, high=10_000, group="row", width=120,
                           help="Prompts per item count; every rule sees the same prompts.")
    seed: int = setting(0, label="Seed", low=0, high=2**31 - 1, url=None,
                        help="The prompts of each n use seeds seed, seed + 1, ...")
    batch: int = 64  # prompts of one length per forward
    layers: list[int] | None = None  # layers the temperatures apply in (None: every layer)
    rules: dict[str, dict] = field(default_factory=dict)  # rule name -> its settings (defaults when absent)

    def temperatures(self) -> list[Temperature]:
        """The rules of the sweep, in order: softmax, the adaptive rule, then each fixed θ ≠ 1."""
        only = tuple(self.layers) if self.layers is not None else None
        return [Temperature(), Temperature("adaptive", self.rules.get("adaptive", {}), only)] + [
            Temperature.fixed(t, only) for t in self.thetas if t != 1.0]


@dataclass
class SharpnessState:
    """The sharpness page's own controls: the layers the temperature applies in (SweepParams.layers: all of
    them is None), the rule and token counting its views use, the head they show, the lemma's spread and
    the user's own prompt (described once, by LemmaParams and PromptParams)."""

    tlayers: list[int] = setting(label="Apply the temperature in layers", item=int, allow_empty=True,
                                 widget="pills", group="lists", default_factory=list,
                                 help="θ and adaptive θ act in these layers only; the others keep plain "
                                      "softmax. The paper applies it everywhere.")
    theta: str = setting("adaptive", label="Temperature θ", choices=THETA_CHOICES, widget="slider", group="row",
                         width=220, help="θ < 1 sharpens, θ > 1 flattens; 'adaptive' is the paper's rule.")
    sink: bool = setting(True, label="Count first token", group="row",
                         help="Off: drop the first (attention-sink) token and renormalise before measuring.")
    layer: int = setting(0, label="Layer", low=0, high=10_000, width=90)
    head: int = setting(0, label="Head", low=0, high=10_000, width=90)
    spread: float = like(LemmaParams, "spread", group="lemma")
    text: str = like(PromptParams, "text", group="prompt")
    target: str = like(PromptParams, "target", group="prompt")
    n_view: int = setting(128, label="n for the views below", low=2, high=100_000)


def default_params(handle) -> SweepParams:
    """The page's first view of this model (what `scripts/warm.py` precomputes for the zoo)."""
    from analysis.framework.cost import default_for

    return SweepParams(ns=list(default_for(handle, DEFAULT_NS, LARGE_MODEL_NS)),
                       thetas=list(default_for(handle, DEFAULT_THETAS, LARGE_MODEL_THETAS)),
                       samples=default_for(handle, SweepParams.samples, LARGE_MODEL_SAMPLES))


def validate_params(params: SweepParams, layers: int | None = None) -> None:
    """One validation path for the CLI, the URL and the page: SharpnessError / SettingsError, one line.
    With the model's `layers`, the temperature layers are checked against it."""
    check_settings(params)
    for layer in params.layers or []:
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise SharpnessError(f"Each layer in --layers must be a whole number of at least 0, got {layer!r}.")
    if layers is not None and params.layers is not None and not set(params.layers) <= set(range(layers)):
        raise SharpnessError(f"The model has layers 0-{layers - 1}; cannot apply a temperature in {list(params.layers)}.")
    for name in params.rules:
        RULES.get(name)  # an unknown name: UnknownMethod
    params.temperatures()  # each rule validates its own settings

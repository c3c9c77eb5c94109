"""The settings of one reconstruction: the attack's own, and each defence's and proposal order's, by name.

A defence or an order owns its settings (its dataclass fields in `defences.py` / `orders.py`);
`AttackParams.methods` holds them as `{method name: {setting: value}}`, never a flat copy. A link and the
command line carry each setting once, under the field's URL name or flag (`?noise=0.3`, `--noise 0.3`,
`--gradient-steps 4`): `method_settings` gives it to every method that declares it (the hybrid and the
gradient order share their step count). Saved analyses of the older flat layout (`noise`, `bits`,
`gradient_steps` beside the attack's settings) are read by `AttackParams.from_dict`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from analysis.framework.errors import SettingsError
from analysis.inversion.defences import DEFENCES, NO_DEFENCE, Defence, defence_label, defence_names
from analysis.inversion.orders import ORDERS, Order
from analysis.inversion.shardings import SHARDINGS
from analysis.framework.registry import Registry
from analysis.framework.results import Result
from analysis.framework.settings import Flat, check_settings, labelled, like, setting, url_name

MAX_TOKENS = 64
FAMILIES: tuple[Registry, ...] = (DEFENCES, ORDERS)  # the method families whose settings AttackParams carries


class InversionError(SettingsError):
    """Bad input for an inversion run; the message is meant for the user (one line)."""


def method_settings(**flat) -> dict[str, dict]:
    """{method name: its settings} from settings named by field (`sigma=0.3, steps=4`): each goes to every
    defence and order that declares a field of that name; names no method declares are refused."""
    unknown = set(flat) - {f.name for f, _ in method_fields()}
    if unknown:
        raise SettingsError(f"No defence or proposal order has the setting(s) {', '.join(sorted(unknown))}.")
    out: dict[str, dict] = {}
    for family in FAMILIES:
        declared = {f.name for f, _ in family.settings()}
        out.update(family.split_settings(**{k: v for k, v in flat.items() if k in declared}))
    return out


def users_of(setting_name: str) -> list[str]:
    """The defences and orders that declare a setting of this field name (whose choice makes it matter)."""
    return [name for family in FAMILIES for name, cls in family.items()
            if setting_name in {f.name for f in labelled(cls)}]


def method_fields() -> list[tuple]:
    """(field, class) of every labelled setting of a defence or an order, each field name once."""
    return [pair for family in FAMILIES for pair in family.settings()]


@dataclass
class AttackParams(Flat, Result):
    """Everything one reconstruction needs; every labelled field is validated from its description. Page
    groups: `prompt`, `row` (with the view state's defences), `order`, `methods` (each defence's and
    order's settings)."""

    METHODS = (("methods", DEFENCES), ("methods", ORDERS))  # their settings travel flat: ?noise=0.3

    prompt: str = setting("", label="Prompt (the secret the attacker tries to recover)", high=2000, cli=None,
                          group="prompt")
    layer: int = setting(1, label="Layer", low=0, high=1_000, group="row", width=130,
                         help="0 = token embeddings; k = residual stream after decoder block k.")
    defences: list[str] = field(default_factory=list)  # names from DEFENCES, applied in order
    # as wide as "model + embedding proposals, then gradient inversion"
    order: str = setting("hybrid", label="Proposal order", choices=ORDERS.names, labels=ORDERS.label, group="order",
                         width=440,
                         help="Which candidates are tried first. Every order ends with the rest of the vocabulary, "
                              "and the distance check decides, so the order changes only the cost.")
    methods: dict[str, dict] = field(default_factory=dict)  # defence or order name -> its settings (defaults when absent)
    exhaustive: bool = False  # score the whole vocabulary at every position (the baseline)
    positions: int = setting(0, label="Positions", low=0, high=MAX_TOKENS, url=None,
                             help="Attack only the first N positions (0 = all).")
    seed: int = setting(0, label="Defence seed", low=0, high=2**31 - 1, group="row", width=140,
                        help="Seeds the permutations and the noise.")
    max_tokens: int = setting(MAX_TOKENS, label="Token limit", low=1, url=None, cli=None)
    first_batch: int = setting(16, label="First batch", low=1, url=None, cli=None,
                               help="Candidates in the first batch; later batches grow 4x up to the largest.")
    max_batch: int = setting(1024, label="Largest batch", low=1, url=None, cli=None)

    @classmethod
    def from_dict(cls, data: dict) -> "AttackParams":
        """Also reads saved analyses of the flat layout (`noise`, `bits`, `gradient_steps` beside the rest)."""
        data, flat = dict(data), {}
        own = {f.name for f in dataclasses.fields(cls)}
        for f, _ in method_fields():
            for key in (f.name, url_name(f)):
                if key and key not in own and key in data:
                    flat[f.name] = data.pop(key)
        if flat:
            nested = method_settings(**flat)
            for name, values in (data.get("methods") or {}).items():
                nested.setdefault(name, {}).update(values)
            data["methods"] = nested
        return super().from_dict(data)

    def validate(self) -> None:
        """The one validation path of the CLI, the page and shared URLs (raises SettingsError)."""
        validate_params(self)


def make_defence(params: AttackParams, name: str) -> Defence:
    return DEFENCES.create(name, **params.methods.get(name, {}))


def make_order(params: AttackParams) -> Order:
    """The params' proposal order with its settings, validated."""
    return ORDERS.create(params.order, **params.methods.get(params.order, {}))


def build_defences(params: AttackParams) -> list[Defence]:
    """The params' defences, in order, each validated ("none" entries skipped)."""
    return [make_defence(params, name) for name in params.defences if name not in ("", NO_DEFENCE)]


def validate_params(params: AttackParams) -> None:
    """Every setting from its field, the methods' names and settings, then every defence (selected or
    not, so an out-of-range value is reported at once) and the chosen order, each checking its own."""
    check_settings(params)
    if params.max_batch < params.first_batch:
        raise SettingsError(f"Largest batch must be at least the first batch ({params.first_batch}), "
                            f"got {params.max_batch}.")
    for name in params.defences:
        if name not in ("", NO_DEFENCE) and name not in DEFENCES:
            raise InversionError(f"Unknown defence '{name}' (choose from {', '.join(DEFENCES)}).")
    for name, values in params.methods.items():
        family = next((f for f in FAMILIES if name in f), None)
        if family is None:
            raise InversionError(f"Unknown defence or proposal order '{name}' in the method settings.")
        unknown = set(values) - {f.name for f in labelled(family.get(name))}
        if unknown:
            raise SettingsError(f"{family.label(name)} has no setting(s) {', '.join(sorted(unknown))}.")
    for name in DEFENCES:
        make_defence(params, name)
    make_order(params)


@dataclass
class CascadeParams(Result):
    """One Cascade simulation: the prompt's positions sharded across parties, one party attacking."""

    prompt: str = ""
    layer: int = setting(1, label="Layer", low=0)
    parties: int = setting(2, label="Parties k", low=1, high=MAX_TOKENS,
                           help="Parties the positions are sharded across (at most one per token).")
    sharding: str = setting("round_robin", label="Sharding", choices=SHARDINGS.names, labels=SHARDINGS.label)
    attacker: int = setting(0, label="Attacking party", low=0, help="The party that tries to invert what it sees.")
    budget: int = setting(1_000_000, label="Brute-force budget (sequences)", low=1_000, high=5_000_000, step=50_000,
                          help="Largest brute-force run (candidate sequences) actually executed.")
    max_tokens: int = setting(MAX_TOKENS, label="Token limit", low=1, url=None, cli=None)

    def validate(self) -> None:
        check_settings(self)
        if self.attacker >= self.parties:
            raise SettingsError(f"Attacking party must be at most {self.parties - 1}, got {self.attacker}.")



@dataclass
class InversionState:
    """The reconstruction page's own controls: the two defences it applies (AttackParams.defences), which
    extra runs it shows, and the Cascade simulation's settings (described once, by CascadeParams)."""

    perm: str = setting(NO_DEFENCE, label="Permutation defence", choices=lambda: defence_names("permutation"),
                        labels=defence_label, group="row", width=300)
    perturb: str = setting(NO_DEFENCE, label="Perturbation", choices=lambda: defence_names("perturbation"),
                           labels=defence_label, group="row", width=180)
    sweeps: bool = setting(True, label="Show the layer and noise sweeps",
                           help="Re-runs the attack at every layer and at several noise levels per defence.")
    exhaustive: bool = setting(True, label="Time exhaustive search",
                               help="Exhaustive search scores every token per position. When that is long it runs "
                                    "on the first position only and its time is extrapolated.")
    parties: int = like(CascadeParams, "parties", width=130)
    sharding: str = like(CascadeParams, "sharding", width=360)
    attacker: int = like(CascadeParams, "attacker", width=140)
    budget: int = like(CascadeParams, "budget", width=230)

"""SAE types: each sae-lens architecture the panel trains is a small class owning its own settings.

Adding one is one registered class with its settings as `setting(...)` fields and the sae-lens training
config it builds. A type's settings travel in `TrainParams.architectures` as `{type name: settings}`;
`architecture_settings(**flat)` sorts flat names (`k=8`) to the types that declare them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from analysis.framework.errors import SettingsError
from analysis.framework.registry import Method, Registry
from analysis.framework.settings import setting

ARCHITECTURES: Registry["SaeType"] = Registry("SAE architecture")
NORMALISE = "expected_average_only_in"  # sae-lens scales inputs to a fixed mean norm while training


@dataclass
class SaeType(Method):
    """One sae-lens SAE architecture: its settings and its training config."""

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""

    def training_config(self, d_in: int, d_sae: int, steps: int):
        raise NotImplementedError

    def check_width(self, d_sae: int) -> None:
        """Cross-setting checks against the number of features."""


@ARCHITECTURES.register
@dataclass
class TopK(SaeType):
    name: ClassVar[str] = "topk"
    label: ClassVar[str] = "TopK (exactly k active features per token)"
    k: int = setting(8, label="k (active features per token)", low=1, high=4096,
                     help="TopK: how many features fire on every token.")

    def check_width(self, d_sae: int) -> None:
        if self.k > d_sae:
            raise SettingsError(f"k (active features per token) must be at most the number of features ({d_sae}), "
                                f"got {self.k}.")

    def training_config(self, d_in, d_sae, steps):
        from sae_lens import TopKTrainingSAEConfig

        return TopKTrainingSAEConfig(k=self.k, d_in=d_in, d_sae=d_sae, normalize_activations=NORMALISE)


@ARCHITECTURES.register
@dataclass
class Standard(SaeType):
    name: ClassVar[str] = "standard"
    label: ClassVar[str] = "Standard (ReLU with an L1 penalty)"
    l1_coefficient: float = setting(3.0, label="L1 coefficient", low=0.0, high=1000.0,
                                    help="Standard SAE: weight of the L1 sparsity penalty.")

    def training_config(self, d_in, d_sae, steps):
        from sae_lens import StandardTrainingSAEConfig

        return StandardTrainingSAEConfig(l1_coefficient=self.l1_coefficient, l1_warm_up_steps=steps // 10,
                                         d_in=d_in, d_sae=d_sae, normalize_activations=NORMALISE)


@ARCHITECTURES.register
@dataclass
class JumpReLU(SaeType):
    name: ClassVar[str] = "jumprelu"
    label: ClassVar[str] = "JumpReLU (learned thresholds, L0 penalty)"
    l0_coefficient: float = setting(0.3, label="L0 coefficient", low=0.0, high=1000.0,
                                    help="JumpReLU SAE: weight of the L0 sparsity penalty.")

    def training_config(self, d_in, d_sae, steps):
        from sae_lens import JumpReLUTrainingSAEConfig

        return JumpReLUTrainingSAEConfig(l0_coefficient=self.l0_coefficient, l0_warm_up_steps=steps // 10,
                                         d_in=d_in, d_sae=d_sae, normalize_activations=NORMALISE)


def architecture_settings(**flat) -> dict[str, dict]:
    """{type name: its settings} from settings named by field (`k=8, l1_coefficient=2`); names no type
    declares are refused."""
    return ARCHITECTURES.split_settings(**flat)

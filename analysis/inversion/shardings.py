"""Shardings for the Cascade simulation: which party sees each position of the prompt."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from analysis.framework.registry import Method, Registry

SHARDINGS: Registry["Sharding"] = Registry("sharding")


@dataclass
class Sharding(Method):
    def assign(self, n: int, parties: int) -> list[int]:
        """The party that sees each of n positions."""
        raise NotImplementedError


@SHARDINGS.register
@dataclass
class RoundRobin(Sharding):
    name: ClassVar[str] = "round_robin"
    label: ClassVar[str] = "round-robin (position i to party i mod k)"

    def assign(self, n, parties):
        return [i % parties for i in range(n)]


@SHARDINGS.register
@dataclass
class Blocks(Sharding):
    name: ClassVar[str] = "blocks"
    label: ClassVar[str] = "contiguous blocks"

    def assign(self, n, parties):
        size = math.ceil(n / parties)
        return [i // size for i in range(n)]

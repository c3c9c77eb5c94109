"""What a KV-cache analysis returns: typed records the page renders, the CLI prints and the store saves."""
from __future__ import annotations

from dataclasses import dataclass, field

from analysis.kv.params import KvParams
from analysis.framework.results import Result
from analysis.tasks.records import KvTask


def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """Each token as the text it stands for (" Tokyo", not byte-level BPE's "ĠTokyo"), for labels."""
    return [tokenizer.decode([int(i)]) for i in ids]


@dataclass
class PolicyRun(Result):
    policy: str
    label: str
    budget: int
    kl: list[float]  # per predicted token, KL(full || policy) in nats
    top1: list[float]  # 1 where the policy's top token equals the full cache's
    dnll: list[float]  # NLL of the true next token, policy minus full (nats)
    recall: list[list[float]]  # [decode step][layer]: full-cache attention mass on the entries present
    needle_survival: list[list[float]]  # [layer][kv head]: share of needles present when asked for
    accuracy: float | None  # share of answers predicted right (key-value task)
    answers: list[int]  # predicted token at each answer position
    cache_len: list[float]  # per decode step, entries per KV head, mean over the evictable layers
    cache_bytes: list[int]
    analytic_bytes: list[int]
    step_ms: list[float]
    claimed: float = 0.0  # entries per KV head it should hold at the last step, mean over layers (Policy.held)
    evicted_bytes: list[int] = field(default_factory=list)  # per decode step, measured, the evictable layers only
    evicted_analytic: list[int] = field(default_factory=list)  # the same, analytic (empty: saved before)

    @property
    def mean_kl(self) -> float:
        return sum(self.kl) / max(1, len(self.kl))

    @property
    def agreement(self) -> float:
        return sum(self.top1) / max(1, len(self.top1))

    @property
    def mean_recall(self) -> float:
        flat = [x for row in self.recall for x in row]
        return sum(flat) / max(1, len(flat))


@dataclass
class SweepPoint(Result):
    """One policy at one budget of a sweep: each sweep metric (metrics.py) averaged over the prompts.

    Saved flat, the metrics beside the policy, share and budget (`{"policy": ..., "accuracy": 0.5, ...}`),
    so results saved before the metrics were data read the same."""

    policy: str
    share: float  # budget as a share of the context
    budget: int
    values: dict[str, float | None] = field(default_factory=dict)  # metric name -> its mean over the prompts

    def to_dict(self) -> dict:
        return {"policy": self.policy, "share": self.share, "budget": self.budget, **self.values}

    @classmethod
    def from_dict(cls, data: dict) -> "SweepPoint":
        values = {k: v for k, v in data.items() if k not in ("policy", "share", "budget")}
        return cls(policy=data["policy"], share=data["share"], budget=data["budget"], values=values)


@dataclass
class GeneratedText(Result):
    policy: str
    label: str
    text: str
    tokens: list[str]
    matches_full: list[bool]  # token by token against the full cache's generation


@dataclass
class KvResult(Result):
    params: KvParams
    model: str
    task: KvTask
    token_text: list[str]
    layers: list[int]  # evictable layers
    kv_heads: int
    runs: list[PolicyRun]  # every policy at the chosen budget (full cache first)
    kept: list[list[list[list[int]]]]  # chosen policy: [layer][kv head][decode step] -> positions after eviction
    full_accuracy: float | None
    texts: list[GeneratedText] = field(default_factory=list)
    model_layers: int = 0  # every layer of the model (0: saved before; then as `layers`)

    @property
    def kept_layers(self) -> list[int]:
        """Layers no policy evicts (sliding-window ones: already bounded by their window)."""
        return [i for i in range(self.model_layers) if i not in self.layers]

    def run(self, policy: str) -> PolicyRun:
        return next(r for r in self.runs if r.policy == policy)


@dataclass
class SweepResult(Result):
    model: str
    context: int
    points: list[SweepPoint]
    full_accuracy: float | None

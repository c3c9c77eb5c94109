"""The typed results of a size sweep: what the page renders, the CLI prints, the store saves."""
from __future__ import annotations

from dataclasses import dataclass

from analysis.framework.results import Result
from analysis.sharpness.heads import HeadStats
from analysis.sharpness.params import SweepParams
from analysis.sharpness.rules import Temperature
from analysis.tasks.retrieval import MAX_RETRIEVAL, RetrievalPrompt


@dataclass
class RunStats(Result):
    """One temperature rule at one n, averaged over the prompts."""

    rule: Temperature
    accuracy: float  # the answer ranks first (over the prompt's candidates, or over the vocabulary)
    answer_prob: float  # mean probability of the whole correct answer
    runner_up: float  # max retrieval: share answered with the second-largest value (a near miss)
    with_sink: HeadStats
    without_sink: HeadStats


@dataclass
class SizePoint(Result):
    n: int
    tokens: int  # prompt length in tokens (mean)
    runs: list[RunStats]  # one per rule: softmax, adaptive, then each θ of the sweep
    chance: float | None = None  # accuracy of a uniform guess among the candidates (None: scored over the vocabulary)

    def run(self, label: str) -> RunStats:
        return next(r for r in self.runs if r.rule.label == label)


Head = tuple[int, int]


@dataclass
class SweepResult(Result):
    model: str
    params: SweepParams
    format: str
    example: RetrievalPrompt  # the first prompt at the smallest n, to show what the model sees
    points: list[SizePoint]
    skipped: list[int]  # n values the task cannot write or the model's positions cannot hold
    layers: int
    heads: int
    task: str = MAX_RETRIEVAL  # MAX_RETRIEVAL | RECALL (analysis/tasks/retrieval.py)

    def rules(self) -> list[str]:
        return [r.rule.label for r in self.points[0].runs] if self.points else []

    @property
    def item(self) -> str:
        """What the measured weight is on: the largest item (max retrieval) or the asked one (recall)."""
        return "max-item" if self.task == MAX_RETRIEVAL else "answer-item"

    def retrieval_heads(self, k: int = 3) -> list[Head]:
        """The k (layer, head) putting the most softmax weight on the answer item at the smallest n."""
        tw = self.points[0].run("softmax").with_sink.target_weight
        heads = [(layer, head) for layer in range(len(tw)) for head in range(len(tw[layer]))]
        return sorted(heads, key=lambda lh: -tw[lh[0]][lh[1]])[:k]

    def retrieval_head(self) -> Head:
        """The head with the most weight on the answer item at the smallest n."""
        return self.retrieval_heads(1)[0]

    def accuracy_table(self) -> list[dict]:
        """Per n: accuracy and answer-item weight (mean over heads, and the retrieval head), softmax vs adaptive."""
        l, h = self.retrieval_head()
        item = self.item
        rows = []
        for p in self.points:
            soft, ada = p.run("softmax"), p.run("adaptive θ")
            row = {"n": p.n, "tokens": p.tokens}
            if p.chance is not None:
                row["chance"] = p.chance
            row |= {"softmax accuracy": soft.accuracy, "adaptive accuracy": ada.accuracy,
                    "softmax P(answer)": soft.answer_prob, "adaptive P(answer)": ada.answer_prob}
            if self.task == MAX_RETRIEVAL:
                row |= {"softmax runner-up": soft.runner_up, "adaptive runner-up": ada.runner_up}
            row |= {
                f"softmax {item} weight L{l}H{h}": soft.with_sink.target_weight[l][h],
                f"adaptive {item} weight L{l}H{h}": ada.with_sink.target_weight[l][h],
                f"softmax {item} weight, mean of heads": _mean2(soft.with_sink.target_weight),
                f"adaptive {item} weight, mean of heads": _mean2(ada.with_sink.target_weight),
            }
            rows.append(row)
        return rows

    def head_table(self, heads: list[Head] | None = None) -> list[dict]:
        """Per n: the weight each retrieval head puts on the answer item, and its largest weight (softmax)."""
        heads = heads or self.retrieval_heads()
        rows = []
        for p in self.points:
            soft = p.run("softmax").with_sink
            row = {"n": p.n}
            for l, h in heads:
                row[f"L{l}H{h} {self.item} weight"] = soft.target_weight[l][h]
                row[f"L{l}H{h} max weight"] = soft.max_weight[l][h]
            rows.append(row)
        return rows


def _mean2(rows: list[list[float]]) -> float:
    flat = [v for row in rows for v in row]
    return sum(flat) / len(flat) if flat else float("nan")

"""Metrics, exact on Shapes World and only there: factuality, coverage, CHAIR, POPE-style verifier scores, the
threshold sweep, and the word diff of a rewrite.

Ground truth comes from the scene through the grammar, so a caption (or a set of claims) the grammar does
not read whole is not measurable: `measure_caption` and `pi_sweep` then give None, never the 1.0 that an
empty parse would score.
"""
from __future__ import annotations

import difflib

from analysis.captions.records import CaptionMetrics, ClaimVerdict, DiffSpan, PopeMetrics, SweepPoint
from analysis.captions.world import claim_parses, grammar_claim, grammar_covers, shapes_text, shapes_world


def factuality(truths: list[bool]) -> float:
    """Share of claims that are true; an empty caption states nothing false (1.0)."""
    return sum(truths) / len(truths) if truths else 1.0


def coverage(stated: set[str], facts: set[str]) -> float:
    """Share of the scene's facts among the stated claims."""
    return len(stated & facts) / len(facts) if facts else 1.0


def chair(mentioned: list, present: set) -> tuple[float, float]:
    """CHAIR_i (share of object mentions not in the scene) and CHAIR_s (any such mention)."""
    bad = [m for m in mentioned if m not in present]
    return (len(bad) / len(mentioned) if mentioned else 0.0), float(bool(bad))


def pope(predicted_yes: list[bool], is_true: list[bool]) -> PopeMetrics:
    """POPE-style yes/no scores: 'yes' is the positive class."""
    pairs = list(zip(predicted_yes, is_true))
    tp = sum(p and t for p, t in pairs)
    fp = sum(p and not t for p, t in pairs)
    fn = sum(t and not p for p, t in pairs)
    n = len(pairs)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return PopeMetrics(n=n, accuracy=sum(p == t for p, t in pairs) / n if n else 0.0,
                       precision=precision, recall=recall, f1=f1,
                       yes_ratio=sum(predicted_yes) / n if n else 0.0)


def score_caption(scene, caption: str) -> CaptionMetrics:
    """Factuality, coverage and CHAIR of a caption against a Shapes World scene (grammar parse; what the
    grammar does not read is ignored: use `measure_caption` for a user's caption)."""
    return score_claims(scene, shapes_world().decompose(shapes_text(caption)))


def measure_caption(scene, caption: str) -> CaptionMetrics | None:
    """`score_caption` when the grammar reads the whole caption, else None (not measurable)."""
    return score_caption(scene, caption) if grammar_covers(caption) else None


def score_claims(scene, claims: list[str]) -> CaptionMetrics:
    """Exact metrics of a set of claims; objects are the (colour, shape) of existence claims."""
    world = shapes_world()
    truths = [world.claim_truth(scene, c) for c in claims]
    facts = {f.text for f in world.scene_facts(scene)}
    objects = [(p[1], p[2]) for p in map(world.parse_claim, claims) if p and p[0] == "existence"]
    present = {(o.colour, o.shape) for o in scene.objects}
    chair_i, chair_s = chair(objects, present)
    return CaptionMetrics(
        claims=len(claims), true_claims=sum(truths), factuality=factuality(truths),
        facts=len(facts), facts_stated=len(set(claims) & facts), coverage=coverage(set(claims), facts),
        objects_mentioned=len(objects), objects_hallucinated=sum(o not in present for o in objects),
        chair_i=chair_i, chair_s=chair_s,
    )


def claim_truth(scene, claim: str) -> bool | None:
    """The claim's truth in the scene; None when the grammar does not parse it (no ground truth)."""
    return shapes_world().claim_truth(scene, grammar_claim(claim)) if claim_parses(claim) else None


def pi_sweep(verdicts: list[ClaimVerdict], scene=None, pis: list[float] | None = None) -> list[SweepPoint]:
    """Factuality and coverage of the kept claims as pi varies (claim level, no rewriting); None for both
    without a scene or when any claim has no ground truth."""
    if pis is None:
        top = 1.1 * max([v.score for v in verdicts] + [1.0])
        pis = sorted({round(top * k / 40, 4) for k in range(41)} | {0.0})
    measurable = scene is not None and all(claim_parses(v.claim) for v in verdicts)
    points = []
    for pi in pis:
        kept = [grammar_claim(v.claim) for v in verdicts if v.score <= pi]
        fact = cov = None
        if measurable:
            m = score_claims(scene, kept)
            fact, cov = m.factuality, m.coverage
        points.append(SweepPoint(pi=pi, kept=len(kept), factuality=fact, coverage=cov))
    return points


def word_diff(before: str, after: str) -> list[DiffSpan]:
    """Word-level diff of two captions as same / removed / added spans."""
    a, b = before.split(), after.split()
    spans: list[DiffSpan] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            spans.append(DiffSpan("same", " ".join(a[i1:i2])))
            continue
        if i2 > i1:
            spans.append(DiffSpan("removed", " ".join(a[i1:i2])))
        if j2 > j1:
            spans.append(DiffSpan("added", " ".join(b[j1:j2])))
    return spans

"""Caption correction on a Shapes World split: factuality, coverage, CHAIR before/after, POPE.

    python benchmarks/captions_eval.py --n 200            # test split, writes benchmarks/results/captions_eval.json

Each scene is captioned by the weak captioner (zoo:shapes-vlm-weak, which hallucinates) and by
zoo:shapes-vlm; every caption goes through the pipeline (decompose -> verify each claim alone with
shapes-vlm -> rewrite) with the demo LM's agents, with the grammar reference agents, and with the grammar
agents plus a ground-truth oracle as verifier (the ceiling a perfect verifier would reach). Metrics are
exact against the scene and micro-averaged over the split (CHAIR_s: share of captions with a
hallucinated object). POPE asks the verifier balanced yes/no questions (half true, half false)
per scene. The pi sweep re-thresholds the same verifications (grammar rewrite), so it is cheap, and
so does the comparison of the two p_True/p_False forms (raw, the paper's and the default, vs
renormalised p_T/(p_T+p_F)), with the verifier's yes+no mass per claim.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402  (every project path comes from analysis/framework/paths.py)

from analysis import captions as C  # noqa: E402
from analysis.model_access.models import ModelSpec, load_model, zoo_models  # noqa: E402
from analysis.world import shapes_world as W  # noqa: E402

# (row label, decomposer/rewriter, ground-truth verifier instead of shapes-vlm)
SETUPS = (("shapes-lm", "shapes-lm", False), ("grammar", "grammar", False),
          ("grammar + oracle verifier", "grammar", True))


class OracleVerifier:
    """The pipeline's ceiling: a verifier that knows the scene (p_T = 1 for true claims, else p_F = 1)."""

    name = "oracle"

    def __init__(self, scene):
        self.scene = scene

    def verify(self, image, claims):
        return [(1.0, 0.0) if W.claim_truth(self.scene, c) else (0.0, 1.0) for c in claims]


PI_SWEEP = (0.0, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 9.3)


def totals(metrics: list[C.CaptionMetrics]) -> dict:
    """Micro-averaged metrics over captions."""
    claims = sum(m.claims for m in metrics)
    facts = sum(m.facts for m in metrics)
    mentioned = sum(m.objects_mentioned for m in metrics)
    return {
        "captions": len(metrics),
        "claims_per_caption": claims / len(metrics),
        "factuality": sum(m.true_claims for m in metrics) / claims if claims else 1.0,
        "coverage": sum(m.facts_stated for m in metrics) / facts,
        "chair_i": sum(m.objects_hallucinated for m in metrics) / mentioned if mentioned else 0.0,
        "chair_s": sum(m.chair_s for m in metrics) / len(metrics),
    }


def evaluate_captions(vlm, lm, captioner, seeds: list[int], pi: float, progress) -> dict:
    """Caption every scene, then run both agent sets at pi; also the pi sweep for the grammar set."""
    captions = []
    for i, seed in enumerate(seeds):
        captions.append(C.caption_image(captioner, W.render(W.generate_scene(seed))))
        progress(f"{captioner.spec.name}: captioned {i + 1}/{len(seeds)}")
    out: dict = {"captioner": Path(captioner.spec.name).name, "agents": {}}
    for label, agents, oracle in SETUPS:
        before, after, decomp_exact, verifications, replaced = [], [], 0, [], 0
        renormalised = []  # grammar agents: the same verifications scored with p_T/(p_T+p_F)
        sweep = {pi_: [] for pi_ in PI_SWEEP}
        for i, (seed, caption) in enumerate(zip(seeds, captions)):
            scene = W.generate_scene(seed)
            params = C.CorrectionParams(caption=caption, pi=pi, decomposer=agents, rewriter=agents,
                                        ground=False, scene_seed=seed)
            before.append(C.score_caption(scene, caption))
            try:
                verification = C.verify_caption(vlm, W.render(scene), params, lm,
                                                verifier=OracleVerifier(scene) if oracle else None)
            except C.CaptionError:  # no claims: nothing to correct
                after.append(before[-1])
                renormalised.append(before[-1])
                for pi_ in PI_SWEEP:
                    sweep[pi_].append(before[-1])
                continue
            verifications.append(verification)
            decomp_exact += [c.claim for c in verification.claims] == W.decompose(caption)
            corrected = C.apply_threshold(verification, params, lm)
            replaced += bool(corrected.rewrite_note)  # the LM's rewrite stated a claim not kept
            after.append(C.score_caption(scene, corrected.corrected))
            if label == "grammar":
                other = C.CorrectionParams(**{**vars(params), "probabilities": "renormalised"})
                renormalised.append(C.score_caption(scene, C.apply_threshold(verification, other).corrected))
                for pi_ in PI_SWEEP:
                    swept = C.CorrectionParams(**{**vars(params), "pi": pi_})
                    sweep[pi_].append(C.score_caption(scene, C.apply_threshold(verification, swept).corrected))
            progress(f"{captioner.spec.name} / {label}: corrected {i + 1}/{len(seeds)}")
        flagged = [c for v in verifications for c in v.claims]
        masses = [c.mass for c in flagged if c.asked]
        out["agents"][label] = {
            "before": totals(before), "after": totals(after),
            "decomposer_exact_match": decomp_exact / max(1, len(verifications)),
            "claims_flagged_at_pi": sum(c.score > pi for c in flagged) / max(1, len(flagged)),
            "rewrites_replaced_by_grammar": replaced,
            "sweep": {str(k): totals(v) for k, v in sweep.items()} if label == "grammar" else {},
        }
        if label == "grammar":
            out["agents"][label]["renormalised_after"] = totals(renormalised)
        if not oracle:
            out["agents"][label]["yes_no_mass"] = {
                "claims": len(masses), "min": min(masses, default=0.0),
                "mean": sum(masses) / max(1, len(masses)),
                "below_low_mass": sum(m < C.LOW_MASS for m in masses) / max(1, len(masses))}
    out["examples"] = [{"seed": s, "caption": c} for s, c in list(zip(seeds, captions))[:3]]
    return out


def evaluate_pope(vlm, seeds: list[int], per_scene: int, progress) -> dict:
    """Balanced yes/no questions per scene; 'yes' when p_True > p_False. Scores per claim kind."""
    verifier = C.make_verifier("shapes-vlm", vlm)
    rng = random.Random("pope")
    rows = []
    for i, seed in enumerate(seeds):
        scene = W.generate_scene(seed)
        claims = W.question_set(scene, rng, per_scene)
        probs = verifier.verify(W.render(scene), [c.text for c in claims])
        rows += [(c.kind, pt > pf, c.truth) for c, (pt, pf) in zip(claims, probs)]
        if (i + 1) % 20 == 0:
            progress(f"POPE: {i + 1}/{len(seeds)} scenes")
    out = {"all": C.pope([r[1] for r in rows], [r[2] for r in rows]).to_dict()}
    for kind in ("existence", "size", "position"):
        sub = [r for r in rows if r[0] == kind]
        out[kind] = C.pope([r[1] for r in sub], [r[2] for r in sub]).to_dict()
    return out


def markdown(result: dict) -> str:
    lines = [f"Shapes World {result['split']} split, {result['n']} scenes, verifier {result['verifier']}, "
             f"pi = {result['pi']}, {result['seconds']:.0f} s on {result['threads']} CPU thread(s).", "",
             "| captioner | agents | claims/caption | factuality before → after | coverage before → after "
             "| CHAIR_i before → after | CHAIR_s before → after | decomposer = grammar | LM rewrites replaced |",
             "|---|---|---|---|---|---|---|---|---|"]
    for cap in result["captioners"]:
        for agents, r in cap["agents"].items():
            b, a = r["before"], r["after"]
            lines.append(
                f"| {cap['captioner']} | {agents} | {b['claims_per_caption']:.1f} → {a['claims_per_caption']:.1f} "
                f"| {b['factuality']:.3f} → **{a['factuality']:.3f}** | {b['coverage']:.3f} → {a['coverage']:.3f} "
                f"| {b['chair_i']:.3f} → {a['chair_i']:.3f} | {b['chair_s']:.3f} → {a['chair_s']:.3f} "
                f"| {r['decomposer_exact_match']:.1%} | {r.get('rewrites_replaced_by_grammar', 0)} |")
    lines += ["", f"p_True/p_False form (grammar agents, π = {result['pi']}; raw is the paper's H and the default) "
              "and the verifier's yes+no mass p_T + p_F per claim:", "",
              "| captioner | factuality after: raw → renormalised | coverage after: raw → renormalised "
              "| CHAIR_i after: raw → renormalised | yes+no mass: min / mean | claims with mass < "
              f"{C.LOW_MASS:g} |", "|---|---|---|---|---|---|"]
    for cap in result["captioners"]:
        r = cap["agents"]["grammar"]
        a, n, m = r["after"], r.get("renormalised_after"), r.get("yes_no_mass")
        if n and m:
            lines.append(f"| {cap['captioner']} | {a['factuality']:.3f} → {n['factuality']:.3f} "
                         f"| {a['coverage']:.3f} → {n['coverage']:.3f} | {a['chair_i']:.3f} → {n['chair_i']:.3f} "
                         f"| {m['min']:.3f} / {m['mean']:.3f} | {m['below_low_mass']:.1%} of {m['claims']} |")
    lines += ["", "POPE-style yes/no probing of the verifier (balanced: half the questions are true):", "",
              "| question kind | n | accuracy | precision | recall | F1 | yes ratio |", "|---|---|---|---|---|---|---|"]
    for kind, p in result["pope"].items():
        lines.append(f"| {kind} | {p['n']} | {p['accuracy']:.3f} | {p['precision']:.3f} | {p['recall']:.3f} "
                     f"| {p['f1']:.3f} | {p['yes_ratio']:.3f} |")
    for cap in result["captioners"]:
        sweep = cap["agents"]["grammar"]["sweep"]
        lines += ["", f"Threshold sweep, {cap['captioner']} captions, grammar agents (after correction):", "",
                  "| π | factuality | coverage | CHAIR_i | claims/caption |", "|---|---|---|---|---|"]
        for pi, t in sweep.items():
            lines.append(f"| {float(pi):g} | {t['factuality']:.3f} | {t['coverage']:.3f} | {t['chair_i']:.3f} "
                         f"| {t['claims_per_caption']:.2f} |")
    return "\n".join(lines)


def weights_hash(folder: str) -> str:
    import hashlib

    return hashlib.sha256((Path(folder) / "model.safetensors").read_bytes()).hexdigest()[:16]


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="scenes")
    ap.add_argument("--split", default="test")
    ap.add_argument("--pi", type=float, default=C.DEFAULT_PI)
    ap.add_argument("--pope-per-scene", type=int, default=6)
    ap.add_argument("--out", default=str(RESULTS / "captions_eval.json"))
    ap.add_argument("--models", default=None, help="a folder holding the three demo models instead of the zoo")
    args = ap.parse_args()

    def spec(name: str) -> ModelSpec:
        return ModelSpec("local", str(Path(args.models) / name)) if args.models else ModelSpec("zoo", name)

    missing = {"shapes-vlm", "shapes-vlm-weak", "shapes-lm"} - (
        {p.name for p in Path(args.models).iterdir()} if args.models else set(zoo_models()))
    if missing:
        print(f"missing demo models: {', '.join(sorted(missing))} (build with python -m analysis.zoo build)",
              file=sys.stderr)
        return 2
    start = time.time()

    def progress(message: str) -> None:
        print(f"[{time.time() - start:6.0f} s] {message}", file=sys.stderr, flush=True)

    vlm, weak, lm = (load_model(spec(n)) for n in ("shapes-vlm", "shapes-vlm-weak", "shapes-lm"))
    hashes = {h.spec.name: weights_hash(h.path) for h in (vlm, weak, lm)}  # of the weights just loaded
    seeds = W.split_seeds(args.split, args.n)
    result = {"split": args.split, "n": args.n, "pi": args.pi, "verifier": vlm.spec.label,
              "decomposer_rewriter_lm": lm.spec.label, "threads": torch.get_num_threads(),
              "captioners": [evaluate_captions(vlm, lm, cap, seeds, args.pi, progress) for cap in (weak, vlm)],
              "pope": evaluate_pope(vlm, seeds, args.pope_per_scene, progress)}
    result["seconds"] = time.time() - start
    result["weights_sha256"] = hashes
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""SAE-V steering on the demo: how often does adding the demo SAE's cross-modal 'middle right' features to
the image tokens move an object of the caption to the middle right?

On held-out test-split scenes that have no object in the middle right cell (seeds from 21,000,000), the
demo VLM captions each scene greedily without and with one feature added at +16 on the image tokens
(the preset `steer-middle-right`: `analysis.sae_v.steering.generate_both`, the page's and the CLI's
path). A scene counts as *moved* when the steered caption says "middle right" (the unsteered one cannot:
nothing is there), as *changed otherwise* when the caption changes in another way, else *unchanged*.
The cross-modal features whose concept in both modalities is "position:middle right" are measured, most
precise first (the preset steers the first; `--features` how many, default 2).

    python benchmarks/sae_v_steering.py            # writes benchmarks/results/sae_v_steering.json
    python benchmarks/sae_v_steering.py --scenes 12  # a quick look
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402  (every project path comes from analysis/framework/paths.py)
from benchmarks.sae_v_demo import MODEL, SAE, demo  # noqa: E402

RESULT_FILE = RESULTS / "sae_v_steering.json"
SEED_BASE = 21_000_000  # test-split scenes
CONCEPT = "position:middle right"
WORDS = "middle right"


def middle_right_features(store: dict) -> list[tuple[int, float]]:
    """(feature, precision of its concept in both modalities) of the cross-modal 'middle right' features,
    most precise first."""
    found = [(i, (card.get("concept_both") or {}).get("precision", 0.0)) for i, card in enumerate(store["features"])
             if card.get("label") == "cross-modal" and (card.get("concept_both") or {}).get("name") == CONCEPT]
    return sorted(found, key=lambda x: (-x[1], x[0]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", type=int, default=120, help="scenes drawn (those with an object there are skipped)")
    ap.add_argument("--strength", type=float, default=16.0)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--features", type=int, default=2, help="the most precise 'middle right' features measured")
    ap.add_argument("--out", default=str(RESULT_FILE))
    args = ap.parse_args(argv)
    from analysis import sae_v
    from analysis.sae_v.steering import generate_both
    from analysis.world import shapes_world as sw

    start = time.perf_counter()
    handle, folder, sae, meta = demo()
    features = middle_right_features(sae_v.read_store_json(folder))[:args.features]
    seeds = [SEED_BASE + i for i in range(args.scenes)]
    scenes = [sw.generate_scene(s) for s in seeds]
    empty = [s for s in scenes if all(o.position != "middle right" for o in s.objects)]
    out = {"model": MODEL, "sae": SAE, "strength": args.strength,
           "positions": "image", "new_tokens": args.tokens, "seeds": [seeds[0], seeds[-1]],
           "scenes_drawn": len(scenes), "scenes_without_middle_right": len(empty), "features": []}
    for feature, precision in features:
        moved = other = same = 0
        examples = []
        for scene in empty:
            image = sw.render(scene, handle.info.image_size)
            result = generate_both(handle, sae, meta, {feature: args.strength}, image=image, positions="image",
                                   max_new_tokens=args.tokens)
            before, after = result.unsteered.text, result.steered.text
            if WORDS in after and WORDS not in before:
                moved += 1
            elif after != before:
                other += 1
            else:
                same += 1
            if len(examples) < 3 and WORDS in after:
                examples.append({"seed": scene.seed, "unsteered": before, "steered": after})
        n = len(empty)
        out["features"].append({"feature": feature, "concept_precision": precision, "moved": moved,
                                "changed_otherwise": other, "unchanged": same, "scenes": n,
                                "moved_share": round(moved / n, 4) if n else None, "examples": examples})
        print(f"feature {feature}: moved {moved}/{n}, changed otherwise {other}, unchanged {same}", file=sys.stderr)
    out["seconds"] = round(time.perf_counter() - start, 1)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

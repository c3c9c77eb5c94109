"""The caption agents on a real instruct LM (issue 31): does the decomposer write claims about the caption?

    python benchmarks/captions_instruct.py --lm zoo:smollm2-135m-instruct      # or local:/path/to/the/model
    python benchmarks/captions_instruct.py --lm ... --quick                     # 5 captions, no pipeline run

1. Decomposer check. On 20 plain-English captions written for this check (below; none is a prompt
   example), the `lm-chat` decomposer's raw answer lines (before its own filter) and, for comparison, the
   answer to the one-instruction prompt it used before (OLD_INSTRUCTION, whole caption, no examples) are
   scored by this file's own rules, written apart from the agent's filter:
   - a *sentence*: three or more words, mostly letters, no backticks, not ending with ':' and one sentence;
   - *about the caption*: every content word (stop words and 'wear'/'has' aside) is a caption word, up
     to a plain suffix ('runs' ~ 'running');
   - *atomic*: shorter than the caption (a copy of the caption decomposes nothing).
   A line that is all three is a claim. The rules cannot see meaning: "The dog is red" passes for a caption
   with a brown dog and a red frisbee, so the kept claims are also listed for reading.
2. The pipeline on Shapes World scenes described in plain English (the grammar cannot read them), with the
   real LM as decomposer and rewriter and zoo:shapes-vlm as verifier: claims, how many the demo VLM can
   be asked (those in the grammar's words), their truth, the corrected caption and the metrics (none: not
   measurable).

Writes benchmarks/results/captions_instruct.json.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402  (every project path comes from analysis/framework/paths.py)

from analysis import captions as C  # noqa: E402
from analysis.model_access.models import ModelSpec, all_zoo_models, load_model  # noqa: E402
from benchmarks.result_names import result_name  # noqa: E402

CAPTIONS = [
    "A brown dog runs along a sandy beach. A red frisbee flies above the dog. Two people sit under a blue umbrella.",
    "A young woman in a yellow raincoat holds a black umbrella on a busy city street.",
    "Three green apples lie on a wooden table next to a white ceramic bowl.",
    "A man rides a red bicycle past a small bakery with a striped awning.",
    "Two children build a sandcastle while a seagull stands nearby.",
    "A grey cat sleeps on a windowsill beside a potted cactus.",
    "A large white ship is docked in a harbour under a cloudy sky.",
    "An old stone bridge crosses a narrow river surrounded by tall pine trees.",
    "A chef in a white hat slices tomatoes on a cutting board in a bright kitchen.",
    "A blue bus stops at a corner where several people wait with shopping bags.",
    "A laptop, a coffee mug and a notebook sit on a cluttered desk near a lamp.",
    "A horse grazes in a green field in front of a red barn.",
    "A girl in a pink dress blows out candles on a chocolate birthday cake.",
    "Snow covers the roofs of small wooden houses at the foot of a mountain.",
    "A soccer player in a white shirt kicks the ball toward the goal while the goalkeeper dives.",
    "A bowl of ramen with a boiled egg and green onions sits on a dark table.",
    "Two zebras drink from a muddy pond while an elephant walks behind them.",
    "A yellow taxi waits at a traffic light next to a tall glass building.",
    "An elderly man reads a newspaper on a park bench under an oak tree.",
    "A vase of sunflowers stands on a kitchen counter beside a loaf of bread.",
]
# Shapes World test scenes, described as a person would (their grammar captions are in the scene's ground truth)
SCENE_CAPTIONS = [
    (20000003, "A large blue triangle is at the top. A large yellow triangle sits in the center. There is a small "
               "yellow square at the bottom."),
    (20000004, "There is a red circle in the middle of the picture, and a small green square is in the top left "
               "corner."),
    (20000005, "I see a big purple star near the right edge."),
]
OLD_INSTRUCTION = (  # the lm-chat decomposer's prompt before issue 31
    "Split the image caption below into short atomic claims, each stating one fact "
    "(an object, one attribute of an object, or one relation). Write one claim per line and "
    "nothing else.\n\nCaption: {caption}"
)
STOP = set("a an the is are was were be been being of in on at to for with by from and or but as it its this that "
           "these those there here they them their he she his her him we you i one two three some several many "
           "into onto over under above below near beside next while where who which what than then also very "
           "wear wears wearing has have".split())


def _stem(w: str) -> str:
    for suffix in ("ing", "es", "ed", "s"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            return w[: -len(suffix)]
    return w


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z]+", text.lower()) if w not in STOP and len(w) > 1]


def is_sentence(line: str) -> bool:
    if len(line.split()) < 3 or "`" in line or line.rstrip().endswith(":"):
        return False
    if len(re.findall(r"[.!?](?:\s|$)", line.strip())) > 1:
        return False
    return sum(ch.isalpha() for ch in line) >= 0.6 * len(line.replace(" ", ""))


def is_about(line: str, caption: str) -> bool:
    known = [_stem(w) for w in _words(caption)]
    words = [_stem(w) for w in _words(line)]
    return bool(words) and all(any(w == k or (min(len(w), len(k)) >= 3 and (w.startswith(k) or k.startswith(w)))
                                   for k in known) for w in words)


def score(lines: list[str], caption: str) -> dict:
    atomic = [len(x.split()) < len(caption.split()) for x in lines]
    claims = [x for x, a in zip(lines, atomic) if a and is_sentence(x) and is_about(x, caption)]
    return {"n_lines": len(lines), "sentences": sum(map(is_sentence, lines)),
            "about": sum(is_about(x, caption) for x in lines), "atomic": sum(atomic), "claims": claims}


def raw_lines(lm, caption: str, old: bool) -> list[str]:
    """The answer lines as the model wrote them (bullets and numbering removed, duplicates kept once)."""
    if old:
        text = C.generate_text(lm, C.chat_prompt(lm, OLD_INSTRUCTION.format(caption=caption)), 200,
                               add_special_tokens=False)
        return C.parse_claim_lines(text)
    decomposer = C.make_agent("decomposer", "lm-chat", lm)
    lines: list[str] = []
    for prompt, tokens in decomposer.calls(caption):
        answer = C.generate_text(lm, prompt, tokens, add_special_tokens=False)
        lines += [x for x in C.parse_claim_lines(C.agents.LIST_START + answer) if x not in lines]
    return lines


def summary(rows: list[dict], seconds: float) -> dict:
    lines = sum(len(r["lines"]) for r in rows)
    claims = sum(len(r["claims"]) for r in rows)
    kept = sum(len(r.get("kept_by_agent", [])) for r in rows)
    return {"captions": len(rows), "lines": lines, "sentences": sum(r["sentences"] for r in rows),
            "about_the_caption": sum(r["about"] for r in rows), "atomic": sum(r["atomic"] for r in rows),
            "claims": claims, "claim_rate": claims / lines if lines else 0.0,
            "captions_with_a_claim": sum(bool(r["claims"]) for r in rows),
            "kept_by_the_agents_filter": kept, "seconds": seconds, "rows": rows}


def decomposer_check(lm, captions: list[str], log) -> dict:
    out = {}
    for name, old in (("before (one instruction)", True), ("after (worked examples, per sentence)", False)):
        rows, t0 = [], time.perf_counter()
        for caption in captions:
            lines = raw_lines(lm, caption, old)
            rows.append({"caption": caption, "lines": lines, **score(lines, caption),
                         "kept_by_agent": C.claims_about(lines, caption)[0]})
            log(f"{name}: {len(rows[-1]['claims'])}/{len(lines)} claims | {caption[:50]}")
        out[name] = summary(rows, time.perf_counter() - t0)
    return out


def rescore(path: str) -> dict:
    """The decomposer check scored again from the lines stored in a previous run (no model)."""
    report = json.loads(Path(path).read_text())
    for name, old in report["decomposer"].items():
        rows = [{"caption": r["caption"], "lines": r["lines"], **score(r["lines"], r["caption"]),
                 "kept_by_agent": C.claims_about(r["lines"], r["caption"])[0]} for r in old["rows"]]
        report["decomposer"][name] = summary(rows, old["seconds"])
    return report


def pipeline_check(lm, vlm, log) -> list[dict]:
    rows = []
    for seed, caption in SCENE_CAPTIONS:
        params = C.CorrectionParams(caption=caption, scene_seed=seed, decomposer="lm-chat", rewriter="lm-chat",
                                    ground=False)
        t0 = time.perf_counter()
        result = C.correct_caption(vlm, C.scene_image(seed), params, lm)
        rows.append({"seed": seed, "caption": caption, "seconds": time.perf_counter() - t0,
                     "claims": [{"claim": c.claim, "asked": c.asked, "truth": c.truth, "H": round(c.score, 3),
                                 "dropped": c.flagged} for c in result.claims],
                     "corrected": result.corrected, "before": result.before and result.before.to_dict(),
                     "after": result.after and result.after.to_dict(), "ground_truth": result.ground_truth,
                     "notes": [n for n in (result.decompose_note, result.rewrite_note) if n]})
        log(f"scene {seed}: {len(result.claims)} claims, {sum(c.asked for c in result.claims)} asked, "
            f"corrected {result.corrected!r}, metrics {'none' if result.before is None else 'measured'}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "zoo:smollm2-135m-instruct" if "smollm2-135m-instruct" in all_zoo_models() else None
    ap.add_argument("--lm", default=default, help="the instruct LM (zoo:, local:, hub:)")
    ap.add_argument("--vlm", default="zoo:shapes-vlm", help="the verifier of the pipeline check")
    ap.add_argument("--quick", action="store_true", help="5 captions, no pipeline run")
    ap.add_argument("--out", default=str(RESULTS / "captions_instruct.json"))
    ap.add_argument("--rescore", action="store_true", help="score the lines stored in --out again (no model)")
    args = ap.parse_args()
    if args.rescore:
        report = rescore(args.out)
    elif args.lm is None:
        ap.error("--lm is needed (zoo:smollm2-135m-instruct is not in this zoo)")
    else:
        lm = load_model(ModelSpec.parse(args.lm))
        report = {"lm": result_name(args.lm), "decomposer": decomposer_check(lm, CAPTIONS[:5] if args.quick else CAPTIONS, print)}
        if not args.quick:
            report["pipeline"] = pipeline_check(lm, load_model(ModelSpec.parse(args.vlm)), print)
    for name, r in report["decomposer"].items():
        print(f"{name}: {r['claims']}/{r['lines']} lines are claims ({r['claim_rate']:.0%}); sentences "
              f"{r['sentences']}, about the caption {r['about_the_caption']}, shorter than it {r['atomic']}; "
              f"captions with a claim {r['captions_with_a_claim']}/{r['captions']}; kept by the agent's own "
              f"filter {r['kept_by_the_agents_filter']}; {r['seconds']:.0f} s")
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

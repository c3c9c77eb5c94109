"""Cost estimates against measured times, on two model sizes: shapes-lm (638 k parameters) and a
random-weight model of Qwen2.5-0.5B's shape (24 layers, d = 896, 14/2 heads, 494 M parameters, built
from its config in memory; no download); for caption correction, the demo VLMs (shapes-vlm,
shapes-vlm-weak, with shapes-lm as decomposer/rewriter) and a random-weight LLaVA of the same LM shape
with a ViT-B/16-shaped CLIP tower (580 M parameters, its own LM as decomposer/rewriter).

    python benchmarks/cost_bench.py [--threads 2] [--skip-big] [--only captions|lm]

For each model: `analysis.framework.cost.calibrate` (a few tiny timed forwards), then small runs of the KV,
sharpness and prompt-reconstruction analyses (or the caption page's steps: caption, verification,
rewrite), each estimated first and then timed (on the small model after one untimed run, so that
lazy imports are not counted). Also prints the estimate for each page's default settings on the big
model (what the page shows before its Run button) without running them. Prints a markdown table,
writes benchmarks/results/cost_bench.json (with `--only`, the other part's rows are kept from the
previous file).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import RESULTS  # noqa: E402  (every project path comes from analysis/framework/paths.py)

from analysis import captions as C  # noqa: E402
from analysis.framework import cost  # noqa: E402
from analysis import inversion as inv  # noqa: E402
from analysis import kv  # noqa: E402
from analysis import sharpness as S  # noqa: E402
from analysis.model_access.models import ModelHandle, ModelSpec, describe, load_model, zoo_models  # noqa: E402
from analysis.model_access.tiny_models import LLAVA_TEMPLATE, default_words, family_words  # noqa: E402
from analysis.world.tokenizer import make_word_tokenizer  # noqa: E402

OUT = RESULTS / "cost_bench.json"


def qwen_half_b() -> ModelHandle:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32_768,
                      tie_word_embeddings=True, attn_implementation="eager")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    words = [str(i) for i in range(100)] + default_words(400) + ["Numbers:", "The", "largest", "number", "is"]
    tok = make_word_tokenizer(words)
    return ModelHandle(spec=ModelSpec("local", "qwen2.5-0.5b-shape-random"), model=model, kind="causal_lm",
                       info=describe(model, "causal_lm"), language_model=model, tokenizer=tok)


QWEN_HALF_B_TEXT = dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32_768,
                        tie_word_embeddings=True)
TEXT_CHAT = ("{% for m in messages %}USER: {{ m['content'] }} {% endfor %}"
             "{% if add_generation_prompt %}ASSISTANT:{% endif %}")


def llava_half_b() -> ModelHandle:
    """A LLaVA with Qwen2.5-0.5B's language model and a ViT-B/16-shaped CLIP tower (224 px, 196 patches),
    random weights. Its word tokenizer covers the whole vocabulary (so every generated id is a word),
    has "yes" and "no", and no Shapes World: the page's generic prompts, yes/no verifier and chat
    agents (`lm-chat`, through the tokenizer's chat template) run, with the VLM's own LM as
    decomposer/rewriter."""
    from transformers import (CLIPImageProcessorPil, CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor, Qwen2Config)

    from analysis.model_access.models import causal_lm_view

    base = family_words()
    fill = QWEN_HALF_B_TEXT["vocab_size"] - len(make_word_tokenizer(base, extra_special=["<image>"]))
    tok = make_word_tokenizer(base + [f"t{i}" for i in range(fill)], extra_special=["<image>"])
    tok.chat_template = TEXT_CHAT
    vision = CLIPVisionConfig(image_size=224, patch_size=16, hidden_size=768, intermediate_size=3072,
                              num_hidden_layers=12, num_attention_heads=12)
    text = Qwen2Config(**QWEN_HALF_B_TEXT, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_id=tok.convert_tokens_to_ids("<image>"),
                      vision_feature_select_strategy="default", vision_feature_layer=-1)
    for c in (cfg, cfg.vision_config, cfg.text_config):
        c._attn_implementation = "eager"
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(cfg).eval()
    images = CLIPImageProcessorPil(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
    processor = LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=16, num_additional_image_tokens=1,
                               vision_feature_select_strategy="default", image_token="<image>",
                               chat_template=LLAVA_TEMPLATE)
    return ModelHandle(spec=ModelSpec("local", "llava-qwen2.5-0.5b-shape-random"), model=model, kind="vlm",
                       info=describe(model, "vlm"), language_model=causal_lm_view(model), tokenizer=tok,
                       processor=processor)


def jobs(handle: ModelHandle) -> list[tuple[str, object, object]]:
    prompt = "1 2 3 4 5 6" if handle.info.parameters > 1e8 else "there is a large red circle"
    return [
        ("KV: every policy, 32-token context", kv.analyze,
         kv.KvParams(context=32, budget=12, new_tokens=4, policies=kv.policy_settings(snap_window=4, morph_window=4))),
        ("sharpness: n = 4, 8, 2 prompts each", S.size_sweep, S.SweepParams(ns=[4, 8], samples=2, batch=2)),
        ("reconstruction: 6 tokens, layer 2", inv.reconstruct, inv.AttackParams(prompt=prompt, layer=2)),
    ]


def page_defaults(handle: ModelHandle) -> list[tuple[str, object, object, dict]]:
    return [
        ("KV page default (192-token context)", kv.analyze, kv.KvParams(), {}),
        ("sharpness page default (32 prompts per n)", S.size_sweep, S.SweepParams(), {}),
        ("reconstruction, 12 tokens, middle layer", inv.reconstruct,
         inv.AttackParams(prompt=" ".join(str(i) for i in range(12)), layer=handle.info.layers // 2), {}),
    ]


def measure(name: str, handle: ModelHandle) -> list[dict]:
    rows = []
    t0 = time.perf_counter()
    throughput = cost.calibrate(handle)
    print(f"{name}: calibrated in {time.perf_counter() - t0:.1f} s: {throughput}", file=sys.stderr, flush=True)
    for label, fn, params in jobs(handle):
        if handle.info.parameters < 1e8:
            fn(handle, params)  # first call: lazy imports and allocations (the big model runs after these)
        estimate = cost.estimate(fn, handle, params)
        t1 = time.perf_counter()
        fn(handle, params)
        measured = time.perf_counter() - t1
        rows.append({"model": name, "analysis": label, "estimate_s": round(estimate.seconds, 2),
                     "measured_s": round(measured, 2), "ratio": round(measured / estimate.seconds, 2)})
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


SCENE = 20_000_003  # the caption page's default scene (test split + 3)


class CaptionBench:
    """Estimate, then time, caption-correction steps (rows like `measure`'s)."""

    def __init__(self, name: str) -> None:
        self.name, self.rows = name, []

    def step(self, label: str, fn, handle: ModelHandle, params, kwargs: dict, run, warm: bool = False):
        """`warm` (the demo models, well under a second a step): one untimed run first (lazy imports and
        allocations), then the median of three timed runs."""
        if warm:
            run()
        estimate = cost.estimate(fn, handle, params, kwargs)
        times = []
        for _ in range(3 if warm else 1):
            t0 = time.perf_counter()
            result = run()
            times.append(time.perf_counter() - t0)
        measured = sorted(times)[len(times) // 2]
        self.rows.append({"model": self.name, "analysis": label, "estimate_s": round(estimate.seconds, 2),
                          "measured_s": round(measured, 2), "ratio": round(measured / estimate.seconds, 2)})
        print(self.rows[-1], file=sys.stderr, flush=True)
        return result


def demo_captions() -> list[dict]:
    """The caption page's default view on the demo zoo: the weak captioner's caption, verified by
    shapes-vlm with the shapes-lm decomposer and grounding (8 IG steps), rewritten by shapes-lm."""
    vlm, weak, lm = (load_model(ModelSpec("zoo", n)) for n in ("shapes-vlm", "shapes-vlm-weak", "shapes-lm"))
    for h in (vlm, weak, lm):
        cost.calibrate(h)
    bench = CaptionBench("shapes-vlm (959 k) + shapes-lm")
    p = C.SceneCaptionParams(scene_seed=SCENE)
    caption = bench.step("caption (weak captioner, up to 96 tokens)", C.caption_scene, weak, p, {},
                         lambda: C.caption_scene(weak, p), warm=True).text
    bench.step("caption (shapes-vlm, up to 96 tokens)", C.caption_scene, vlm, p, {},
               lambda: C.caption_scene(vlm, p), warm=True)
    params = C.CorrectionParams(caption=caption, scene_seed=SCENE, ground=True)
    vp = C.verification_params(params)
    verification = bench.step("verify: shapes-lm decomposer, 9 claims, grounded", C.verify_scene, vlm, vp,
                              {"lm": lm}, lambda: C.verify_scene(vlm, vp, lm=lm), warm=True)
    dropped = sum(v.flagged for v in C.flag_claims(verification, params))
    bench.step(f"rewrite: shapes-lm, {dropped} of {len(verification.claims)} claims dropped", C.apply_threshold, lm, params, {"verification": verification},
               lambda: C.apply_threshold(verification, params, lm), warm=True)
    return bench.rows


def big_captions(vlm: ModelHandle) -> tuple[list[dict], list[dict]]:
    """The caption steps on the 0.5 B VLM, its own LM as decomposer/rewriter (lm-chat agents)."""
    t0 = time.perf_counter()
    cost.calibrate(vlm)
    print(f"0.5 B VLM: calibrated in {time.perf_counter() - t0:.1f} s: {cost.calibrate(vlm)}", file=sys.stderr)
    bench = CaptionBench(f"LLaVA, Qwen2.5-0.5B LM + ViT-B/16 tower ({vlm.info.parameters / 1e6:.0f} M)")
    world = C.shapes_world()
    scene = world.generate_scene(SCENE)
    caption = world.caption(scene)  # 3 objects, 9 claims (the random model's own caption is noise)
    p = C.SceneCaptionParams(scene_seed=SCENE, max_new_tokens=32)
    bench.step("caption, 32 tokens", C.caption_scene, vlm, p, {}, lambda: C.caption_scene(vlm, p))
    grammar = C.CorrectionParams(caption=caption, scene_seed=SCENE, decomposer="grammar", rewriter="lm-chat",
                                 ground=False)
    verification = bench.step("verify: grammar decomposer, 9 claims", C.verify_scene, vlm, grammar, {"lm": vlm},
                              lambda: C.verify_scene(vlm, grammar, lm=vlm))
    chat = C.CorrectionParams(**{**vars(grammar), "decomposer": "lm-chat"})
    found = bench.step("verify: lm-chat decomposer (200 tokens) + its claims", C.verify_scene, vlm, chat,
                       {"lm": vlm}, lambda: C.verify_scene(vlm, chat, lm=vlm))
    bench.rows[-1]["analysis"] += f" (estimate assumes the grammar's 9, it found {len(found.claims)})"
    one = world.caption(world.Scene(objects=scene.objects[:1], seed=-1))
    grounded = C.CorrectionParams(caption=one, scene_seed=SCENE, decomposer="grammar", ground=True, ig_steps=2)
    bench.step("verify: 3 claims, grounded (2 IG steps)", C.verify_scene, vlm, grounded, {"lm": vlm},
               lambda: C.verify_scene(vlm, grounded, lm=vlm))
    strict = C.CorrectionParams(**{**vars(grammar), "pi": 0.0})  # every claim dropped: the LM rewrites
    bench.step("rewrite: lm-chat (200 tokens)", C.apply_threshold, vlm, strict, {"verification": verification},
               lambda: C.apply_threshold(verification, strict, vlm))
    page = C.CorrectionParams(caption=caption, scene_seed=SCENE, ground=False)  # the page's defaults above 50 M
    defaults = []
    for label, fn, params, kwargs in [
        ("caption page: caption (96 tokens)", C.caption_scene, C.SceneCaptionParams(scene_seed=SCENE), {}),
        ("caption page: verify (lm-chat decomposer, 9 claims)", C.verify_scene, C.verification_params(page),
         {"lm": vlm}),
        ("caption page: verify with grounding (8 IG steps)", C.verify_scene,
         C.verification_params(C.CorrectionParams(**{**vars(page), "ground": True})), {"lm": vlm}),
        ("caption page: rewrite (lm-chat, 200 tokens)", C.apply_threshold, strict, {"verification": verification}),
    ]:
        e = cost.estimate(fn, vlm, params, kwargs)
        defaults.append({"analysis": label, "estimate_s": round(e.seconds, 1), "asks_first": e.long})
    return bench.rows, defaults


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds < 1 else f"{seconds:.1f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--only", choices=["lm", "captions"], default=None,
                        help="run one part; the other part's rows are kept from the previous results file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    at_start = list(os.getloadavg())
    rows, defaults = [], []
    before = json.loads(OUT.read_text()) if OUT.exists() else {}
    if args.only == "captions":
        rows += [r for r in before.get("rows", []) if not r.get("captions")]
        defaults += [d for d in before.get("defaults", []) if not d.get("captions")]
    if args.only != "captions":
        if "shapes-lm" in zoo_models():
            rows += measure("shapes-lm", load_model(ModelSpec("zoo", "shapes-lm")))
        if not args.skip_big:
            big = qwen_half_b()
            rows += measure(f"Qwen2.5-0.5B shape ({big.info.parameters / 1e6:.0f} M)", big)
            for label, fn, params, kwargs in page_defaults(big):
                e = cost.estimate(fn, big, params, kwargs)
                defaults.append({"analysis": label, "estimate_s": round(e.seconds, 1), "asks_first": e.long})
            del big
    if args.only != "lm":
        part = []
        if {"shapes-vlm", "shapes-vlm-weak", "shapes-lm"} <= set(zoo_models()):
            part += demo_captions()
        if not args.skip_big:
            big_rows, big_defaults = big_captions(llava_half_b())
            part += big_rows
            defaults += [{**d, "captions": True} for d in big_defaults]
        rows += [{**r, "captions": True} for r in part]
    else:
        rows += [r for r in before.get("rows", []) if r.get("captions")]
        defaults += [d for d in before.get("defaults", []) if d.get("captions")]
    load = os.getloadavg()[0]
    print(f"\nMachine: {os.cpu_count()} cores, torch threads {args.threads}, load average {load:.1f}.\n")
    print("| model | analysis | estimate | measured | measured / estimate |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['analysis']} | {_s(r['estimate_s'])} | {_s(r['measured_s'])} | {r['ratio']:.2f} |")
    if defaults:
        print("\n| 0.5 B model, page default | estimate | started on page load? |")
        print("|---|---|---|")
        for d in defaults:
            print(f"| {d['analysis']} | {cost.format_seconds(d['estimate_s'])} | "
                  f"{'no: estimate and Run button' if d['asks_first'] else 'yes'} |")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    this_run = {"load": load, "threads": args.threads, "when": now, "load_1_5_15_start": at_start,
                "load_1_5_15_end": list(os.getloadavg())}
    # the top-level load/threads/when describe the LM rows' run; "captions_run" the caption rows' run
    lm_run = {k: before[k] for k in ("load", "threads", "when") if k in before} if args.only == "captions" else this_run
    captions_run = before.get("captions_run", {}) if args.only == "lm" else this_run
    OUT.write_text(json.dumps({**{k: lm_run.get(k) for k in ("load", "threads")}, "rows": rows,
                               "defaults": defaults, "when": lm_run.get("when"), "captions_run": captions_run},
                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

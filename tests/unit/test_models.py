"""Loading: each kind loads, info is right, and every unsafe or bad input is refused clearly."""
from __future__ import annotations

import json
import shutil
import threading

import pytest
import torch

from analysis.model_access.models import ModelLoadError, ModelSpec, load_model


def test_llama_info_counts_grouped_kv_heads(tiny_llama):
    info = tiny_llama.info
    assert tiny_llama.kind == "causal_lm"
    assert (info.layers, info.heads, info.kv_heads, info.head_dim, info.hidden_size) == (2, 4, 2, 8, 32)
    assert info.parameters == sum(p.numel() for p in tiny_llama.model.parameters())
    assert info.max_positions == 512
    assert tiny_llama.model.config._attn_implementation == "eager"


def test_gpt2_info(tiny_gpt2):
    info = tiny_gpt2.info
    assert (info.architecture, info.layers, info.heads, info.kv_heads) == ("GPT2LMHeadModel", 2, 4, 4)
    assert info.vocab_size == len(tiny_gpt2.tokenizer)


def test_vlm_loads_with_processor_and_language_model_view(tiny_llava):
    h = tiny_llava
    assert h.kind == "vlm" and h.processor is not None
    assert h.info.image_tokens == 16 and h.info.image_size == 32
    ids = torch.tensor([[5, 6, 7, 8]])
    with h.session():
        direct = h.model(input_ids=ids).logits
        via_lm = h.language_model(input_ids=ids).logits
    assert torch.equal(direct, via_lm)
    # the view shares weights with the VLM: no copy
    assert h.language_model.lm_head.weight.data_ptr() == h.model.lm_head.weight.data_ptr()


def test_spec_parse_round_trip():
    assert ModelSpec.parse("hub:gpt2@main") == ModelSpec("hub", "gpt2", "main")
    assert ModelSpec.parse("shapes-lm") == ModelSpec("zoo", "shapes-lm")
    assert ModelSpec.parse("local:/a/b").name == "/a/b"
    spec = ModelSpec("hub", "owner/name", "v1")
    assert ModelSpec.parse(spec.label) == spec
    assert ModelSpec.from_dict(spec.to_dict()) == spec


def _refused(spec: ModelSpec) -> str:
    with pytest.raises(ModelLoadError) as err:
        load_model(spec)
    return str(err.value)


def test_refuses_nonexistent_path(model_root):
    assert "No such folder" in _refused(ModelSpec("local", str(model_root / "missing")))


def test_refuses_folder_outside_roots(tmp_path_factory, model_root):
    outside = tmp_path_factory.mktemp("elsewhere")
    assert "outside the folders" in _refused(ModelSpec("local", str(outside)))
    assert "outside the folders" in _refused(ModelSpec("local", str(model_root / ".." / "..")))


def test_refuses_pickle_only_weights(tiny_llama_dir, model_root):
    folder = model_root / "pickle-only"
    shutil.copytree(tiny_llama_dir, folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    torch.save({}, folder / "pytorch_model.bin")
    assert "pickle" in _refused(ModelSpec("local", str(folder)))


def test_refuses_config_requiring_remote_code(tiny_llama_dir, model_root):
    folder = model_root / "remote-code"
    shutil.copytree(tiny_llama_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(cfg))
    assert "trust_remote_code=False" in _refused(ModelSpec("local", str(folder)))


def test_refuses_over_limit_parameter_count(tiny_llama_dir, monkeypatch):
    monkeypatch.setenv("MODEL_INSPECTOR_MAX_PARAMS", "1000")
    msg = _refused(ModelSpec("local", str(tiny_llama_dir)))
    assert "above this server's limit" in msg


@pytest.mark.parametrize("bad", ["../etc/passwd", "a b", "owner/name/extra", "", "-bad", "x" * 200])
def test_refuses_malformed_hub_id(bad):
    assert "not a valid Hugging Face model id" in _refused(ModelSpec("hub", bad))


def test_refuses_uncached_hub_id_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    msg = _refused(ModelSpec("hub", "someone/model-that-is-not-cached"))
    assert "not in the local Hugging Face cache" in msg


def test_refuses_unknown_zoo_model():
    assert "is not a zoo model" in _refused(ModelSpec("zoo", "no-such-model"))


def test_patch_restores_model_even_on_error(tiny_llama):
    h = tiny_llama
    ids = torch.tensor([[5, 6, 7]])
    with h.session():
        before = h.model(input_ids=ids).logits.clone()
    with pytest.raises(RuntimeError):
        with h.patch() as p:
            p.hook(h.model.model.layers[0], lambda m, a, out: out * 0)
            p.attn_implementation(h.model, "sdpa")
            with torch.no_grad():
                patched = h.model(input_ids=ids).logits
            assert not torch.allclose(patched, before)
            raise RuntimeError("boom")
    with h.session():
        after = h.model(input_ids=ids).logits
    assert torch.equal(before, after)
    assert h.model.config._attn_implementation == "eager"


def test_patch_setattr_leaves_no_copy_of_a_class_attribute_on_the_instance(tiny_llama):
    """A patched method (an attention module's `forward`) is undone by deleting the instance's value, so
    the module reads its class's method again, not a bound copy the next patch takes for someone else's;
    an instance's own value and a data descriptor's (a config's attention setting) come back as they were."""
    h = tiny_llama
    attn = h.model.model.layers[0].self_attn
    own = h.model.model.layers[1].self_attn
    own.forward = own.forward  # an instance value of its own (as accelerate's device hooks set)
    try:
        with h.patch() as p:
            p.setattr(attn, "forward", lambda *a, **k: None)
            p.setattr(own, "forward", lambda *a, **k: None)
            p.attn_implementation(h.model, "sdpa")
            assert "forward" in vars(attn)
        assert "forward" not in vars(attn)
        assert vars(own)["forward"].__func__ is type(own).forward
        assert h.model.config._attn_implementation == "eager"
    finally:
        vars(own).pop("forward", None)


def test_patched_and_unpatched_forwards_never_mix(tiny_llama):
    """One thread runs a patched forward, another plain ones; plain results never see the patch."""
    h = tiny_llama
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with h.session():
        reference = h.model(input_ids=ids).logits.clone()
    bad: list[int] = []
    stop = threading.Event()

    def patched_loop():
        while not stop.is_set():
            with h.patch() as p:
                p.hook(h.model.model.layers[1], lambda m, a, out: out + 3.0)
                with torch.no_grad():
                    h.model(input_ids=ids)

    def plain_loop():
        for i in range(60):
            with h.session():
                out = h.model(input_ids=ids).logits
            if not torch.equal(out, reference):
                bad.append(i)

    t1 = threading.Thread(target=patched_loop)
    t1.start()
    try:
        plain_loop()
    finally:
        stop.set()
        t1.join()
    assert bad == []


def test_refuses_model_without_attention_layers(model_root, tiny_llama_dir):
    """A state-space model (Mamba) is a causal LM but has no attention for the panels to inspect."""
    from transformers import AutoTokenizer, MambaConfig, MambaForCausalLM

    folder = model_root / "tiny-mamba"
    if not folder.exists():
        config = MambaConfig(vocab_size=130, hidden_size=16, state_size=4, num_hidden_layers=1)
        MambaForCausalLM(config).save_pretrained(folder)
        AutoTokenizer.from_pretrained(tiny_llama_dir).save_pretrained(folder)
    assert "not a transformer with attention layers" in _refused(ModelSpec("local", str(folder)))

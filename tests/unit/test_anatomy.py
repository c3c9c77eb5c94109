"""analysis/model_access/anatomy.py against each family's own module paths and HF's own hidden states."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from analysis.model_access import anatomy
from analysis.model_access.models import ModelHandle, ModelLoadError, ModelSpec, describe
from analysis.model_access.tiny_models import build_tiny

# Written from each architecture's modeling file, independently of anatomy.py's search.
LAYER_PATHS = {
    "llama": "model.layers", "gpt2": "transformer.h", "gpt-neox": "gpt_neox.layers",
    "opt": "model.decoder.layers", "gemma2": "model.layers", "phi3": "model.layers",
    "llava": "model.language_model.layers", "idefics3": "model.text_model.layers",
    "gemma3": "model.language_model.layers", "paligemma": "model.language_model.layers",
    "qwen2-vl": "model.language_model.layers", "llava-next": "model.language_model.layers",
}
FINAL_NORMS = {"llama": "model.norm", "gpt2": "transformer.ln_f", "gpt-neox": "gpt_neox.final_layer_norm",
               "opt": "model.decoder.final_layer_norm", "llava": "model.language_model.norm"}


def _get(obj, path):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.fixture(scope="module")
def tiny():
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = build_tiny(family)
        return cache[family]
    return get


def _handle(model, tok, proc):
    kind = "vlm" if proc is not None else "causal_lm"
    return ModelHandle(spec=ModelSpec("local", "tiny"), model=model, kind=kind, info=describe(model, kind),
                       language_model=model, tokenizer=tok, processor=proc)


@pytest.mark.parametrize("family", sorted(LAYER_PATHS))
def test_decoder_layers_are_the_familys_own_block_list(tiny, family):
    model, _, _ = tiny(family)
    assert anatomy.decoder_layers(model) is _get(model, LAYER_PATHS[family])
    if family in FINAL_NORMS:
        assert anatomy.final_norm(model) is _get(model, FINAL_NORMS[family])
    assert anatomy.unembedding(model) is model.lm_head
    attn = anatomy.attention_modules(model)
    assert sorted(attn) == [0, 1]
    assert all(m in list(_get(model, LAYER_PATHS[family])[i].modules()) for i, m in attn.items())


@pytest.mark.parametrize("family", ["llama", "gpt2", "opt", "gpt-neox", "gemma2"])
def test_capture_records_layer_output_and_stops(tiny, family):
    model, tok, proc = tiny(family)
    handle = _handle(model, tok, proc)
    ids = tok(["w1 w2 w3 w4"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        reference = model(input_ids=ids, output_hidden_states=True).hidden_states
    ran_last = []
    first, last = anatomy.decoder_layers(model)[0], anatomy.decoder_layers(model)[-1]
    hooks_before = (len(first._forward_hooks), len(first._forward_pre_hooks))
    hook = last.register_forward_hook(lambda *a: ran_last.append(1))
    try:
        with torch.no_grad(), anatomy.capture(handle, 0) as cap:
            model(input_ids=ids)
            pytest.fail("the forward was not stopped")  # pragma: no cover
        with torch.no_grad(), anatomy.capture(handle, 0, before=True) as before:
            model(input_ids=ids)
    finally:
        hook.remove()
    assert not ran_last  # stopped after layer 0: the last layer never ran
    torch.testing.assert_close(cap.output, reference[1])  # hidden_states[1] = output of block 0
    torch.testing.assert_close(before.output, reference[0])  # the embeddings
    assert (len(first._forward_hooks), len(first._forward_pre_hooks)) == hooks_before  # hooks removed


def test_capture_without_stop_lets_the_forward_finish(tiny):
    model, tok, proc = tiny("llama")
    handle = _handle(model, tok, proc)
    ids = tok(["w1 w2"], return_tensors="pt")["input_ids"]
    with torch.no_grad(), anatomy.capture(handle, 1, stop=False) as cap:
        out = model(input_ids=ids)
    assert out.logits.shape[:2] == ids.shape and cap.output is not None


def test_head_layout_reads_gqa_and_sliding_windows(tiny):
    assert anatomy.head_layout(tiny("llama")[0]) == anatomy.HeadLayout(4, 2, 8, (None, None))
    assert anatomy.head_layout(tiny("gpt2")[0]).kv_heads == 4
    assert anatomy.head_layout(tiny("mistral-sliding")[0]).windows == (16, 16)
    assert anatomy.head_layout(tiny("mistral")[0]).windows == (None, None)
    gemma2 = anatomy.head_layout(tiny("gemma2")[0])
    assert gemma2.sliding_layers == [0] and gemma2.full_layers == [1] and gemma2.groups == 2


@pytest.mark.parametrize("family,token", [("llava", "<image>"), ("idefics3", "<image>"),
                                          ("gemma3", "<image_soft_token>"), ("paligemma", "<image>"),
                                          ("llava-next", "<image>")])
def test_image_tokens_come_from_config_and_processor(tiny, family, token):
    model, tok, proc = tiny(family)
    handle = _handle(model, tok, proc)
    assert anatomy.image_token_id(handle) == tok.convert_tokens_to_ids(token)
    text = "w1 w2"
    if proc.chat_template:
        text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
                                        add_generation_prompt=True, tokenize=False)
    enc = proc(images=[Image.new("RGB", (28, 28))], text=[text], return_tensors="pt")
    mask = anatomy.image_mask(handle, enc["input_ids"])
    grid = anatomy.patch_grid(handle, enc)
    assert int(mask.sum()) == grid.tokens >= grid.rows * grid.cols > 0
    with torch.no_grad(), anatomy.capture(handle, 0) as cap:
        model(**enc)
    assert cap.output.shape[1] == enc["input_ids"].shape[1]


def test_final_norm_scale_is_the_scale_the_norm_applies(tiny):
    for family in ("llama", "gemma2", "gpt2"):
        model, _, _ = tiny(family)
        norm = anatomy.final_norm(model)
        x = torch.randn(3, 32)
        with torch.no_grad():
            unit = norm(x) if family != "gpt2" else None
            if family == "gpt2":  # LayerNorm: scale * normalised + bias
                centred = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
                expected = centred * anatomy.final_norm_scale(model) + norm.bias
                torch.testing.assert_close(norm(x), expected, atol=1e-5, rtol=1e-5)
                continue
            rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # both configs use eps 1e-6
            torch.testing.assert_close(unit, rms * anatomy.final_norm_scale(model), atol=1e-5, rtol=1e-5)


def test_unknown_architecture_names_what_is_missing():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("C", (), {"get_text_config": lambda self: self, "architectures": ["OddModel"]})()
            self.body = torch.nn.Linear(2, 2)

    with pytest.raises(anatomy.AnatomyError, match="Could not find the text decoder of OddModel"):
        anatomy.decoder_layers(Odd())
    assert issubclass(anatomy.AnatomyError, ModelLoadError)  # the CLI and pages show it as one line


def test_layer_out_of_range_is_one_clear_message(tiny):
    model, _, _ = tiny("gpt2")
    with pytest.raises(anatomy.AnatomyError, match=r"Layer 7 is out of range: GPT2LMHeadModel has 2 decoder layers"):
        anatomy.check_layer(model, 7)
    assert anatomy.check_layer(model, 2, embeddings=True) == 2


def test_model_step_names_model_and_step():
    from analysis.framework.registry import SettingsError

    handle = type("H", (), {"spec": ModelSpec("local", "m"), "model": torch.nn.Linear(1, 1)})()
    with pytest.raises(anatomy.ModelRunError, match=r"^local:m failed while verifying claims: Image features and"):
        with anatomy.model_step(handle, "verifying claims"):
            raise ValueError("Image features and image tokens do not match:\n tokens: 4, features 16")
    with pytest.raises(SettingsError):  # already a user-facing message: unchanged
        with anatomy.model_step(handle, "x"):
            raise SettingsError("bad")


def test_cli_reports_an_error_inside_the_model_as_one_line(tmp_path, monkeypatch, capsys):
    """A processor that disagrees with its model (wrong patch size: 4 image tokens for 16 features)
    makes the forward raise; `python -m analysis sae` prints one `error:` line, no traceback."""
    import json

    from analysis.__main__ import main
    from analysis.model_access.tiny_models import save_tiny

    folder = save_tiny("llava", tmp_path / "llava")
    config = json.loads((folder / "processor_config.json").read_text())
    config["patch_size"] = 14
    (folder / "processor_config.json").write_text(json.dumps(config))
    monkeypatch.setenv("MODEL_INSPECTOR_ROOTS", str(tmp_path))
    code = main(["sae", "--model", f"local:{folder}", "--layer", "0", "--dataset", "noise", "--steps", "2",
                 "--train-pairs", "2", "--eval-pairs", "2", "--d-sae", "16", "--k", "2", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert "llava failed while collecting layer-0 activations" in errors[0]
    assert "Image features and image tokens do not match" in err


def test_nested_model_steps_name_the_step_the_user_asked_for():
    """A panel's step runs the backend's ("running the model"): the one line names the panel's step and
    keeps what the model said, and the model's own exception stays the cause."""
    from types import SimpleNamespace

    from analysis.framework.errors import ModelRunError

    handle = SimpleNamespace(spec=SimpleNamespace(label="zoo:m"))
    with pytest.raises(ModelRunError) as err:
        with anatomy.model_step(handle, "collecting layer-0 activations"):
            with anatomy.model_step(handle, "running the model"):
                raise RuntimeError("Image features and image tokens\n do not match")
    assert str(err.value) == ("zoo:m failed while collecting layer-0 activations: "
                              "Image features and image tokens do not match")
    assert isinstance(err.value.__cause__, RuntimeError)
    with pytest.raises(ModelRunError, match="^zoo:m failed while running the model: boom$"):
        with anatomy.model_step(handle, "running the model"):
            raise ValueError("boom")


def test_qwen2_vl_patch_grid_comes_from_image_grid_thw(tiny):
    model, tok, _ = tiny("qwen2-vl")
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    assert anatomy.image_token_id(model) == pad
    ids = torch.tensor([[2, pad, pad, pad, pad, 5, 6]])
    grid = anatomy.patch_grid(model, {"input_ids": ids, "image_grid_thw": torch.tensor([[1, 4, 4]])})
    assert grid == anatomy.ImageGrid(2, 2, 4)  # 4 x 4 patches merged 2 x 2


def test_task_provider_gives_shapes_world_tasks_only_to_its_tokenizers():
    from transformers import AutoTokenizer

    from analysis import tasks
    from analysis.model_access.models import ZOO_DIR
    from analysis.model_access.tiny_models import family_words, qwen2_char_tokenizer
    from analysis.world.tokenizer import make_word_tokenizer

    zoo = AutoTokenizer.from_pretrained(ZOO_DIR / "shapes-lm")
    assert tasks.tasks_for(zoo).name == "shapes-world" and tasks.tasks_for(zoo).sae_dataset == "shapes"
    assert tasks.tasks_for(zoo).retrieval_builder(zoo)(4, 0).format == "shapes-world"
    for tok in (make_word_tokenizer(family_words()), qwen2_char_tokenizer()):
        generic = tasks.tasks_for(tok)
        assert generic.name == "generic" and generic.reconstruction_prompt == tasks.PLAIN_PROMPT
        assert generic.retrieval_builder(tok)(4, 0).format in ("numbers", "vocabulary", "key-value recall")

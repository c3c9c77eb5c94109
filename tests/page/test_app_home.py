"""AppTest: the shell starts, the home page shows the model, bad picker inputs keep the old model."""
from __future__ import annotations

import pytest

from analysis.model_access.models import ModelSpec
from conftest import app_with_model


def _table_values(at) -> list[str]:
    df = at.table[0].value
    return [str(v) for v in df["value"].tolist()]


def test_home_renders_info_of_loaded_model(tiny_llama_dir):
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)))
    assert not at.exception
    assert at.title[0].value == "Model Inspector"
    values = _table_values(at)
    assert "LlamaForCausalLM" in values and "4 / 2" in values


def test_home_links_every_talk(tiny_llama_dir):
    from analysis import talks

    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)))
    line = next(m.value for m in at.markdown if m.value.startswith("**Give a talk**"))
    assert [f"(/?talk={t.name})" in line for t in talks.all_talks()] == [True] * len(talks.all_talks())
    assert "(/?talk=sae-features)" in line and "Saved analyses" in line


def _load_via_picker(at, source: str, **fields):
    at.sidebar.radio(key="picker_source").set_value(source).run()
    for key, value in fields.items():
        at.sidebar.text_input(key=key).set_value(value).run()
    at.sidebar.button(key="picker_load").click().run()
    return at


@pytest.mark.parametrize("source,fields,message", [
    ("local", {"picker_local": "/definitely/not/here"}, "outside the folders"),
    ("hub", {"picker_hub": "bad id with spaces"}, "not a valid Hugging Face model id"),
    ("hub", {"picker_hub": "someone/not-cached-model-xyz"}, "not in the local Hugging Face cache"),
    ("local", {"picker_local": ""}, "Enter a model id or folder first"),
])
def test_bad_picker_input_shows_error_and_keeps_model(tiny_llama_dir, source, fields, message):
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)))
    _load_via_picker(at, source, **fields)
    assert not at.exception
    errors = " ".join(e.value for e in at.error)
    assert message in errors
    assert at.session_state["model_spec"] == ModelSpec("local", "tiny-llama")  # the same folder, by its name
    assert "LlamaForCausalLM" in _table_values(at)


def test_pickle_only_folder_refused_in_picker(tiny_llama_dir, model_root):
    import shutil

    import torch

    folder = model_root / "pickle-only-ui"
    if not folder.exists():
        shutil.copytree(tiny_llama_dir, folder)
        for f in folder.glob("*.safetensors"):
            f.unlink()
        torch.save({}, folder / "pytorch_model.bin")
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)))
    _load_via_picker(at, "local", picker_local=str(folder))
    assert "pickle" in " ".join(e.value for e in at.error)
    assert "LlamaForCausalLM" in _table_values(at)


def test_loading_a_second_model_switches(tiny_llama_dir, tiny_gpt2_dir):
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)))
    _load_via_picker(at, "local", picker_local=str(tiny_gpt2_dir))
    assert not at.error
    assert "GPT2LMHeadModel" in _table_values(at)
    # the folder by its name under its allowed root: the server's path is on no screen and in no link
    assert at.query_params["model"] in (["local:tiny-gpt2"], "local:tiny-gpt2")
    shown = " ".join([c.value for c in at.sidebar.caption] + [h.value for h in at.subheader])
    assert "Loaded: **local:tiny-gpt2**" in shown and str(tiny_gpt2_dir.parent) not in shown


def test_picker_starts_on_the_model_named_in_the_url(tiny_llama_dir, tiny_gpt2_dir):
    at = app_with_model(None, query={"model": f"local:{tiny_gpt2_dir}"})
    assert not at.exception
    assert at.sidebar.radio(key="picker_source").value == "local"
    assert at.sidebar.text_input(key="picker_local").value == "tiny-gpt2"  # a full-path link, shown by name
    assert "GPT2LMHeadModel" in _table_values(at)


def test_a_folder_outside_the_allowed_roots_is_refused_with_the_variable_and_the_restart(tiny_llama_dir, tmp_path):
    at = app_with_model(ModelSpec("local", str(tiny_llama_dir)))
    _load_via_picker(at, "local", picker_local=str(tmp_path))
    said = " ".join(e.value for e in at.error).replace("\\", "")
    assert "MODEL_INSPECTOR_ROOTS" in said and "restart" in said, said

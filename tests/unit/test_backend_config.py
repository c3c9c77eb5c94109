"""The [backend] configuration section and the GPU placement rule (no GPU needed)."""
from __future__ import annotations

import pytest
import torch

from analysis.framework import config
from analysis.model_access.devices import placement


def test_backend_defaults_to_local_hooks():
    cfg = config.parse("")
    assert cfg.backend.kind == "local" and cfg.backend.remote_models == ()


def test_ndif_backend_with_its_models():
    cfg = config.parse('[backend]\nkind = "ndif"\nremote_models = ["meta-llama/Llama-3.1-70B"]\n'
                       'ndif_host = "https://api.ndif.us"\ntimeout_s = 120\n')
    assert cfg.backend.kind == "ndif" and cfg.backend.remote_models == ("meta-llama/Llama-3.1-70B",)
    assert cfg.backend.timeout_s == 120.0


@pytest.mark.parametrize("text, words", [
    ('kind = "cloud"', "backend.kind must be one of local, nnsight-local, ndif"),
    ('kind = "ndif"', "remote_models is empty"),
    ('ndif_host = "https://user:secret@api.ndif.us"', "never in a URL"),
    ('ndif_host = "https://api.ndif.us/?key=abc"', "never in a URL"),
    ('ndif_host = "ftp://api.ndif.us"', "http(s) address"),
    ('remote_models = ["../etc"]', "Hugging Face ids"),
    ('api_key = "abc"', "unknown setting"),
])
def test_bad_backend_settings_are_one_line_errors(text, words):
    with pytest.raises(config.ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")) as err:
        config.parse(f"[backend]\n{text}\n")
    assert "\n" not in str(err.value) and "user:secret" not in str(err.value) and "key=abc" not in str(err.value)


def test_placement_on_cpu_one_gpu_and_several(monkeypatch):
    monkeypatch.delenv("MODEL_INSPECTOR_GPU_DTYPE", raising=False)
    assert placement("float32", devices=0) == {"dtype": torch.float32}
    assert placement("float32", devices=1, bf16=True) == {"dtype": torch.bfloat16, "device_map": {"": 0}}
    assert placement("float32", devices=4, bf16=True) == {"dtype": torch.bfloat16, "device_map": "auto"}
    assert placement("float32", devices=2, bf16=False)["dtype"] == torch.float16
    assert placement("float16", devices=2, bf16=True)["dtype"] == torch.float16  # asked for: kept
    monkeypatch.setenv("MODEL_INSPECTOR_GPU_DTYPE", "float32")
    assert placement("float32", devices=1, bf16=True)["dtype"] == torch.float32


def test_gpu_dtype_is_checked_on_a_cpu_machine_too(monkeypatch, caplog):
    from analysis.framework.errors import ModelLoadError
    from analysis.model_access import devices

    monkeypatch.setenv("MODEL_INSPECTOR_GPU_DTYPE", "fp16")
    with pytest.raises(ModelLoadError, match="MODEL_INSPECTOR_GPU_DTYPE='fp16' is not one of float32, float16, bfloat16"):
        placement("float32", devices=0)
    with pytest.raises(ModelLoadError, match="fp16"):
        placement("float16", devices=1, bf16=True)  # a spec's own dtype does not hide a bad setting either
    monkeypatch.setenv("MODEL_INSPECTOR_GPU_DTYPE", "float16")
    monkeypatch.setattr(devices, "_said", set())
    with caplog.at_level("WARNING", logger="analysis.model_access.devices"):
        assert placement("float32", devices=0) == {"dtype": torch.float32}  # the CPU keeps the spec's dtype
        assert placement("float32", devices=0) == {"dtype": torch.float32}
    notes = [r.getMessage() for r in caplog.records if r.name == "analysis.model_access.devices"]
    assert notes == ["MODEL_INSPECTOR_GPU_DTYPE=float16 has no effect here: this machine has no CUDA GPU, so no GPU "
                     "placement happens and models load on the CPU in the dtype they ask for (float32 by default)."]

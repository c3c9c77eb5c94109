"""On a CUDA machine: one tiny model per family loads with the GPU placement rule (bfloat16 where
supported; device_map "auto" over several GPUs) and both backends capture the same values, on the CPU.
Skipped without CUDA (this project's CI machines have none)."""
from __future__ import annotations

import pytest
import torch

from analysis import backends
from analysis.backends import Request, Site
from analysis.model_access.models import ModelSpec, load_model
from analysis.model_access.tiny_models import FAMILIES, save_tiny

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("family", [f for f, (kind, _) in FAMILIES.items() if kind == "causal_lm"]
                         + ["llava", "qwen2-vl", "gemma3"])
def test_family_runs_on_the_gpu_through_both_backends(family, model_root):
    handle = load_model(ModelSpec("local", str(save_tiny(family, model_root / f"gpu-{family}"))))
    assert handle.device.type == "cuda"
    if torch.cuda.is_bf16_supported():
        assert handle.info.dtype == "bfloat16"
    if torch.cuda.device_count() > 1:
        assert getattr(handle.model, "hf_device_map", None)
    ids = torch.randint(5, min(handle.info.vocab_size, 100), (2, 9))
    sites = (Site("block_out", 0), Site("attn_out", handle.info.layers - 1))
    request = Request(inputs={"input_ids": ids}, reads=sites, logits=1, root="language_model")
    got = {}
    for name in ("local", "nnsight-local"):
        with backends.using(name):
            got[name] = backends.run(handle, request)
    for site in sites:
        assert got["local"][site].device.type == "cpu"
        assert torch.equal(got["local"][site], got["nnsight-local"][site])
    assert torch.equal(got["local"].logits, got["nnsight-local"].logits)

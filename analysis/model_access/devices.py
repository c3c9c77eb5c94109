"""Where a local model's weights go on this machine: the CPU, one GPU, or several (accelerate's
device map), and in which dtype. Read by `analysis.model_access.models.load_model`."""
from __future__ import annotations

import os
from typing import Any

import torch

from analysis.framework.errors import ModelLoadError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
GPU_DTYPE_ENV = "MODEL_INSPECTOR_GPU_DTYPE"


def placement(dtype: str, devices: int | None = None, bf16: bool | None = None) -> dict[str, Any]:
    """`dtype` and `device_map` for from_pretrained on this machine. CPU: the spec's dtype, no map. CUDA:
    one GPU holds the model (`{"": 0}`), several share it layer by layer (`"auto"`, accelerate); the
    default float32 becomes bfloat16 where the GPU supports it (else float16) unless
    $MODEL_INSPECTOR_GPU_DTYPE names another (e.g. float32); a spec asking float16/bfloat16 keeps it."""
    if devices is None:
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if devices == 0:
        return {"dtype": DTYPES[dtype]}
    if dtype == "float32":
        if bf16 is None:
            bf16 = torch.cuda.is_bf16_supported()
        dtype = os.environ.get(GPU_DTYPE_ENV, "").strip() or ("bfloat16" if bf16 else "float16")
        if dtype not in DTYPES:
            raise ModelLoadError(f"{GPU_DTYPE_ENV}={dtype!r} is not one of {', '.join(DTYPES)}.")
    return {"dtype": DTYPES[dtype], "device_map": "auto" if devices > 1 else {"": 0}}

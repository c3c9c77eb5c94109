"""Where a local model's weights go on this machine: the CPU, one GPU, or several (accelerate's
device map), and in which dtype. Read by `analysis.model_access.models.load_model`."""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

import torch

from analysis.framework.errors import ModelLoadError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
GPU_DTYPE_ENV = "MODEL_INSPECTOR_GPU_DTYPE"
_log = logging.getLogger(__name__)
_said: set[str] = set()  # the CPU-only notes already logged, one per value
_said_lock = threading.Lock()


def gpu_dtype_setting() -> str | None:
    """$MODEL_INSPECTOR_GPU_DTYPE, checked on every machine (a typo is an error on a CPU-only one too, not a
    surprise the day a GPU arrives): None when unset, else one of DTYPES."""
    value = os.environ.get(GPU_DTYPE_ENV, "").strip()
    if value and value not in DTYPES:
        raise ModelLoadError(f"{GPU_DTYPE_ENV}={value!r} is not one of {', '.join(DTYPES)}.")
    return value or None


def cpu_only_note(setting: str) -> str:
    return (f"{GPU_DTYPE_ENV}={setting} has no effect here: this machine has no CUDA GPU, so no GPU placement "
            "happens and models load on the CPU in the dtype they ask for (float32 by default).")


def placement(dtype: str, devices: int | None = None, bf16: bool | None = None) -> dict[str, Any]:
    """`dtype` and `device_map` for from_pretrained on this machine. CPU: the spec's dtype, no map. CUDA:
    one GPU holds the model (`{"": 0}`), several share it layer by layer (`"auto"`, accelerate); the
    default float32 becomes bfloat16 where the GPU supports it (else float16) unless
    $MODEL_INSPECTOR_GPU_DTYPE names another (e.g. float32); a spec asking float16/bfloat16 keeps it. The variable is checked on every machine; on one without a GPU
    a set value is logged once as having no effect."""
    setting = gpu_dtype_setting()
    if devices is None:
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if devices == 0:
        if setting:
            with _said_lock:
                first = setting not in _said
                _said.add(setting)
            if first:
                _log.warning(cpu_only_note(setting))
        return {"dtype": DTYPES[dtype]}
    if dtype == "float32":
        if bf16 is None:
            bf16 = torch.cuda.is_bf16_supported()
        dtype = setting or ("bfloat16" if bf16 else "float16")
    return {"dtype": DTYPES[dtype], "device_map": "auto" if devices > 1 else {"": 0}}

"""What the SAE-V demo benchmarks share: the demo VLM with its committed SAE, and a rank correlation.
Imported by benchmarks/sae_v_steering.py, sae_v_pairs.py and sae_v_token_top.py (not run on its own)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout goes on the path first
from analysis.framework.paths import SAE_STORES  # noqa: E402  (every project path comes from analysis/framework/paths.py)

MODEL = "zoo:shapes-vlm"
SAE = "analysis/zoo/sae/shapes-vlm/layer1"


def demo():
    """(handle, SAE folder, SAE as a Codec, its meta) of the demo VLM and its committed layer-1 SAE, on one
    CPU thread (the benchmarks record wall times)."""
    import torch

    from analysis import sae_v
    from analysis.model_access.models import ModelSpec, load_model

    torch.set_num_threads(1)
    handle = load_model(ModelSpec.parse(MODEL))
    folder = SAE_STORES / "shapes-vlm" / "layer1"
    sae, meta = sae_v.load_sae(folder)
    return handle, folder, sae, meta


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (ties get their mean rank)."""
    def ranks(xs):
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        r = [0.0] * len(xs)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / den if den else 1.0


def write(out: dict, path: str, start: float) -> int:
    """Record the wall time, write the result as JSON and show it."""
    out["seconds"] = round(time.perf_counter() - start, 1)
    Path(path).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0

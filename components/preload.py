"""Import every heavy module a page may need, once, before any page runs.

Streamlit runs each session's script in its own thread. When two sessions import a heavy package for
the first time at the same moment (pandas from a plotly figure, a transformers class on first use),
one of them can get the half-initialised module: `partially initialized module 'pandas' has no
attribute 'Series'`, `cannot import name 'AutoConfig' from 'transformers'`. app.py imports this
module first; Python's import lock on this module makes every other session wait until the whole
list below is loaded, and the pages then find everything in `sys.modules`.
"""
from __future__ import annotations

import gc
import importlib
import json
import pkgutil
import time

# Packages and modules a page, a figure or an analysis imports (directly or lazily).
MODULES = [
    "numpy", "pandas", "pyarrow", "pyarrow.parquet", "PIL.Image", "PIL.ImageDraw",
    "plotly.graph_objects", "plotly.subplots", "plotly.io", "plotly.offline",
    "torch", "torch.nn.functional", "safetensors.torch", "tokenizers",
    "huggingface_hub", "huggingface_hub.errors",
    "transformers", "transformers.cache_utils", "transformers.masking_utils",
    "captum.attr", "sae_lens", "sae_lens.config", "sae_lens.saes.sae",
    "analysis.framework.registry", "analysis.framework.results", "analysis.model_access.models", "analysis.hosting.export", "analysis.hosting.store",
    "analysis.model_access.anatomy", "analysis.world.shapes_world", "analysis.world.concepts",
    "components.common", "components.runs", "components.share",
]


def _project_modules() -> list[str]:
    """Every panel's package (the panel table) and every figure module (components/figures/)."""
    from analysis.framework import panels
    from components import figures

    return [e.module for e in panels.TABLE] + [
        f"components.figures.{m.name}" for m in pkgutil.iter_modules(figures.__path__)]

# transformers resolves these lazily on first attribute access: resolve them here instead.
TRANSFORMERS_NAMES = [
    "AutoConfig", "AutoTokenizer", "AutoProcessor", "AutoModelForCausalLM", "AutoModelForImageTextToText",
    "MODEL_FOR_CAUSAL_LM_MAPPING", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING", "PreTrainedTokenizerFast",
    "DynamicCache", "AttentionInterface",
    "LlamaForCausalLM", "LlamaConfig", "GPT2LMHeadModel", "GPT2Config", "MistralForCausalLM", "Qwen2ForCausalLM",
    "LlavaForConditionalGeneration", "LlavaConfig", "LlavaProcessor", "CLIPVisionModel", "CLIPVisionConfig",
    "CLIPImageProcessor", "CLIPImageProcessorFast",
]

FAILED: list[str] = []  # names that could not be imported here (optional extras); pages report their own errors


def _zoo_names() -> list[str]:
    """Model, processor and image-processor classes named by the installed demo models' configs."""
    from analysis.model_access.models import ZOO_DIR

    names = []
    for config in sorted(ZOO_DIR.glob("*/config.json")) + sorted(ZOO_DIR.glob("*/processor_config.json")):
        try:
            data = json.loads(config.read_text())
        except (OSError, ValueError):
            continue
        names += data.get("architectures") or []
        names += [data[k] for k in ("processor_class", "image_processor_type") if isinstance(data.get(k), str)]
        names += [v["image_processor_type"] for v in data.values()
                  if isinstance(v, dict) and isinstance(v.get("image_processor_type"), str)]
    return names


def preload() -> float:
    """Import everything above; returns the seconds it took."""
    start = time.perf_counter()
    for name in MODULES + _project_modules():
        try:
            importlib.import_module(name)
        except Exception:  # an optional extra that is not installed: its page says so itself
            FAILED.append(name)
    import transformers

    for name in dict.fromkeys(TRANSFORMERS_NAMES + _zoo_names()):
        try:
            getattr(transformers, name)
        except Exception:
            FAILED.append(f"transformers.{name}")
    try:  # plotly builds its trace classes and validators on first use
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=1, cols=2)
        for trace in (go.Scatter(), go.Bar(), go.Heatmap(), go.Histogram(), go.Image()):
            fig.add_trace(trace, row=1, col=1)
        fig.update_layout(shapes=[{"type": "line"}], annotations=[{"text": ""}]).to_plotly_json()
    except Exception:
        FAILED.append("plotly figures")
    # Everything imported here lives as long as the server: move it out of the cyclic collector's
    # sight, so a full collection during a page run walks only what sessions created since.
    gc.collect()
    gc.freeze()
    return time.perf_counter() - start


def calibrate_zoo() -> dict[str, float]:
    """Measure this machine's speed on each demo model (analysis/framework/cost.py) while nobody is using it.

    scripts/serve.py calls this before the server listens. Otherwise the first estimate on a model is
    measured when a page first needs one, and when a room opens the app together that is beside five
    other script runs: the reading comes out tens of times too slow and a four-second analysis asks
    for a click (crowd_bench, six users: the shared H2O link showed an estimate instead of results).
    The readings are kept per model name and size, so they serve the copies the sessions load later.
    Returns seconds per model (load + measurement); a model that fails to load is skipped here and
    reports its own error on the page that asks for it."""
    import threading

    from analysis.framework import cost
    from analysis.model_access.models import ModelSpec, load_model, zoo_models

    seconds: dict[str, float] = {}

    def measure() -> None:
        for name in zoo_models():
            start = time.perf_counter()
            try:
                cost.calibrate(load_model(ModelSpec("zoo", name)))
            except Exception:
                continue
            seconds[name] = round(time.perf_counter() - start, 2)

    # In a thread of its own, never on the calling (server's main) thread: once the main thread has run
    # a torch forward (and owns an OpenMP team), every later forward in the sessions' script threads
    # ran about 2.7x slower on the 2-core machine (500 one-token calls of shapes-lm: 0.89 s -> 2.4 s;
    # the H2O link of crowd_bench alone: 4.9 s -> 13.5 s). A thread that has ended leaves no such effect.
    worker = threading.Thread(target=measure, name="calibrate-zoo")
    worker.start()
    worker.join()
    return seconds


SECONDS = preload()

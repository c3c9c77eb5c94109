"""Load a transformer safely and wrap it in a `ModelHandle`.

Safety is part of loading: `trust_remote_code=False` always, safetensors only, local folders only
under configured roots, and a parameter-count limit checked from the config (on the meta device)
before any weight is read. Every failure is a `ModelLoadError` whose message is meant for a user.

Analyses that change a shared model (hooks, attention functions, cache surgery) do it inside
`handle.patch()`, which holds the model's lock and undoes every change in `finally`. Plain forwards
use `handle.session()` (the same lock, no patches) so they never observe another session's patch.
The lock (`analysis/model_access/model_lock.py`) is served in arrival order and names its holder, so analyses
take it per chunk (a forward, a decode loop) and a waiting user sees what it is queued behind.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

import torch

from analysis.framework import paths
from analysis.framework import config
from analysis.model_access import devices
from analysis.framework.errors import ModelLoadError
from analysis.model_access.model_lock import ModelLock
from analysis.model_access.patch import Patch
from analysis.model_access.tokenizer_lock import guard as guard_tokenizers
from analysis.framework.results import Result

ZOO_DIR = paths.ZOO_MODELS
DEFAULT_MAX_PARAMS = 3_000_000_000
HUB_ID_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,95})(?:/[A-Za-z0-9](?:[A-Za-z0-9._-]{0,95}))?$")
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
DTYPES = devices.DTYPES

Source = Literal["zoo", "hub", "local"]
Kind = Literal["causal_lm", "vlm"]
KIND_NAMES = {"causal_lm": "a causal language model", "vlm": "a vision-language model"}
DEMO_MODELS = {"causal_lm": "shapes-lm", "vlm": "shapes-vlm"}  # the zoo model each kind's default views are made for


@dataclass(frozen=True)
class ModelSpec(Result):
    source: str = "zoo"  # "zoo" | "hub" | "local"
    name: str = "shapes-lm"  # zoo name, hub id or local path
    revision: str | None = None
    dtype: str = "float32"

    @property
    def label(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return f"{self.source}:{self.name}{rev}"

    @classmethod
    def parse(cls, text: str) -> "ModelSpec":
        """Parse 'source:name[@revision]' (the form used in URLs and the CLI); bare names are zoo."""
        source, sep, rest = text.partition(":")
        if not sep or source not in ("zoo", "hub", "local", "ndif"):
            source, rest = "zoo", text
        name, _, revision = rest.partition("@") if source in ("hub", "ndif") else (rest, "", "")
        return cls(source=source, name=name, revision=revision or None)


@dataclass
class ModelInfo(Result):
    architecture: str
    model_type: str
    kind: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    parameters: int
    dtype: str
    max_positions: int | None
    image_tokens: int | None = None
    image_size: int | None = None

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) pairs for an info card."""
        rows = [
            ("Architecture", self.architecture),
            ("Kind", {"causal_lm": "causal language model", "vlm": "vision-language model"}[self.kind]),
            ("Parameters", f"{self.parameters:,}"),
            ("Layers", str(self.layers)),
            ("Attention heads (query / key-value)", f"{self.heads} / {self.kv_heads}"),
            ("Head dim / hidden size", f"{self.head_dim} / {self.hidden_size}"),
            ("Vocabulary", f"{self.vocab_size:,}"),
            ("Max positions", str(self.max_positions) if self.max_positions else "unknown"),
            ("Dtype", self.dtype),
        ]
        if self.kind == "vlm":
            size = f"{self.image_size} px" if self.image_size else "any size"
            tokens = f"{self.image_tokens} image tokens" if self.image_tokens else "image tokens set by the size"
            rows.append(("Image", f"{size}, {tokens}"))
        return rows


@dataclass
class ModelHandle:
    """A loaded model plus what every panel needs to use it safely."""

    spec: ModelSpec
    model: torch.nn.Module
    kind: str
    info: ModelInfo
    language_model: torch.nn.Module  # a causal LM (with lm_head); for a VLM it shares its weights
    tokenizer: Any
    processor: Any = None
    path: str = ""
    processor_error: str = ""  # why a VLM loaded without its processor (its image panels then refuse)
    lock: ModelLock = field(default_factory=ModelLock, repr=False)  # reentrant, first come first served
    remote: Any = None  # an NDIF model (analysis/backends/ndif.py): weights elsewhere, `model` on meta

    def __post_init__(self) -> None:  # shared by every session's runs: their encoding is serialized
        guard_tokenizers(self.tokenizer, getattr(self.processor, "tokenizer", None))

    @property
    def device(self) -> torch.device:
        if self.remote is not None:  # inputs are prepared here and travel with the request
            return torch.device("cpu")
        return next(self.model.parameters()).device

    @contextlib.contextmanager
    def session(self) -> Iterator["ModelHandle"]:
        """Hold the model's lock for unpatched use (so no concurrent patch is observed)."""
        with self.lock, torch.no_grad():
            yield self

    @contextlib.contextmanager
    def patch(self) -> Iterator["Patch"]:
        """Hold the lock and collect temporary changes; all are undone on exit, even on error."""
        with self.lock:
            patch = Patch(self.lock)
            try:
                yield patch
            finally:
                patch.restore()


# ---------------------------------------------------------------------------------------------
# Resolving a spec to a local folder, with the safety checks


def allowed_roots() -> list[Path]:
    """Folders a local model may live under: $MODEL_INSPECTOR_ROOTS (os.pathsep list), else the
    deployment configuration's `models.local_folders`, else zoo + cwd."""
    env = os.environ.get("MODEL_INSPECTOR_ROOTS")
    try:
        configured = None if env else config.current().local_roots()
    except config.ConfigError as exc:
        raise ModelLoadError(f"This server's configuration is invalid: {exc}") from None
    if configured is not None:
        return configured
    roots = [Path(p) for p in env.split(os.pathsep) if p] if env else [ZOO_DIR, Path.cwd()]
    return [r.expanduser().resolve() for r in roots]


def max_params() -> int:
    """$MODEL_INSPECTOR_MAX_PARAMS, else the deployment configuration's `models.max_params`."""
    try:
        return config.current().models.max_params
    except config.ConfigError:
        return DEFAULT_MAX_PARAMS


def zoo_models() -> list[str]:
    """Names of the demo models that are present (a folder with config.json under the zoo)."""
    if not ZOO_DIR.is_dir():
        return []
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "config.json").is_file())


def real_zoo_models() -> list[str]:
    """Real trained models of the zoo that can be loaded here: converted already, or convertible at
    first load because their pinned package is installed (`analysis/model_access/real_models.py`)."""
    from analysis.model_access import real_models

    return real_models.available()


def all_zoo_models() -> list[str]:
    """Everything the zoo offers here: the demo models, then the real ones (the model picker's list)."""
    return zoo_models() + [n for n in real_zoo_models() if n not in zoo_models()]


def resolve_folder(spec: ModelSpec) -> Path:
    try:  # the deployment's allow-list, before anything is read or fetched
        refusal = config.current().model_refusal(spec.source, spec.name)
    except config.ConfigError as exc:
        raise ModelLoadError(f"This server's configuration is invalid: {exc}") from None
    if refusal:
        raise ModelLoadError(refusal)
    if spec.source == "zoo":
        from analysis.model_access import real_models

        if spec.name in real_models.REAL_MODELS:  # converted once, at first use; then loaded as any local folder
            return real_models.ensure(spec.name, progress=real_models.stderr_progress)
        names = zoo_models()
        if spec.name not in names:
            listed = ", ".join(all_zoo_models()) or "none are installed"
            raise ModelLoadError(f"'{spec.name}' is not a zoo model (available: {listed}).")
        return ZOO_DIR / spec.name
    if spec.source == "local":
        return _check_local(spec.name)
    if spec.source == "hub":
        return _fetch_hub(spec.name, spec.revision)
    raise ModelLoadError(f"Unknown model source '{spec.source}' (use zoo, hub or local).")


def _check_local(text: str) -> Path:
    if not text.strip():
        raise ModelLoadError("Enter the path of a local model folder.")
    given, roots = Path(text.strip()).expanduser(), allowed_roots()
    # a name as the app shows it (`local:my-model`): under the first root that has it
    under = [(r / given).resolve() for r in roots if not given.is_absolute() and (r / given).exists()]
    path = under[0] if under else given.resolve()
    if not any(path == r or r in path.parents for r in roots):
        shown = ", ".join(str(r) for r in roots)
        raise ModelLoadError(
            f"'{path}' is outside the folders models may be loaded from ({shown}). To allow it, start the "
            f"server with MODEL_INSPECTOR_ROOTS naming its parent folder (several separated by "
            f"'{os.pathsep}'), e.g. MODEL_INSPECTOR_ROOTS={path.parent} bash scripts/run_app.sh: the variable is read "
            "at start, so a running server must be restarted."
        )
    if not path.exists():
        raise ModelLoadError(f"No such folder: '{path}'.")
    if not path.is_dir():
        raise ModelLoadError(f"'{path}' is a file; choose the model's folder (save_pretrained layout).")
    return path


def _fetch_hub(repo_id: str, revision: str | None) -> Path:
    repo_id = repo_id.strip()
    if not HUB_ID_RE.match(repo_id) or ".." in repo_id:
        raise ModelLoadError(
            f"'{repo_id}' is not a valid Hugging Face model id (expected 'name' or 'owner/name')."
        )
    if revision is not None and not REVISION_RE.match(revision):
        raise ModelLoadError(f"'{revision}' is not a valid revision (branch, tag or commit).")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
    try:
        # Configuration and tokenizer first: the parameter limit is checked before any weights.
        folder = snapshot_download(
            repo_id, revision=revision, allow_patterns=[p for p in patterns if p != "*.safetensors"],
            local_files_only=offline,
        )
        _check_config(Path(folder))
        folder = snapshot_download(
            repo_id, revision=revision, allow_patterns=patterns, local_files_only=offline
        )
    except LocalEntryNotFoundError as exc:
        raise ModelLoadError(
            f"'{repo_id}' is not in the local Hugging Face cache and the Hub cannot be reached "
            "(offline). Download it on a connected machine, or pick a demo-zoo model."
        ) from exc
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise ModelLoadError(f"No accessible model '{repo_id}' on the Hugging Face Hub.") from exc
    except RevisionNotFoundError as exc:
        raise ModelLoadError(f"Model '{repo_id}' has no revision '{revision}'.") from exc
    except ModelLoadError:
        raise
    except Exception as exc:  # network errors and the like
        raise ModelLoadError(f"Could not fetch '{repo_id}' from the Hub: {type(exc).__name__}: {exc}") from exc
    return Path(folder)


def _read_config(folder: Path):
    from transformers import AutoConfig

    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"'{folder}' has no config.json, so it is not a Hugging Face model folder.")
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"config.json in '{folder}' is not valid JSON: {exc}") from exc
    if "auto_map" in raw:
        raise ModelLoadError(
            "This model needs custom code from its repository (config has 'auto_map'); "
            "Model Inspector never runs remote code (trust_remote_code=False)."
        )
    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except Exception as exc:
        raise ModelLoadError(f"Unsupported model configuration: {exc}") from exc


def _model_kind(config) -> Kind:
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    if type(config) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING and hasattr(config, "vision_config"):
        return "vlm"
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return "causal_lm"
    raise ModelLoadError(
        f"Model type '{config.model_type}' is neither a causal language model nor a "
        "vision-language (image-text-to-text) model, so no panel can use it."
    )


def count_parameters(config) -> int:
    """Parameter count of the architecture, built on the meta device (no memory, no weights)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if _model_kind(config) == "vlm" else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _check_config(folder: Path):
    config = _read_config(folder)
    n = count_parameters(config)
    if n > max_params():
        raise ModelLoadError(
            f"The model has about {n / 1e9:.2f} B parameters, above this server's limit of "
            f"{max_params() / 1e9:.2f} B (MODEL_INSPECTOR_MAX_PARAMS)."
        )
    return config, n


def _check_weights(folder: Path) -> None:
    files = [p.name for p in folder.iterdir() if p.is_file()]
    if any(f.endswith(".safetensors") for f in files):
        return
    if any(f.endswith(PICKLE_SUFFIXES) for f in files):
        raise ModelLoadError(
            "This checkpoint has only pickle weights (.bin/.pt), which can run arbitrary code when "
            "loaded. Model Inspector loads safetensors only: convert it with save_pretrained(..., "
            "safe_serialization=True)."
        )
    raise ModelLoadError(f"'{folder}' has no weights (*.safetensors).")


# ---------------------------------------------------------------------------------------------
# Loading


def load_model(spec: ModelSpec) -> ModelHandle:
    """Resolve, check and load a model. Raises ModelLoadError with a user-facing message."""
    if spec.source == "ndif":
        raise ModelLoadError(f"{spec.label} runs on NDIF: load it with analysis.backends.load (the model picker does).")
    folder = resolve_folder(spec)
    config, n_params = _check_config(folder)
    _check_weights(folder)
    kind = _model_kind(config)
    if spec.dtype not in DTYPES:
        raise ModelLoadError(f"Unknown dtype '{spec.dtype}' (use one of {', '.join(DTYPES)}).")
    kwargs: dict[str, Any] = dict(trust_remote_code=False, use_safetensors=True, attn_implementation="eager",
                                  **devices.placement(spec.dtype))
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    try:
        if kind == "vlm":
            model = AutoModelForImageTextToText.from_pretrained(folder, **kwargs)
            processor, processor_error = _load_processor(folder)
            tokenizer = processor.tokenizer if processor is not None else AutoTokenizer.from_pretrained(
                folder, trust_remote_code=False)
            language_model = causal_lm_view(model)
        else:
            model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
            processor, processor_error = None, ""
            tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
            language_model = model
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"Loading failed: {type(exc).__name__}: {exc}") from exc
    model.eval()
    try:
        info = describe(model, kind, n_params, processor)
    except (AttributeError, TypeError, ValueError) as exc:  # e.g. no attention heads (state-space models)
        raise ModelLoadError(
            f"'{spec.label}' loaded, but it is not a transformer with attention layers that the panels "
            f"can inspect ({type(exc).__name__}: {exc})."
        ) from exc
    return ModelHandle(
        spec=spec, model=model, kind=kind, info=info, language_model=language_model,
        tokenizer=tokenizer, processor=processor, path=str(folder), processor_error=processor_error,
    )


def _load_processor(folder: Path) -> tuple[Any, str]:
    """The VLM's processor, or (None, reason) when it needs torchvision and that is not installed
    (Qwen2-VL's video processor): the language-model panels still work on the model."""
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    try:
        return AutoProcessor.from_pretrained(folder, trust_remote_code=False), ""
    except Exception as exc:
        if is_torchvision_available() or not any(w in str(exc).lower() for w in ("video", "torchvision")):
            raise ModelLoadError(f"The model's processor could not be loaded: {type(exc).__name__}: {exc}") from exc
        return None, ("its processor needs torchvision (for its video processor), which is not installed "
                      "(the PyPI build of torchvision 0.28.0 needs CUDA torch)")


def causal_lm_view(vlm: torch.nn.Module) -> torch.nn.Module:
    """A `*ForCausalLM` whose decoder and lm_head are the VLM's own modules (shared weights)."""
    from transformers import AutoModelForCausalLM

    from analysis.model_access import anatomy

    text_config = vlm.config.get_text_config()
    try:
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(text_config, attn_implementation="eager")
    except ValueError:  # no *ForCausalLM for this text config (Qwen2-VL): the VLM's own decoder and head
        return DecoderWithHead(anatomy.decoder(vlm), anatomy.unembedding(vlm), text_config,
                               vlm.generation_config).eval()
    lm.model = anatomy.decoder(vlm)
    lm.lm_head = anatomy.unembedding(vlm)
    lm.config = text_config
    lm.generation_config = vlm.generation_config
    return lm.eval()


class DecoderWithHead(torch.nn.Module):
    """A causal LM made of a VLM's text decoder and lm_head, for text configs with no *ForCausalLM."""

    def __init__(self, decoder: torch.nn.Module, head: torch.nn.Module, config, generation_config) -> None:
        super().__init__()
        self.model, self.lm_head = decoder, head
        self.config, self.generation_config = config, generation_config

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def get_decoder(self) -> torch.nn.Module:
        return self.model

    def forward(self, input_ids=None, logits_to_keep: int = 0, **kwargs):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        out = self.model(input_ids=input_ids, **kwargs)
        hidden = out.last_hidden_state
        logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        return CausalLMOutputWithPast(logits=logits, past_key_values=out.past_key_values,
                                      hidden_states=out.hidden_states, attentions=out.attentions)


def describe(model: torch.nn.Module, kind: str, n_params: int | None = None, processor: Any = None) -> ModelInfo:
    from analysis.model_access import anatomy, processor_info

    cfg = model.config
    text = cfg.get_text_config()
    layout = anatomy.head_layout(model)
    hidden = int(getattr(text, "hidden_size", None) or text.n_embd)
    max_pos = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    image_size = image_tokens = None
    if kind == "vlm":
        measured = processor_info.image_geometry(model, processor)
        image_size, image_tokens = measured or (None, None)
        if image_size is None:  # no processor, or it resizes each image its own way: the tower's size
            image_size = int(getattr(cfg.vision_config, "image_size", 0) or 0) or None
        if measured is None:  # nothing to measure with: the tower's patch grid
            try:
                grid = anatomy.patch_grid(model)
                image_tokens = grid.rows * grid.cols
            except anatomy.AnatomyError:  # set by the image size (Qwen2-VL's dynamic resolution)
                image_tokens = None
    return ModelInfo(
        architecture=(cfg.architectures or [type(model).__name__])[0],
        model_type=cfg.model_type,
        kind=kind,
        layers=anatomy.n_layers(model),
        heads=layout.heads,
        kv_heads=layout.kv_heads,
        head_dim=layout.head_dim,
        hidden_size=hidden,
        vocab_size=int(text.vocab_size),
        parameters=int(n_params if n_params is not None else sum(p.numel() for p in model.parameters())),
        dtype=str(next(model.parameters()).dtype).replace("torch.", ""),
        max_positions=int(max_pos) if max_pos else None,
        image_tokens=image_tokens,
        image_size=image_size,
    )


def require_kind(handle: ModelHandle, *kinds: str, panel: str) -> None:
    """Raise a user-facing error when a panel gets a model kind it cannot use."""
    if handle.kind not in kinds:
        wanted = " or ".join(KIND_NAMES[k] for k in kinds)
        raise ModelLoadError(f"The {panel} panel needs {wanted}; '{handle.spec.label}' is a {handle.info.kind}.")


def cli(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m analysis info", description="Describe a model.")
    parser.add_argument("--model", default="zoo:shapes-lm", help="zoo:NAME, hub:ID[@REV] or local:PATH")
    parser.add_argument("--json", action="store_true", help="print the info as JSON")
    args = parser.parse_args(argv)
    handle = load_model(ModelSpec.parse(args.model))
    if args.json:
        print(json.dumps({"spec": handle.spec.to_dict(), "info": handle.info.to_dict()}, indent=2))
    else:
        for label, value in handle.info.rows():
            print(f"{label:38s} {value}")
    return 0

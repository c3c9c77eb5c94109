"""Models that run on NDIF: the remote handle, the API key, the job and its one-line errors.

A remote model is `ndif:owner/name` (the picker offers `[backend] remote_models`). Loading it reads
its config and tokenizer/processor only (the Hub or its local cache; never weights) and builds the
architecture on the meta device, so `analysis.model_access.anatomy` answers every question about it as for a local
model. Its requests are nnsight traces (`traced.trace`) sent to NDIF as non-blocking jobs: the job is
submitted, then polled every `poll_s` seconds; each poll reports to the page (the runner's queue line),
which is also where a Stop click ends the wait.

The API key comes from the environment (NDIF_API_KEY) or Streamlit's secrets file (`NDIF_API_KEY`, or
`api_key` under `[ndif]`), is handed to nnsight's transport for this one request (an HTTP header), and
is never stored on the handle, in a result, in an error message or in nnsight's own config file.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from analysis.framework import config
from analysis.backends.request import Captured, Request
from analysis.framework.errors import ModelLoadError, UserError

NAME = "ndif"
KEY_ENV = "NDIF_API_KEY"
DEFAULT_HOST = "https://api.ndif.us"
MODEL_CLASS = "nnsight.modeling.transformers.TransformersModel"  # the wrapper NDIF deployments are keyed by


class RemoteError(UserError):
    """NDIF could not run a request; the message says why in one line (never with the key)."""


@dataclass
class RemoteModel:
    """What a remote handle needs to send a trace: the deployment's key and an nnsight envoy of the meta
    model (its module paths are the deployment's)."""

    model_key: str
    envoy: Any
    env: dict

    def throughput(self, label: str):
        """The cost gate's speeds: every forward is one NDIF job of about `[backend] job_s` seconds
        (queueing and transfer dominate; the GPU work is small beside them), so an analysis of many
        forwards is estimated as that many jobs, and asks first like long local work."""
        from analysis.framework.cost import Throughput

        job = settings().job_s
        return Throughput(per_call=job, per_token=1e-6, per_pair=1e-9, per_logit=1e-7, model=label,
                          per_call_fixed=job)


# ---------------------------------------------------------------------------------------------
# Configuration: host, key, allowed models


def settings() -> config.Backend:
    try:
        return config.current().backend
    except config.ConfigError as exc:
        raise ModelLoadError(f"This server's configuration is invalid: {exc}") from None


def host() -> str:
    return settings().ndif_host or DEFAULT_HOST


def api_key() -> str:
    """The NDIF API key: $NDIF_API_KEY, else Streamlit's secrets file (./.streamlit, then ~/.streamlit)."""
    key = os.environ.get(KEY_ENV, "").strip()
    if key:
        return key
    for folder in (Path.cwd() / ".streamlit", Path.home() / ".streamlit"):
        try:
            secrets = tomllib.loads((folder / "secrets.toml").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        value = secrets.get(KEY_ENV) or (secrets.get("ndif") or {}).get("api_key")
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def refusal(name: str) -> str | None:
    """Why this instance will not run `name` on NDIF, in words for the visitor; None if it may."""
    backend = settings()
    if backend.kind != "ndif":
        return "This instance does not run models on NDIF ([backend] kind is not 'ndif')."
    if name not in backend.remote_models:
        offered = ", ".join(backend.remote_models) or "none"
        return f"'{name[:80]}' is not among the models this instance runs on NDIF ({offered})."
    return None


def require_key() -> str:
    key = api_key()
    if not key:
        raise RemoteError(f"No NDIF API key on this server: set {KEY_ENV} in its environment or in "
                          ".streamlit/secrets.toml (get one at https://login.ndif.us).")
    return key


# ---------------------------------------------------------------------------------------------
# Loading a remote model (config and tokenizer only)


def load_remote(spec, folder: str | Path | None = None):
    """A `ModelHandle` for `ndif:<hub id>` whose model lives on the meta device. `folder` (tests, a mirror)
    holds the config and tokenizer instead of the Hub."""
    from analysis.model_access import models

    why = refusal(spec.name)
    if why:
        raise ModelLoadError(why)
    source = Path(folder) if folder is not None else _config_files(spec.name, spec.revision)
    cfg = models._read_config(source)
    kind = models._model_kind(cfg)
    auto = _auto_class(kind)
    with torch.device("meta"):
        model = auto.from_config(cfg, attn_implementation="eager").eval()
    tokenizer, processor, processor_error = _preprocessors(source, kind)
    language_model = models.causal_lm_view(model) if kind == "vlm" else model
    n_params = sum(p.numel() for p in model.parameters())
    info = models.describe(model, kind, n_params, processor)
    remote = RemoteModel(model_key=model_key(spec.name, spec.revision, kind), envoy=_envoy(model),
                         env={"attn_implementation": "eager"})
    return models.ModelHandle(spec=spec, model=model, kind=kind, info=info, language_model=language_model,
                              tokenizer=tokenizer, processor=processor, path=f"ndif:{spec.name}",
                              processor_error=processor_error, remote=remote)


def model_key(repo_id: str, revision: str | None, kind: str) -> str:
    """The deployment's key, as nnsight's TransformersModel mints it (class path, then its JSON)."""
    task = "image-text-to-text" if kind == "vlm" else "text-generation"
    return f"{MODEL_CLASS}:{json.dumps({'repo_id': repo_id, 'revision': revision, 'task': task})}"


def _auto_class(kind: str):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if kind == "vlm" else AutoModelForCausalLM


def _envoy(model: torch.nn.Module):
    import nnsight

    return nnsight.NNsight(model)  # a meta model never runs here: instrumenting it changes nothing that runs


def _preprocessors(folder: Path, kind: str) -> tuple[Any, Any, str]:
    from transformers import AutoTokenizer

    from analysis.model_access import models

    if kind != "vlm":
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False), None, ""
    processor, error = models._load_processor(folder)
    tokenizer = processor.tokenizer if processor is not None else AutoTokenizer.from_pretrained(
        folder, trust_remote_code=False)
    return tokenizer, processor, error


def _config_files(repo_id: str, revision: str | None) -> Path:
    """The repo's config and tokenizer/processor files (never weights), from the Hub or its cache."""
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=offline,
                                      allow_patterns=["*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken"]))
    except Exception as exc:
        raise ModelLoadError(f"Could not read the configuration of '{repo_id}' from the Hugging Face Hub "
                             f"({type(exc).__name__}); the model runs on NDIF, but its config and tokenizer "
                             "are read here.") from exc


# ---------------------------------------------------------------------------------------------
# Running a request


@dataclass
class JobStatus:
    """What a waiting page shows (the runner's queue line calls `message()`)."""

    status: str
    seconds: float

    def message(self) -> str:
        return f"Running on NDIF: {self.status.lower()} for {self.seconds:.0f} s (remote jobs queue there)."


def run(handle, request: Request) -> Captured:
    """Send `request` to NDIF as one nnsight trace and wait for it (reporting every poll)."""
    from analysis.backends import traced
    from analysis.backends.plan import model_inputs, plan

    remote: RemoteModel = handle.remote
    key = require_key()
    root = handle.model  # NDIF runs the whole model; a VLM's text-only run is the VLM without images
    program = traced.build_program(remote.envoy, plan(root, request), request, root)
    inputs = model_inputs(request, torch.device("cpu"))
    with handle.lock:  # one job per model from this server: the meta envoy is not shared between traces
        backend = _backend(remote, key)
        with _failures(handle.spec.name, key):
            traced.trace(remote.envoy, inputs, program, request, backend=backend)  # submits the job
        results = _wait(backend, handle.spec.name, key)
    return traced.unpack(results["results"], request, root, NAME)


@contextlib.contextmanager
def _failures(name: str, key: str) -> Iterator[None]:
    """Anything the transport or NDIF raises becomes one `RemoteError` line."""
    try:
        yield
    except RemoteError:
        raise
    except Exception as exc:
        raise RemoteError(describe_failure(exc, name, key)) from None


def _backend(remote: RemoteModel, key: str):
    from nnsight.intervention.backends.remote import RemoteBackend

    backend = RemoteBackend(remote.model_key, host=host(), api_key=key, env=remote.env, blocking=False)
    backend.display.enabled = False  # status goes to the page, not to the server's terminal
    return backend


def _wait(backend, name: str, key: str) -> dict:
    """Poll the submitted job until its saves arrive; each poll is reported to the page, whose Stop
    raises out of `on_wait` and ends the wait (the job itself finishes on NDIF, unread)."""
    from analysis.model_access.model_lock import current_activity

    cfg = settings()
    _, on_wait = current_activity()
    start = time.monotonic()
    while True:
        with _failures(name, key):
            result = backend.poll()
        if result is not None:
            return result
        waited = time.monotonic() - start
        if waited > cfg.timeout_s:
            raise RemoteError(f"NDIF did not finish the job within {cfg.timeout_s:.0f} s ([backend] timeout_s); "
                              "it may still be queued there. Try again later, or with less work.")
        if on_wait is not None:
            on_wait(JobStatus(str(getattr(backend.status, "value", backend.status) or "submitted"), waited))
        time.sleep(cfg.poll_s)


def describe_failure(exc: BaseException, name: str, key: str) -> str:
    """One line for a failed remote request: unreachable, key refused, model not hosted, or NDIF's own
    message (with the key, should it appear, masked)."""
    import httpx

    cause = exc
    while cause.__cause__ is not None and not isinstance(cause, httpx.HTTPError):
        cause = cause.__cause__
    where = host()
    if isinstance(cause, httpx.HTTPStatusError):
        code = cause.response.status_code
        detail = _detail(cause.response)
        if code in (401, 403):
            return f"NDIF refused this server's API key (HTTP {code}): check {KEY_ENV}."
        if code == 404 or "not" in detail.lower() and ("deploy" in detail.lower() or "host" in detail.lower()):
            return f"NDIF does not host '{name}' right now ({_mask(detail, key) or f'HTTP {code}'})."
        return f"NDIF failed the request (HTTP {code}): {_mask(detail, key)}"
    if isinstance(cause, (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadTimeout, OSError)):
        return f"NDIF at {where} cannot be reached ({type(cause).__name__}); try again later."
    text = " ".join(str(exc).split()) or type(exc).__name__
    low = text.lower()
    if "not" in low and ("deploy" in low or "host" in low or "found" in low) and "model" in low:
        return f"NDIF does not host '{name}' right now: {_mask(text, key)}"
    return f"NDIF could not run the request: {_mask(text, key)[:300]}"


def _detail(response) -> str:
    try:
        body = response.json()
        return str(body.get("detail", body)) if isinstance(body, dict) else str(body)
    except ValueError:
        return response.text[:300]


def _mask(text: str, key: str) -> str:
    return text.replace(key, "***") if key else text

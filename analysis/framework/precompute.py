"""Results computed ahead of time and shipped on disk, so a panel's default view opens at once.

`python scripts/warm.py` opens every panel's default view (and each preset) once and stores every
analysis it ran under `analysis/precomputed/` — one small gzipped JSON file per run, committed.
A page asks `lookup(...)` before computing; an entry is used only when everything that determines
the result is the same:

- the analysis (`kind`) and the model's label,
- the settings (the params JSON) and the keyword arguments, byte for byte,
- the model's weights: the SHA-256 of its safetensors files (`weights_fingerprint`), recorded at
  warm time and recomputed here (cached per file size and modification time),
- for an analysis that also uses other models (`helpers`, e.g. caption correction's decomposer and
  captioner): each helper's label and weights, checked the same way,

so a stored result is never shown for another model, other weights or other settings. Each entry
also names the function that made it, so `recompute(entry)` can redo it (tests/page/test_precompute.py
checks stored results against fresh computations).
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import importlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from analysis.framework import paths

STORE_DIR = paths.PRECOMPUTED
FORMAT = 1
# Result fields that are wall-clock measurements: they differ between any two runs.
TIMING_FIELDS = frozenset({"seconds", "step_time", "time_ms", "decode_ms", "attack_seconds",
                           "exhaustive_seconds", "time_ratio", "exhaustive_seconds_total", "train_seconds",
                           "step_ms"})

_fingerprints: dict[tuple, str] = {}
_fp_lock = threading.Lock()
stats = {"hits": 0, "misses": 0}  # this process's lookups (the cold benchmark and tests read it)


@dataclass
class Entry:
    kind: str
    model: str  # the model's label, e.g. zoo:shapes-lm
    fingerprint: str  # sha256 of the model's safetensors files
    params: str  # the params JSON exactly as the page keyed it
    extra: str  # repr of the keyword arguments, exactly as the page keyed it
    function: str  # module:qualname of the analysis that produced the result
    params_type: str
    result_type: str
    kwargs: dict = field(default_factory=dict)  # the keyword arguments as JSON (to recompute)
    helpers: dict = field(default_factory=dict)  # keyword -> {"model": label, "fingerprint": sha256}
    seconds: float = 0.0  # how long the computation took at warm time
    result: dict = field(default_factory=dict)
    format: int = FORMAT


def weights_fingerprint(folder: str | Path) -> str:
    """SHA-256 of a model folder's *.safetensors files (name and bytes), cached per size and mtime."""
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors")) if str(folder) else []
    if not files:
        return ""
    stamp = (str(folder.resolve()),) + tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    with _fp_lock:
        if stamp in _fingerprints:
            return _fingerprints[stamp]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    value = digest.hexdigest()
    with _fp_lock:
        _fingerprints[stamp] = value
    return value


def enabled() -> bool:
    """Lookups can be switched off (MODEL_INSPECTOR_PRECOMPUTED=0), e.g. to time a page computing."""
    return os.environ.get("MODEL_INSPECTOR_PRECOMPUTED", "1").lower() not in ("0", "off", "false", "no")


def entry_key(kind: str, model: str, params: str, extra: str) -> str:
    text = json.dumps([kind, model, params, extra], ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _safe_name(model: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in model)


def entry_path(kind: str, model: str, params: str, extra: str, root: Path | None = None) -> Path:
    return (root or STORE_DIR) / _safe_name(model) / f"{kind}-{entry_key(kind, model, params, extra)}.json.gz"


def _qualname(obj: Any) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def _resolve(name: str) -> Any:
    module, _, qual = name.partition(":")
    if not module.startswith("analysis."):  # entries only ever name this package's own code
        raise ValueError(f"refusing to load '{name}' from a precomputed entry")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def read_entry(path: Path) -> Entry:
    data = json.loads(gzip.decompress(path.read_bytes()))
    return Entry(**{f.name: data[f.name] for f in dataclasses.fields(Entry) if f.name in data})


def entries(root: Path | None = None) -> list[tuple[Path, Entry]]:
    root = root or STORE_DIR
    return [(p, read_entry(p)) for p in sorted(root.glob("*/*.json.gz"))]


Helpers = dict  # keyword -> (label, weights folder) of the other models an analysis uses


def _helper_fingerprints(helpers: Helpers | None) -> dict | None:
    """keyword -> {"model": label, "fingerprint": sha256} as stored in an entry; None when a helper's
    weights are not files (then nothing can be stored or matched)."""
    out = {}
    for name, (label, folder) in sorted((helpers or {}).items()):
        fp = weights_fingerprint(folder)
        if not fp:
            return None
        out[name] = {"model": label, "fingerprint": fp}
    return out


def lookup(kind: str, model: str, params: str, extra: str, weights_folder: str | Path,
           root: Path | None = None, helpers: Helpers | None = None) -> Any | None:
    """The stored result for exactly this analysis, model weights (and helpers' weights) and settings, or None."""
    if root is None and not enabled():
        return None
    path = entry_path(kind, model, params, extra, root)
    if not path.is_file():
        stats["misses"] += 1
        return None
    try:
        entry = read_entry(path)
        same = (entry.format == FORMAT and entry.kind == kind and entry.model == model and entry.params == params
                and entry.extra == extra and entry.fingerprint
                and entry.fingerprint == weights_fingerprint(weights_folder)
                and entry.helpers == _helper_fingerprints(helpers))
        if not same:
            stats["misses"] += 1
            return None
        result = _resolve(entry.result_type).from_dict(entry.result)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError):
        stats["misses"] += 1
        return None
    stats["hits"] += 1
    return result


def save(kind: str, model: str, params: Any, extra: str, weights_folder: str | Path, fn: Callable,
         kwargs: dict, result: Any, seconds: float = 0.0, root: Path | None = None,
         helpers: Helpers | None = None) -> Path | None:
    """Store one computed result (only for models whose weights are files: the fingerprint needs them;
    the same for every helper model)."""
    fingerprint = weights_fingerprint(weights_folder)
    if not fingerprint or not hasattr(result, "to_dict") or not hasattr(params, "to_json"):
        return None
    stored_helpers = _helper_fingerprints(helpers)
    if stored_helpers is None:
        return None
    params_json = params.to_json()
    entry = Entry(kind=kind, model=model, fingerprint=fingerprint, params=params_json, extra=extra,
                  function=_qualname(fn), params_type=_qualname(type(params)),
                  result_type=_qualname(type(result)), kwargs=json.loads(json.dumps(kwargs)),
                  seconds=round(seconds, 3), result=result.to_dict(), helpers=stored_helpers)
    path = entry_path(kind, model, params_json, extra, root)
    if _same_as_stored(path, entry):
        return path  # only wall-clock fields differ: keep the committed file as it is
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(dataclasses.asdict(entry), sort_keys=True, separators=(",", ":"))
    path.write_bytes(gzip.compress(text.encode(), mtime=0))
    return path


def _same_as_stored(path: Path, entry: Entry) -> bool:
    """True when `path` holds this entry already, up to wall-clock fields (and float noise below 1e-4)."""
    if not path.is_file():
        return False
    try:
        old = read_entry(path)
    except (OSError, ValueError, TypeError, KeyError):
        return False
    plain = ("kind", "model", "fingerprint", "params", "extra", "function", "params_type", "result_type",
             "kwargs", "helpers", "format")
    return (all(getattr(old, f) == getattr(entry, f) for f in plain)
            and without_timings(old.result) == without_timings(entry.result))


def recompute(entry: Entry, handle) -> Any:
    """Run the entry's analysis again on `handle` with its stored settings (helper models loaded by label)."""
    from analysis.model_access.models import ModelSpec, load_model

    fn = _resolve(entry.function)
    params = _resolve(entry.params_type).from_json(entry.params)
    helpers = {name: (handle if h["model"] == entry.model else load_model(ModelSpec.parse(h["model"])))
               for name, h in entry.helpers.items()}
    return fn(handle, params, **helpers, **entry.kwargs)


def without_timings(value: Any) -> Any:
    """A result dict with wall-clock fields removed and floats rounded (for comparing two runs)."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMING_FIELDS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    if isinstance(value, float):
        return round(value, 4)
    return value


def prune(keep: set[Path], root: Path | None = None) -> list[Path]:
    """Delete stored entries not in `keep` (after a full warm: results no page asks for any more)."""
    removed = []
    for path, _ in entries(root):
        if path not in keep:
            path.unlink()
            removed.append(path)
    return removed


def total_bytes(root: Path | None = None) -> int:
    return sum(p.stat().st_size for p, _ in entries(root))


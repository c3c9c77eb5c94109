"""The tuned lens's translators: stored per model like the zoo's other artefacts, loaded and applied here.

A folder `analysis/zoo/lenses/<model>/` holds `tuned_lens.safetensors` (per layer l: `l.bias` (D,) and
either `l.weight` (D, D) or a low-rank factorisation `l.u` (D, r), `l.v` (D, r) with W = u v^T) and
`tuned_lens.json` (the model it was trained on, a probe of that model's weights, the recipe, the corpus
and the held-out measurements). A translator maps a state h of layer l to h + W h + b (Belrose et al.
2023, section 3: identity plus a learned affine map, initialised at zero). The training script is
analysis/zoo/train/tuned_lens.py.

A lens is only ever applied to the weights it was trained on: its `weights_sha256` (every parameter and
buffer of the language model, hashed) must be the loaded model's, so another checkpoint under the same name
never reads it (a lens stored before the hash: the probe, sums of the final norm and of the first unembedding
rows, must match). The zoo's lenses ship in `analysis/zoo/lenses/<model>/`; a lens trained on the page or with
`python -m analysis residual train-lens` for any other model goes to `.model_inspector/lenses/<model>-<hash>/`.
"""
from __future__ import annotations

import hashlib
import json
import re
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

from analysis.model_access import anatomy
from analysis.framework import paths
from analysis.model_access.models import ModelHandle
from analysis.residual.errors import ResidualError

LENS_ROOT = paths.ZOO / "lenses"
USER_LENS_ROOT = paths.ROOT / ".model_inspector" / "lenses"  # lenses trained here for any model (not committed)
WEIGHTS = "tuned_lens.safetensors"
META = "tuned_lens.json"
PROBE_ROWS = 16
PROBE_TOLERANCE = 1e-3


@dataclass
class Translators:
    layers: int  # L: translators for states 0..L-1; state L is read as it is
    weights: dict[int, tuple[torch.Tensor, ...]]  # l -> (W,) or (u, v)
    biases: dict[int, torch.Tensor]
    meta: dict = field(default_factory=dict)

    def apply(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """The translated state of layer `layer` (any leading shape; D last)."""
        if layer >= self.layers:
            return h
        w, b = self.weights[layer], self.biases[layer]
        x = h.float()
        delta = x @ w[0].T if len(w) == 1 else (x @ w[1]) @ w[0].T
        return (x + delta + b).to(h.dtype)

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {}
        for layer, w in self.weights.items():
            names = ("weight",) if len(w) == 1 else ("u", "v")
            out |= {f"{layer}.{n}": t.contiguous() for n, t in zip(names, w)}
            out[f"{layer}.bias"] = self.biases[layer].contiguous()
        return out

    def save(self, folder: Path, dtype: torch.dtype = torch.float16) -> Path:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.to(dtype) for k, v in self.state_dict().items()}, str(folder / WEIGHTS))
        (folder / META).write_text(json.dumps({**self.meta, "layers": self.layers}, indent=1) + "\n")
        return folder


def probe(lm: torch.nn.Module) -> list[float]:
    """A few sums of the weights the readout uses: the same for every copy of one model's weights."""
    head = anatomy.unembedding(lm).weight.detach().float()
    norm = anatomy.final_norm(lm)
    weight = getattr(norm, "weight", None)
    sums = [float(weight.detach().float().sum())] if weight is not None else []
    return sums + [float(s) for s in head[:PROBE_ROWS].sum(-1)]


_hashes: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()


def weights_hash(lm: torch.nn.Module) -> str:
    """SHA-256 over every parameter and buffer of the language model (names, dtypes, shapes, bytes), once per
    loaded model: another checkpoint under the same name has another hash."""
    known = _hashes.get(lm)
    if known is not None:
        return known
    digest = hashlib.sha256()
    for name, t in sorted(list(lm.named_parameters()) + list(lm.named_buffers()), key=lambda item: item[0]):
        t = t.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    _hashes[lm] = digest.hexdigest()
    return _hashes[lm]


def folder_for(name: str) -> Path:
    return LENS_ROOT / name


def user_folder(label: str, digest: str) -> Path:
    """Where a lens trained here for model `label` with weights hash `digest` is stored."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", label.split("/")[-1].split(":")[-1]).strip("-.") or "model"
    return USER_LENS_ROOT / f"{slug[:48]}-{digest[:16]}"


def load(folder: Path) -> Translators:
    from safetensors.torch import load_file

    meta = json.loads((folder / META).read_text())
    tensors = {k: v.float() for k, v in load_file(str(folder / WEIGHTS)).items()}
    layers = int(meta["layers"])
    weights, biases = {}, {}
    for layer in range(layers):
        if f"{layer}.weight" in tensors:
            weights[layer] = (tensors[f"{layer}.weight"],)
        else:
            weights[layer] = (tensors[f"{layer}.u"], tensors[f"{layer}.v"])
        biases[layer] = tensors[f"{layer}.bias"]
    return Translators(layers, weights, biases, meta)


def available() -> list[str]:
    """Names of the zoo models with a shipped tuned lens."""
    if not LENS_ROOT.is_dir():
        return []
    return sorted(p.name for p in LENS_ROOT.iterdir() if (p / META).is_file() and (p / WEIGHTS).is_file())


def stored_folders() -> list[Path]:
    """Every stored lens: the zoo's, then those trained here."""
    found = [folder_for(n) for n in available()]
    if USER_LENS_ROOT.is_dir():
        found += sorted(p for p in USER_LENS_ROOT.iterdir() if (p / META).is_file() and (p / WEIGHTS).is_file())
    return found


def _close(theirs: list, mine: list[float]) -> bool:
    return len(theirs) == len(mine) and all(abs(a - b) <= PROBE_TOLERANCE * max(1.0, abs(b)) for a, b in zip(theirs, mine))


def find(handle: ModelHandle) -> Path | None:
    """The folder of the stored lens trained on this model's weights (None: none is). The probe screens the
    folders cheaply; a lens that carries a weights hash is taken only when the hash is this model's."""
    lm = handle.language_model
    mine = probe(lm)
    for folder in stored_folders():
        meta = json.loads((folder / META).read_text())
        if meta.get("probe") and not _close(meta["probe"], mine):
            continue
        digest = meta.get("weights_sha256")
        if digest is not None and digest == weights_hash(lm) or digest is None and meta.get("probe"):
            return folder
    return None


_cache: dict[tuple, Translators] = {}


def for_model(handle: ModelHandle) -> Translators:
    """The stored translators trained on this model's weights; ResidualError when none are."""
    lm = handle.language_model
    folder = find(handle)
    if folder is None:
        raise ResidualError(f"No tuned lens is trained for {handle.spec.label} yet. Pick the logit lens, or train "
                            "one: on this page (Train a tuned lens), or python -m analysis residual train-lens "
                            f"--model {handle.spec.label}.")
    key = (str(folder), (folder / WEIGHTS).stat().st_mtime_ns)
    if key not in _cache:
        found = load(folder)
        if found.layers != anatomy.n_layers(lm):
            raise ResidualError(f"The tuned lens in {paths.relative(folder)} has {found.layers} layers; "
                                f"{handle.spec.label} has {anatomy.n_layers(lm)}.")
        _cache[key] = found
    return _cache[key]

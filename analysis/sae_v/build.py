"""SAE-V end to end: train (or find) an SAE and its feature store for one (model, layer)."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from analysis.model_access import anatomy
from analysis.model_access.models import ModelHandle
from analysis.framework.precompute import weights_fingerprint
from analysis.framework.results import Result
from analysis.sae_v import types as T
from analysis.sae_v.activations import collect_activations, modality_scales, scaled
from analysis.sae_v.datasets import default_dataset, make_pairs
from analysis.sae_v.params import BuildParams
from analysis.sae_v.store import build_feature_store, save_store
from analysis.sae_v.training import reconstruction_metrics, save_sae, train_sae
from analysis.sae_v.types import IMAGE, STORE_FILE, TEXT, Progress, SaeMeta, _noop


def model_fingerprint(handle: ModelHandle) -> str:
    """The SHA-256 of the model's weight files (analysis/framework/precompute.py's, the one fingerprint of the app);
    empty when they are not on disk."""
    return weights_fingerprint(handle.path) if handle.path else ""


def is_stale(handle: ModelHandle, meta: SaeMeta) -> bool:
    """True when the SAE was trained here on other weights of this model. Fingerprints from before the
    app had one (16 hex digits) cannot be compared: not stale."""
    stored = meta.model_fingerprint
    if not stored or len(stored) != 64:
        return False
    return stored != model_fingerprint(handle)


def demo_folder(handle: ModelHandle, layer: int) -> Path | None:
    """The committed SAE for a demo-zoo model and layer, if there is one."""
    if handle.spec.source != "zoo":
        return None
    folder = T.SAE_ROOT / handle.spec.name / f"layer{layer}"
    return folder if (folder / STORE_FILE).is_file() else None


def available_saes(handle: ModelHandle) -> list[Path]:
    """Folders holding an SAE + store for this model: committed demo ones, then cached ones."""
    found = []
    if handle.spec.source == "zoo":
        found += sorted((T.SAE_ROOT / handle.spec.name).glob("layer*/" + STORE_FILE))
    found += sorted(cache_dir(handle).glob("*/" + STORE_FILE))
    return [p.parent for p in found]


def cache_dir(handle: ModelHandle) -> Path:
    digest = hashlib.sha1(f"{handle.spec.label}|{handle.path}".encode()).hexdigest()[:12]
    return T.CACHE_ROOT / digest


def build_folder(handle: ModelHandle, params: BuildParams) -> Path:
    digest = hashlib.sha1(params.to_json(sort_keys=True).encode()).hexdigest()[:10]
    return cache_dir(handle) / f"layer{params.layer}-{digest}"


def build(handle: ModelHandle, params: BuildParams, folder: str | Path | None = None,
          progress: Progress | None = None) -> Path:
    """Collect activations, train the SAE, measure it and build its feature store into `folder`."""
    progress = progress or _noop
    params.validate()
    anatomy.check_layer(handle.model, params.layer)
    dataset = params.dataset or default_dataset(handle)
    folder = Path(folder) if folder is not None else build_folder(handle, params)
    train_set = make_pairs(handle, dataset, params.train_pairs, params.seed * 2 + 1, corrupted=0.0)
    eval_set = make_pairs(handle, dataset, params.eval_pairs, params.seed * 2 + 2, corrupted=params.corrupted)
    train_acts = collect_activations(handle, train_set, params.layer,
                                     progress=lambda f, m: progress(0.15 * f, m))
    start = time.perf_counter()
    scales = modality_scales(train_acts) if params.train.balance_modalities else [1.0, 1.0]
    sae = train_sae(scaled(train_acts, scales), params.train, progress=lambda f, m: progress(0.15 + 0.6 * f, m))
    seconds = time.perf_counter() - start
    eval_acts = collect_activations(handle, eval_set, params.layer,
                                    progress=lambda f, m: progress(0.75 + 0.05 * f, m))
    eval_in = scaled(eval_acts, scales)
    fve, l0, dead = reconstruction_metrics(sae, eval_in, params.store.threshold)
    fve_mod = [reconstruction_metrics(sae, eval_in[eval_acts.modality == m], params.store.threshold)[0]
               if bool((eval_acts.modality == m).sum() > 1) else None for m in (TEXT, IMAGE)]
    meta = SaeMeta(model=handle.spec.label, layer=params.layer, d_in=int(train_acts.acts.shape[1]),
                   train=params.train, dataset=dataset, n_pairs=len(train_set.pairs), n_tokens=len(train_acts),
                   fve=round(fve, 4), l0=round(l0, 3), dead=dead, train_seconds=round(seconds, 1),
                   model_fingerprint=model_fingerprint(handle), scales=[round(x, 8) for x in scales],
                   fve_text=None if fve_mod[0] is None else round(fve_mod[0], 4),
                   fve_image=None if fve_mod[1] is None else round(fve_mod[1], 4),
                   hook_name=f"blocks.{params.layer}.hook_resid_post")
    store = build_feature_store(handle, sae, meta, eval_acts, eval_set, params.store,
                                progress=lambda f, m: progress(0.8 + 0.2 * f, m))
    save_sae(sae, meta, folder)
    save_store(store, folder)
    (folder / "build_params.json").write_text(params.to_json(indent=1))
    progress(1.0, "done")
    return folder


@dataclass
class Trained(Result):
    """Where `train` put the SAE and its feature store (the page then lists it)."""

    folder: str
    name: str


def train(handle: ModelHandle, params: BuildParams, progress: Progress | None = None) -> Trained:
    """The runner's entry for training (`build` into this model's cache folder)."""
    folder = build(handle, params, progress=progress)
    return Trained(folder=str(folder), name=folder.name)


def rebuild_store(handle: ModelHandle, folder: str | Path, score_rule: str | None = None,
                  progress: Progress | None = None) -> Path:
    """Recompute the feature store of a saved SAE (same weights, same evaluation pairs), e.g. under
    another score rule or after the store's definitions changed."""
    from analysis.sae_v.training import load_sae

    progress = progress or _noop
    folder = Path(folder)
    sae, meta = load_sae(folder)
    params_file = folder / "build_params.json"
    params = BuildParams.from_json(params_file.read_text()) if params_file.is_file() else BuildParams(layer=meta.layer)
    if score_rule is not None:
        params.store.score_rule = score_rule
    dataset = params.dataset or meta.dataset or default_dataset(handle)
    eval_set = make_pairs(handle, dataset, params.eval_pairs, params.seed * 2 + 2, corrupted=params.corrupted)
    eval_acts = collect_activations(handle, eval_set, meta.layer, progress=lambda f, m: progress(0.3 * f, m))
    store = build_feature_store(handle, sae, meta, eval_acts, eval_set, params.store,
                                progress=lambda f, m: progress(0.3 + 0.7 * f, m))
    save_store(store, folder)
    params_file.write_text(params.to_json(indent=1))
    return folder

"""Which SAE, on which data: locators, fingerprints, and the feature store of any (SAE, data).

An SAE is named by a locator: the name of a demo or cached folder this panel trained ("layer1"), the path
of a folder sae-lens saved, or `sae-lens:RELEASE/SAE_ID`; the last two only where the deployment allows
(access.py). `locate` resolves a locator once into a `Source` that the steps of a run pass down. Data are named by ""
(the SAE's own evaluation pairs; for an outside SAE the model's default dataset), `dataset:NAME`
(generated pairs), a folder or file of the user's (userdata.py) or `upload:SHA` (an uploaded zip).

`store_for` is the runner's entry for a feature store: the committed or trained one for our SAE on its own
pairs (read from disk), otherwise built on the first `store_pairs` usable pairs of the data and cached on
disk under the SAE's, the model's and the data's fingerprints.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

from analysis.framework import config
from analysis.framework.errors import SettingsError
from analysis.model_access.models import ModelHandle
from analysis.sae_v import types as T
from analysis.sae_v import userdata
from analysis.sae_v.activations import concat, scaled, usable_batches
from analysis.sae_v.build import available_saes, model_fingerprint
from analysis.sae_v.datasets import DATASETS, default_dataset, make_pairs
from analysis.sae_v.access import RELEASE_PREFIX, check_release, server_path, shown
from analysis.sae_v.outside import SaeFitError, check_fit, load_outside, source_label
from analysis.sae_v.params import SaeChoice, StoreParams
from analysis.sae_v.prompts import too_long, too_long_reason
from analysis.sae_v.store import build_feature_store, load_store, save_store
from analysis.sae_v.training import load_sae, reconstruction_metrics
from analysis.sae_v.types import META_FILE, STORE_FILE, FeatureStore, PairSet, Progress, SaeMeta, Skipped, _noop

EVAL_SEED = 2  # generated pairs for `dataset:NAME`: the evaluation seed of a default build
STORE_VERSION = "2"  # cached stores of older definitions are built again (2: omega read after the per-token cut)


@dataclass(frozen=True)
class Source:
    """An SAE locator resolved once (`locate`): where its files are, whether this panel trained it, and its
    fingerprint. Every step of a run gets this object instead of resolving the locator again."""

    locator: str
    folder: Path | None  # None for a sae-lens release
    outside: bool  # not trained by this panel: no scales, no store of its own
    fingerprint: str = ""

    @property
    def label(self) -> str:
        return "trained here" if not self.outside else source_label(self.locator)


def locate(handle: ModelHandle, locator: str) -> Source:
    """The SAE a locator names, resolved once: one of this model's SAEs by name, a `sae-lens:` release, or a
    folder on the server; each under the deployment's allow-list (access.py). SettingsError when none."""
    text = str(locator or "").strip()
    if not text:
        raise SettingsError("Choose an SAE.")
    if text.startswith(RELEASE_PREFIX):
        check_release(text)
        return Source(text, None, True, hashlib.sha256(text.encode()).hexdigest()[:20])
    for folder in available_saes(handle):
        if folder.name == text:
            return _source(text, folder, False)
    path = server_path(text, "an SAE folder")
    if not path.is_dir():
        raise SaeFitError(f"'{shown(text)}' is not a folder (an SAE is a folder with cfg.json).")
    return _source(text, path, not (path / META_FILE).is_file())


def _source(locator: str, folder: Path, outside: bool) -> Source:
    stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in _sae_files(folder))
    return Source(locator, folder, outside, _hash_files(str(folder), stamp))


def sae_fingerprint(source: Source) -> str:
    """A hash of the SAE's files (weights, cfg, and our store): a stored result is keyed on it."""
    return source.fingerprint


def _sae_files(folder: Path) -> list[Path]:
    names = ("cfg.json", STORE_FILE, META_FILE)
    return sorted(f for f in folder.iterdir() if f.suffix == ".safetensors" or f.name in names)


@functools.lru_cache(maxsize=64)
def _hash_files(folder: str, stamp: tuple) -> str:
    digest = hashlib.sha256()
    for name, _, _ in stamp:
        digest.update(name.encode() + b"\0" + (Path(folder) / name).read_bytes())
    return digest.hexdigest()[:20]


def choose(handle: ModelHandle, sae: str | Source, data: str = "", cls=SaeChoice, **settings):
    """A run's params (`cls`, a SaeChoice) for this SAE (a locator, or one already resolved) and data,
    fingerprints filled in."""
    source = sae if isinstance(sae, Source) else locate(handle, sae)
    data = data_locator(source, data)
    return cls(sae=source.locator, sae_fingerprint=source.fingerprint, data=data,
               data_fingerprint=data_fingerprint(handle, data), **settings)


def data_locator(source: Source, data: str) -> str:
    """"" stays "" for our SAE (its own pairs); an outside SAE has none, so it gets the default dataset's."""
    return data if data or not source.outside else "dataset:"


def data_fingerprint(handle: ModelHandle, data: str) -> str:
    if not data or data.startswith("dataset:"):
        return ""
    return userdata.fingerprint(userdata.load(data, handle.kind))


# ---------------------------------------------------------------------------------------------
# Opening an SAE


def open_sae(handle: ModelHandle, choice: SaeChoice, source: Source | None = None):
    """(sae as a Codec, meta) of the chosen SAE, checked against the model (an outside SAE: SaeFitError when it
    does not fit). Our SAEs carry their meta; an outside SAE's is made here (raw residuals, no scales).
    `source`: the choice's SAE already resolved (else it is resolved here)."""
    source = source or locate(handle, choice.sae)
    if not source.outside:
        return _our_sae(str(source.folder), choice.sae_fingerprint)
    sae = _outside_sae(source.locator if source.folder is None else str(source.folder), choice.sae_fingerprint)
    layer, hook = check_fit(handle, sae, choice.layer)
    meta = SaeMeta(model=handle.spec.label, layer=layer, d_in=int(sae.cfg.d_in), train=None, dataset="", n_pairs=0,
                   n_tokens=0, fve=0.0, l0=0.0, dead=0, source=source.label, hook_name=hook,
                   architecture=sae.cfg.architecture(), code_scale=float(getattr(sae, "code_scale", 1.0)))
    return sae, meta


@functools.lru_cache(maxsize=4)
def _our_sae(folder: str, fingerprint: str):
    return load_sae(folder)


@functools.lru_cache(maxsize=4)
def _outside_sae(locator: str, fingerprint: str):
    return load_outside(locator)


# ---------------------------------------------------------------------------------------------
# The pairs of the chosen data


def data_pairs(handle: ModelHandle, choice: SaeChoice, own: PairSet | None = None) -> tuple[PairSet, list, int]:
    """(pairs, rows skipped before the model runs, rows read) of the chosen data. `own`: our SAE's own
    evaluation pairs (for data ""). A pair longer than the model's context is reported and left out."""
    data = choice.data
    if not data:
        if own is None:
            raise SettingsError("This SAE has no evaluation pairs of its own: choose data.")
        return own, [], 0
    if data.startswith("dataset:"):
        name = data.partition(":")[2] or default_dataset(handle)
        if name not in DATASETS:
            raise SettingsError(f"Unknown dataset '{name}' (available: {', '.join(DATASETS)}).")
        return _fitting(handle, make_pairs(handle, name, choice.store_pairs, EVAL_SEED, corrupted=0.5), [], 0)
    loaded = userdata.load(data, handle.kind)
    pairs, skipped, rows_read = _fitting(handle, loaded.pairs, list(loaded.skipped), loaded.rows_read)
    if not pairs.pairs:
        first = sorted(skipped, key=lambda s: s.row)[0] if skipped else None
        raise userdata.DataError(f"None of the {rows_read} rows of these data can be used "
                                 f"(first problem: row {first.row + 1}: {first.reason})."
                                 if first else "These data have no rows.")
    return pairs, skipped, rows_read


def _fitting(handle: ModelHandle, pairs: PairSet, skipped: list, rows_read: int) -> tuple[PairSet, list, int]:
    """The pairs that fit the model's context; the others reported (row, reason) and left out."""
    long = too_long(handle, [p.text for p in pairs.pairs])
    if not long:
        return pairs, skipped, rows_read
    skipped = skipped + [Skipped(row=pairs.pairs[i].row, image=pairs.pairs[i].image, reason=too_long_reason(handle, n))
                         for i, n in long.items()]
    kept = [p for i, p in enumerate(pairs.pairs) if i not in long]
    return replace(pairs, pairs=kept), sorted(skipped, key=lambda s: s.row), rows_read


# ---------------------------------------------------------------------------------------------
# The feature store of (SAE, data)


def store_folder(handle: ModelHandle, choice: SaeChoice) -> Path:
    key = "|".join([choice.sae, choice.sae_fingerprint, choice.data, choice.data_fingerprint, str(choice.layer),
                    str(choice.store_pairs), model_fingerprint(handle) or handle.spec.label, STORE_VERSION])
    return T.CACHE_ROOT / "stores" / hashlib.sha256(key.encode()).hexdigest()[:20]


def store_for(handle: ModelHandle, choice: SaeChoice, progress: Progress | None = None,
              source: Source | None = None) -> FeatureStore:
    """The feature store the browser shows for this SAE on this data (see the module docstring)."""
    progress = progress or _noop
    source = source or locate(handle, choice.sae)
    if not source.outside and not choice.data:
        return _stored(source.folder)
    folder = store_folder(handle, choice)
    if (folder / STORE_FILE).is_file():
        return _stored(folder)
    store = build_store(handle, choice, progress, source)
    if not config.current().read_only():  # a read-only instance keeps it in memory only (#39: nothing shared written)
        folder.mkdir(parents=True, exist_ok=True)
        save_store(store, folder)
    return store


def _stored(folder: Path) -> FeatureStore:
    return _read_store(str(folder), (folder / STORE_FILE).stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_store(folder: str, stamp: int) -> FeatureStore:
    """A store read from disk, kept while its file is unchanged (reading the demo's takes about a second).
    Callers never change it."""
    return load_store(folder)


def build_store(handle: ModelHandle, choice: SaeChoice, progress: Progress, source: Source) -> FeatureStore:
    """Activations of the first `store_pairs` usable pairs (unreadable images reported, not fatal), the SAE's
    fit on them (variance explained, L0, dead features), then the feature cards."""
    sae, meta = open_sae(handle, choice, source)
    own = _stored(source.folder).pairs if not source.outside else None
    pairs, skipped, _ = data_pairs(handle, choice, own)
    wanted, parts, used = choice.store_pairs, [], []
    for acts, batch, bad in usable_batches(handle, pairs, meta.layer, range(len(pairs.pairs)), choice.batch_pairs,
                                           lambda f, m: progress(0.7 * min(1.0, f * len(pairs.pairs)
                                                                           / max(wanted, 1)), m)):
        skipped += [Skipped(row=pairs.pairs[i].row, image=pairs.pairs[i].image, reason=why) for i, why in bad]
        if acts is not None:
            parts.append(acts)
            used += batch
        if len(used) >= wanted:
            break
    if not parts:
        raise userdata.DataError("No pair of the data could be read" + (f" ({skipped[0].reason})." if skipped else "."))
    sample, acts = _renumbered(pairs, used[:wanted], concat(parts))
    params = StoreParams()
    x = scaled(acts, meta.scales)
    fve, l0, dead = reconstruction_metrics(sae, x, params.threshold)
    meta = replace(meta, dataset=pairs.dataset if pairs.dataset != userdata.USER else pairs.source,
                   n_pairs=len(sample.pairs), n_tokens=len(acts), fve=round(fve, 4), l0=round(l0, 3), dead=dead)
    return build_feature_store(handle, sae, meta, acts, sample, params,
                               progress=lambda f, m: progress(0.7 + 0.3 * f, m))


def _renumbered(pairs: PairSet, used: list[int], acts):
    """The used pairs as their own PairSet, the activations' pair indices made to point into it."""
    import torch

    keep = torch.isin(acts.pair, torch.tensor(used))
    position = {p: j for j, p in enumerate(used)}
    acts.acts, acts.modality, acts.index = acts.acts[keep], acts.modality[keep], acts.index[keep]
    acts.pair = torch.tensor([position[int(p)] for p in acts.pair[keep]], dtype=torch.long)
    acts.tokens = acts.tokens[:len(used)]
    sample = replace(pairs, pairs=[pairs.pairs[i] for i in used])
    return sample, acts

"""The paper's data filtering on any data: rank every usable pair by s_i, keep the top share, export.

`rank` (the runner's entry) takes omega from the feature store of (SAE, data) (`sources.store_for`) and
streams the data through the model in batches: only one batch of residuals is held at a time, and every
finished batch is appended to a checkpoint file, so a ranking stopped half-way resumes where it stopped
(not on a read-only instance: the file would outlive the visitor's upload, which expires).
Rows whose image cannot be read are reported (`Ranking.skipped`) and left out.

Exports: the ranked list (CSV or JSONL: rank, image, caption, s_i, kept) and the kept subset in the
input's own format (captions.jsonl / .csv / texts.txt lines, Parquet, or a `datasets` folder).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import zipfile
from pathlib import Path

import torch

from analysis.framework import config
from analysis.framework.results import rows_to_csv
from analysis.model_access.models import ModelHandle
from analysis.framework.registry import check_range
from analysis.sae_v import types as T
from analysis.sae_v import userdata
from analysis.sae_v.activations import collect_activations, scaled, usable_batches
from analysis.sae_v.build import model_fingerprint
from analysis.sae_v.params import RankParams
from analysis.sae_v.rules import ScoreRule, same_omega
from analysis.sae_v.scores import finish_ranking, score_rows, store_weights
from analysis.sae_v.sources import data_pairs, locate, open_sae, store_folder, store_for
from analysis.sae_v.training import encode
from analysis.sae_v.types import STORE_FILE, FeatureStore, PairScore, Progress, Ranking, Skipped, _noop


def rank(handle: ModelHandle, params: RankParams, progress: Progress | None = None) -> Ranking:
    """Every usable pair of the chosen data ranked by s_i (highest first) under the chosen rule."""
    progress = progress or _noop
    params.validate()
    source = locate(handle, params.sae)  # resolved once, passed down
    ready = not source.outside and not params.data or (store_folder(handle, params) / STORE_FILE).is_file()
    share = 0.0 if ready else 0.3
    store = store_for(handle, params, progress=lambda f, m: progress(share * f, "feature store: " + m), source=source)
    sae, meta = open_sae(handle, params, source)
    rule = params.score_rule()
    omega, has_omega, from_store = _weights(handle, sae, meta, store, rule)
    own = store.pairs if not params.data else None
    pairs, skipped, rows_read = data_pairs(handle, params, own)
    checkpoint = _checkpoint(handle, params) if params.data and not params.data.startswith("dataset:") else None
    rows, more, resumed = _resume(checkpoint)
    skipped += more
    done, unreadable = {r.pair for r in rows}, {s.row for s in more}
    todo = [i for i in range(len(pairs.pairs)) if i not in done and pairs.pairs[i].row not in unreadable]
    threshold = rule.cooccur_threshold
    batches = usable_batches(handle, pairs, meta.layer, todo, params.batch_pairs,
                             lambda f, m: progress(share + (1 - share) * f, m))
    for acts, batch, bad in batches:
        new = [Skipped(row=pairs.pairs[i].row, image=pairs.pairs[i].image, reason=why) for i, why in bad]
        scored = _score_batch(sae, meta, acts, batch, pairs, omega, has_omega, rule, threshold)
        _append(checkpoint, scored, new)
        rows += scored
        skipped += new
    return finish_ranking(meta, rows, params.by, threshold, rule, labelled=pairs.labelled, source=params.data,
                          rows_read=rows_read, skipped=sorted(skipped, key=lambda s: s.row), resumed=resumed,
                          notes=list(pairs.notes), with_omega=int(has_omega.sum()), omega_from_store=from_store)


def rank_refusal(handle: ModelHandle) -> str | None:
    """Why this model cannot rank data (None when it can): ranking scores image-caption pairs."""
    if handle.kind == "vlm":
        return None
    return (f"Data ranking scores image–caption pairs, so it needs a vision-language model; {handle.spec.label} is "
            "text-only.")


def _score_batch(sae, meta, acts, batch, pairs, omega, has_omega, rule, threshold) -> list[PairScore]:
    if acts is None:
        return []
    local = {p: j for j, p in enumerate(batch)}
    acts.pair = torch.tensor([local[int(p)] for p in acts.pair], dtype=torch.long)
    codes = encode(sae, scaled(acts, meta.scales))
    rows = score_rows([pairs.pairs[i] for i in batch], codes, acts, omega, rule, threshold, has_omega)
    for r, i in zip(rows, batch):
        r.pair = i
    return rows


def _weights(handle, sae, meta, store: FeatureStore, rule: ScoreRule) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(omega per feature, which features have one, whether they are the store's): the store's when its rule
    computes the same omega (rules.same_omega), else recomputed under `rule` on the store's own pairs (at most
    `store_pairs` of them)."""
    stored = store.params.rule() if store.params is not None else None
    if stored is not None and same_omega(rule, stored):
        return (*store_weights(store), True)
    acts = collect_activations(handle, store.pairs, meta.layer)
    codes = encode(sae, scaled(acts, meta.scales))
    return (*rule.weights(acts.acts, codes, acts.modality, threshold=store.params.threshold), False)


# ---------------------------------------------------------------------------------------------
# Resuming: each finished batch is one line of a checkpoint file


def _checkpoint(handle: ModelHandle, params: RankParams) -> Path | None:
    """Where a ranking of a visitor's data keeps its finished batches; None on a read-only instance (#39:
    nothing written there outlives the upload it came from)."""
    if config.current().read_only():
        return None
    key = params.to_json(sort_keys=True) + "|" + (model_fingerprint(handle) or handle.spec.label)
    return T.CACHE_ROOT / "rankings" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.jsonl"


def _resume(path: Path | None) -> tuple[list[PairScore], list[Skipped], int]:
    if path is None or not path.is_file():
        return [], [], 0
    rows, skipped = [], []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
            rows += [PairScore.from_dict(r) for r in entry["rows"]]
            skipped += [Skipped.from_dict(s) for s in entry["skipped"]]
        except (ValueError, KeyError, TypeError):
            break  # a line cut by a stop: everything after it is computed again
    return rows, skipped, len(rows)


def _append(path: Path | None, rows: list[PairScore], skipped: list[Skipped]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write(json.dumps({"rows": [r.to_dict() for r in rows], "skipped": [s.to_dict() for s in skipped]}) + "\n")


# ---------------------------------------------------------------------------------------------
# Export


def keep_count(ranking: Ranking, keep: float) -> int:
    check_range("keep fraction", keep, low=0.0, high=1.0)
    return int(round(keep * len(ranking.rows)))


def ranked_rows(ranking: Ranking, keep: float) -> list[dict]:
    """The ranked list, best first: rank, image, caption, s_i, kept, row (the file's line or table row, from 1
    as on the page and in the reasons rows are left out; a built-in pair's number from 1), and the label where
    the data have one."""
    n = keep_count(ranking, keep)
    out = []
    for r in ranking.rows:
        row = {"rank": r.rank, "image": r.image, "caption": r.text, "s_i": r.score, "weighted": r.weighted,
               "shared": r.shared, "kept": r.rank <= n, "row": (r.row if r.row >= 0 else r.pair) + 1}
        if ranking.labelled:
            row["corrupted"] = r.corrupted
        out.append(row)
    return out


def ranked_text(ranking: Ranking, keep: float, fmt: str) -> str:
    """The ranked list as CSV or JSONL text."""
    rows = ranked_rows(ranking, keep)
    if fmt == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return rows_to_csv(rows)


def kept_rows(ranking: Ranking, keep: float) -> list[int]:
    """Rows of the user's file that are kept, in file order."""
    n = keep_count(ranking, keep)
    return sorted(r.row for r in ranking.rows if r.rank <= n and r.row >= 0)


def kept_subset(locator: str, ranking: Ranking, keep: float, kind: str = "vlm") -> tuple[bytes, str]:
    """(file contents, file name) of the kept pairs in the input's own format: the same lines of
    captions.jsonl / texts.txt, the same rows of captions.csv or a Parquet file, or a `datasets` folder
    (zipped) saved with the kept rows."""
    data = userdata.load(locator, kind)
    rows = kept_rows(ranking, keep)
    index = data.index
    if data.layout in ("jsonl", "txt"):  # rows are the file's lines
        lines = index.read_text(encoding="utf-8").splitlines()
        return "".join(lines[i] + "\n" for i in rows).encode(), f"{index.stem}.kept{index.suffix}"
    if data.layout == "csv":  # rows are the lines where records start
        with open(index, newline="", encoding="utf-8") as fh:
            fields = next(csv.reader(fh), None) or []
        records = dict(userdata.csv_records(index))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for i in rows:
            writer.writerow(records[i])
        return buf.getvalue().encode(), f"{index.stem}.kept.csv"
    table = userdata._table(str(index), index.stat().st_mtime_ns).take(rows)
    if data.layout == "parquet":
        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(table, buf)
        return buf.getvalue(), f"{index.stem}.kept.parquet"
    return _datasets_zip(index, rows), f"{index.name}.kept.zip"


def _datasets_zip(folder: Path, rows: list[int]) -> bytes:
    """The kept rows as a `datasets` folder (`save_to_disk`), zipped."""
    import tempfile

    import datasets

    with tempfile.TemporaryDirectory() as tmp:
        datasets.load_from_disk(str(folder)).select(rows).save_to_disk(tmp)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in sorted(Path(tmp).rglob("*")):
                if f.is_file():
                    zf.write(f, f"{folder.name}.kept/{f.relative_to(tmp)}")
        return buf.getvalue()


def write_exports(ranking: Ranking, keep: float, out: str | Path | None = None, kept: str | Path | None = None,
                  locator: str = "", kind: str = "vlm") -> list[Path]:
    """The CLI's --export (CSV, or JSONL by suffix) and --export-kept (the kept subset in the input's format)."""
    written = []
    if out is not None:
        out = Path(out)
        out.write_text(ranked_text(ranking, keep, "jsonl" if out.suffix.lower() == ".jsonl" else "csv"))
        written.append(out)
    if kept is not None:
        if not locator or locator.startswith("dataset:"):
            raise userdata.DataError("--export-kept needs your own data (--data).")
        content, name = kept_subset(locator, ranking, keep, kind)
        target = Path(kept)
        target = target / name if target.is_dir() else target
        target.write_bytes(content)
        written.append(target)
    return written

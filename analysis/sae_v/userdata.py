"""Your own image-caption data: a folder (or a small zip) read into pairs, bad rows reported one by one.

Accepted layouts (the first found wins):
- `captions.jsonl`: one `{"image": "relative/path.png", "caption": "..."}` per line;
- `captions.csv`: columns `image,caption`;
- a Parquet file (`*.parquet`), or a Hugging Face `datasets` folder written by `save_to_disk`
  (`state.json` + `*.arrow`), with an image column (`image`: an Image feature or a relative path) and a text
  column (`caption` or `text`);
- for a language model, texts alone: `texts.txt` (one per line) or `texts.jsonl` (`{"text": ...}`).
Any of them may have a `label` or `corrupted` column (true / 1 / "corrupted" marks a corrupted pair): only
then are ROC, precision and recall measured.

A row without a caption, without an image, with an image outside the folder, missing or above the size
limit is reported (`Skipped`: row, image, reason) and left out before the model runs; an image that does
not decode is reported the same way when its batch is read. A blank line is reported as one, and a row
that repeats an earlier one (the same caption and the same image, compared by content) is reported as a
duplicate and left out, the first kept; rows that show the same image as an earlier row with another
caption are kept (several captions per image are normal) and listed in `UserData.notes`. Nothing is
dropped silently.

Rows are numbered by the file's lines (`row` 0-based, shown from 1: a CSV's header is line 1, its first
record line 2), so a reported row is the line an editor shows; a Parquet file or `datasets` folder is
numbered by the table's rows.
"""
from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from analysis.framework import images, uploads
from analysis.framework.errors import SettingsError
from analysis.sae_v import access
from analysis.sae_v import types as T
from analysis.sae_v.datasets import render_pair
from analysis.sae_v.types import Pair, PairSet, Skipped

USER = "user"  # PairSet.dataset of a user's pairs
IMAGE_COLUMNS = ("image", "image_path", "file_name", "path")
TEXT_COLUMNS = ("caption", "text")
LABEL_COLUMNS = ("corrupted", "label")
MAX_ZIP_BYTES = 50 * 2**20  # an upload, compressed
MAX_UNZIPPED_BYTES = 400 * 2**20
MAX_ZIP_FILES = 20_000  # members of a zip, folders included
MAX_ZIP_FOLDERS = 1_000  # folders it makes, named or implied by its files' paths (each is an inode and a block)
MAX_ROWS = 1_000_000


class DataError(SettingsError):
    """Data that cannot be read at all (no known layout, no caption column, a bad zip); the message says why."""


@dataclass
class UserData:
    """A user's data read into pairs, with every row left out and why."""

    locator: str  # what the user gave (a folder, a file, upload:SHA)
    root: Path  # the folder image paths are relative to
    layout: str  # jsonl | csv | parquet | arrow | txt | texts-jsonl
    index: Path  # the file (or folder) the rows come from
    pairs: PairSet
    skipped: list[Skipped] = field(default_factory=list)
    rows_read: int = 0  # rows of the file (lines, blank ones included; a table's rows)
    columns: dict[str, str] = field(default_factory=dict)  # role (image, text, label) -> column name
    notes: list[str] = field(default_factory=list)  # kept rows worth knowing about (an image with several captions)

    @property
    def has_images(self) -> bool:
        return "image" in self.columns


# ---------------------------------------------------------------------------------------------
# Where the data is


def upload_root() -> Path:
    return T.CACHE_ROOT / "uploads"


uploads.register(upload_root)  # the server sweeps expired uploads (analysis/framework/uploads.py)


def resolve(locator: str) -> Path:
    """The folder or file a data locator names: `upload:SHA` (an extracted zip, where uploads are on) or a
    path on the server, where this instance reads server paths and under its allowed roots (analysis/sae_v/
    access.py: the deployment's allow-list; a refusal names the locator as written, nothing of the server)."""
    text = str(locator).strip()
    if text.startswith("upload:"):
        access.check_uploads()
        path = upload_root() / _hex(text.partition(":")[2])
        if not path.is_dir():
            raise DataError("That upload is no longer on this server; upload the zip again.")
        return path
    return access.server_path(text, "data")


def _hex(text: str) -> str:
    if not text or any(c not in "0123456789abcdef" for c in text) or len(text) > 64:
        raise DataError("A data upload is named by its SHA-256.")
    return text


def zip_limit_bytes() -> int:
    """The largest zip this instance takes: the configuration's `uploads.max_mb`, at most MAX_ZIP_BYTES."""
    from analysis.framework import config

    return min(MAX_ZIP_BYTES, int(config.current().uploads.max_mb * 2**20))


def save_zip(data: bytes, name: str = "the zip", owner: str = "") -> str:
    """Extract an uploaded zip into this server's upload area (content-addressed) and return its locator.
    The area's limits (analysis/framework/uploads.py: files, bytes per visitor and in all, expiry) hold for the
    unpacked size; `owner` is the visitor's id. A refused or broken zip leaves nothing on disk."""
    limit = zip_limit_bytes()
    if len(data) > limit:
        raise DataError(f"{name} is {len(data) / 2**20:.1f} MB; zips up to {limit / 2**20:g} MB are accepted here.")
    sha = hashlib.sha256(data).hexdigest()
    area = uploads.UploadArea(upload_root())
    if (area.root / sha).is_dir():
        return f"upload:{sha}"
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        listed = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise DataError(f"{name} is not a zip file that can be read ({exc}).") from None
    members = [m for m in listed if not m.is_dir()]
    folders = {parent for m in listed for parent in PurePosixPath(m.filename.rstrip("/") or ".").parents} \
        | {PurePosixPath(m.filename.rstrip("/")) for m in listed if m.is_dir()}
    folders.discard(PurePosixPath("."))
    # counted as the upload area counts it (analysis/framework/uploads.py size_of): whole blocks per file and folder
    unpacked = sum(uploads.on_disk(m.file_size) for m in members) + uploads.BLOCK * (len(folders) + 1)
    if len(listed) > MAX_ZIP_FILES or len(folders) > MAX_ZIP_FOLDERS or unpacked > MAX_UNZIPPED_BYTES:
        raise DataError(f"{name} holds too much ({len(listed)} entries, {len(folders)} folders, "
                        f"{unpacked / 2**20:.0f} MB unpacked; at most {MAX_ZIP_FILES} entries, {MAX_ZIP_FOLDERS} "
                        f"folders and {MAX_UNZIPPED_BYTES / 2**20:g} MB). Nothing was extracted.")
    for m in members:
        if m.filename.startswith(("/", "\\")) or ".." in Path(m.filename).parts or \
                (m.external_attr >> 16) & 0o170000 == 0o120000:
            raise DataError(f"{name} has an unsafe entry '{m.filename}' (absolute, '..' or a link); nothing was "
                            "extracted.")
    owner = uploads.owner_key(owner)
    with area.writing(sha, owner, what=f"{name} unpacked") as (tmp, room):
        if unpacked > room:
            raise area.too_big(f"{name} unpacked", unpacked, room)
        try:
            for m in members:
                out = tmp.joinpath(*Path(m.filename).parts)
                out.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(m) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise DataError(f"{name} cannot be unpacked ({exc}); nothing was kept.") from None
        inner = _single_folder(tmp)
        if inner != tmp:  # a zip of one folder: that folder is the data
            inner.rename(tmp.with_name(tmp.name + ".inner"))
            shutil.rmtree(tmp)
            tmp.with_name(tmp.name + ".inner").rename(tmp)
    return f"upload:{sha}"


def _single_folder(path: Path) -> Path:
    """A zip of one folder (`data/captions.jsonl`, ...) is read from inside that folder."""
    entries = [p for p in path.iterdir() if p.name != "__MACOSX"]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() and not _layout(path) else path


def fingerprint(data: UserData) -> str:
    """A hash of the rows' file and every image's name, size and modification time (changes when the data do)."""
    digest = hashlib.sha256()
    for f in sorted([data.index] if data.index.is_file() else data.index.glob("*")):
        if f.is_file():
            digest.update(f.name.encode() + f.read_bytes() if f.stat().st_size < 50 * 2**20
                          else f"{f.name}{f.stat().st_size}{f.stat().st_mtime_ns}".encode())
    for p in data.pairs.pairs:
        if p.image and not p.image.startswith("row:"):
            st = (data.root / p.image).stat()
            digest.update(f"{p.image}|{st.st_size}|{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]


# ---------------------------------------------------------------------------------------------
# Reading the rows


def _layout(path: Path) -> tuple[str, Path] | None:
    if path.is_file():
        suffix = path.suffix.lower()
        return {".jsonl": ("jsonl", path), ".csv": ("csv", path), ".parquet": ("parquet", path),
                ".txt": ("txt", path)}.get(suffix)
    for name, layout in (("captions.jsonl", "jsonl"), ("captions.csv", "csv"), ("texts.txt", "txt"),
                         ("texts.jsonl", "jsonl")):
        if (path / name).is_file():
            return layout, path / name
    if (path / "state.json").is_file() and list(path.glob("*.arrow")):
        return "arrow", path
    parquet = sorted(path.glob("*.parquet"))
    if parquet:
        return "parquet", parquet[0]
    return None


def load(locator: str, kind: str = "vlm") -> UserData:
    """Read a user's data; rows that cannot be used are in `.skipped`. `kind`: the model's ("vlm" needs
    images; a "causal_lm" reads only the texts)."""
    path = resolve(locator)
    found = _layout(path)
    if found is None:
        raise DataError(f"'{access.shown(locator)}' has no captions.jsonl, captions.csv, *.parquet, datasets folder "
                        "(state.json + *.arrow), texts.txt or texts.jsonl.")
    layout, index = found
    root = index.parent if index.is_file() else index
    records = _records(layout, index)
    columns = _columns([r for _, r in records[:50] if "_blank" not in r], layout)
    if kind == "vlm" and "image" not in columns:
        raise DataError(f"{index.name} has no image column ({', '.join(IMAGE_COLUMNS)}); a vision-language model "
                        "needs an image per caption.")
    pairs, skipped = [], []
    for row, record in records[:MAX_ROWS]:
        pair, why = _pair(row, record, columns, root, layout, kind)
        if why:
            skipped.append(Skipped(row=row, image=str(record.get(columns.get("image", ""), "") or "")[:200],
                                   reason=why))
        else:
            pairs.append(pair)
    pairs, duplicates, notes = _without_duplicates(pairs, root, index, layout, columns)
    labelled = "label" in columns
    pair_set = PairSet(dataset=USER, seed=0, image_size=None, pairs=pairs, source=locator, labelled=labelled,
                       notes=notes)
    return UserData(locator=locator, root=root, layout=layout, index=index, pairs=pair_set,
                    skipped=sorted(skipped + duplicates, key=lambda s: s.row), rows_read=len(records),
                    columns=columns, notes=notes)


def _records(layout: str, index: Path) -> list[tuple[int, dict]]:
    """(row, record) of every row: the 0-based file line for text layouts (blank lines included, as
    `{"_blank": True}`), the table row for Parquet and `datasets` folders."""
    try:
        if layout in ("jsonl", "txt"):
            lines = index.read_text(encoding="utf-8").splitlines()
            parse = _json_line if layout == "jsonl" else (lambda line, i: {"text": line})
            return [(i, parse(line, i) if line.strip() else {"_blank": True}) for i, line in enumerate(lines)]
        if layout == "csv":
            return csv_records(index)
        table = _table(str(index), index.stat().st_mtime_ns)
        blobs = [c for c in table.column_names if c in IMAGE_COLUMNS and _is_blob(table, c)]
        records = table.drop_columns(blobs).to_pylist()  # images stay in the mapped file until asked for
        for record in records:
            record.update(dict.fromkeys(blobs))
        return list(enumerate(records))
    except (OSError, UnicodeDecodeError, csv.Error, ValueError) as exc:
        raise DataError(f"{index.name} cannot be read: {_first(exc)}") from None


def csv_records(index: Path) -> list[tuple[int, dict]]:
    """(0-based line where the record starts, record) of a CSV file; the header is line 0."""
    out = []
    with open(index, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None) or []
        while True:
            start = reader.line_num  # lines read so far = the next record's first line (0-based)
            row = next(reader, None)
            if row is None:
                return out
            if not row:
                out.append((start, {"_blank": True}))
                continue
            record = dict(zip(header, row + [None] * (len(header) - len(row))))
            out.append((start, record))


def _first(exc: BaseException) -> str:
    """One line of why, without server paths (an OSError's own text names the file's full path)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip().splitlines()
    return access.without_paths(text[0] if text else type(exc).__name__)[:200]


def _json_line(line: str, i: int) -> dict:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return {"_error": f"line {i + 1} is not JSON"}
    return value if isinstance(value, dict) else {"_error": f"line {i + 1} is not a JSON object"}


def _columns(sample: list[dict], layout: str) -> dict[str, str]:
    names = list(dict.fromkeys(k for r in sample for k in r))
    out = {}
    for role, options in (("image", IMAGE_COLUMNS), ("text", TEXT_COLUMNS), ("label", LABEL_COLUMNS)):
        found = next((c for c in options if c in names), None)
        if found is not None:
            out[role] = found
    if "text" not in out and not all("_error" in r for r in sample):
        raise DataError(f"No caption column ({' or '.join(TEXT_COLUMNS)}) among {', '.join(names) or 'no columns'}.")
    return out


def _label(value) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "corrupted", "bad"):
        return True
    if text in ("0", "false", "no", "clean", "good"):
        return False
    return None


def _pair(row: int, record: dict, columns: dict, root: Path, layout: str, kind: str) -> tuple[Pair | None, str]:
    """(pair, "") or (None, why the row cannot be used)."""
    if "_blank" in record:
        return None, "blank line"
    if "_error" in record:
        return None, record["_error"]
    text = str(record.get(columns.get("text", ""), "") or "").strip()
    if not text:
        return None, "empty caption"
    label = None
    if "label" in columns:
        label = _label(record.get(columns["label"]))
        if label is None:
            return None, f"label {record.get(columns['label'])!r} is neither true/false, 1/0 nor corrupted/clean"
    image = ""
    if kind == "vlm":
        image, why = _image_ref(row, record, columns, root, layout)
        if why:
            return None, why
    pair = Pair(text=text, corrupted=bool(label), kind=("corrupted" if label else "clean") if label is not None
                else "unlabelled", image=image, row=row)
    return pair, ""


def _image_ref(row: int, record: dict, columns: dict, root: Path, layout: str) -> tuple[str, str]:
    value = record.get(columns["image"])
    if layout in ("parquet", "arrow") and (value is None or isinstance(value, dict)):
        return f"row:{row}", ""  # an image stored in the table: read when its batch comes
    name = str(value or "").strip()
    if not name:
        return "", "no image"
    path = (root / name).resolve()
    if root.resolve() not in path.parents:
        return "", f"image path '{name}' leaves the data folder"
    if not path.is_file():
        return "", f"image '{name}' is missing"
    if path.stat().st_size > images.MAX_IMAGE_BYTES:
        return "", f"image '{name}' is {path.stat().st_size / 2**20:.1f} MB (limit {images.MAX_IMAGE_BYTES / 2**20:g} MB)"
    return name, ""


def _without_duplicates(pairs: list[Pair], root: Path, index: Path, layout: str,
                        columns: dict) -> tuple[list[Pair], list[Skipped], list[str]]:
    """(pairs with every repeat of an earlier row left out, the repeats as Skipped, notes on rows that show
    an earlier row's image with another caption). Images are compared by content."""
    image_key = _image_keys(pairs, root, index, layout, columns)
    kept, repeats, first_of_pair, first_of_image, same_image = [], [], {}, {}, {}
    for pair in pairs:
        image = image_key.get(pair.row, "")
        earlier = first_of_pair.setdefault((pair.text, image), pair.row)
        if earlier != pair.row:
            what = "the same caption and image" if image else "the same text"
            repeats.append(Skipped(row=pair.row, image=pair.image, reason=f"duplicate of row {earlier + 1} ({what})"))
            continue
        kept.append(pair)
        if image:
            first = first_of_image.setdefault(image, pair.row)
            if first != pair.row:
                same_image.setdefault(first, []).append(pair.row)
    notes = [f"Rows {', '.join(str(r + 1) for r in rows)} show the same image as row {first + 1} with other captions "
             "(kept: several captions per image are normal)." for first, rows in sorted(same_image.items())]
    return kept, repeats, notes


def _image_keys(pairs: list[Pair], root: Path, index: Path, layout: str, columns: dict) -> dict[int, str]:
    """{row: a key of the row's image content}: files of equal size are hashed (others cannot be equal);
    images stored in a table are hashed from the table's bytes."""
    if not any(p.image for p in pairs):
        return {}
    keys: dict[int, str] = {}
    by_size: dict[int, list[tuple[int, Path]]] = {}
    for p in pairs:
        if p.image.startswith("row:"):
            keys[p.row] = _blob_key(index, columns, int(p.image[4:]))
        elif p.image:
            path = (root / p.image).resolve()
            by_size.setdefault(path.stat().st_size, []).append((p.row, path))
    for group in by_size.values():
        for row, path in group:
            keys[row] = hashlib.sha256(path.read_bytes()).hexdigest() if len(group) > 1 else f"file:{path}"
    return keys


def _blob_key(index: Path, columns: dict, row: int) -> str:
    value = _table(str(index), index.stat().st_mtime_ns).column(columns["image"])[row].as_py()
    if isinstance(value, dict):
        value = value.get("bytes") or (f"path:{value.get('path')}" if value.get("path") else None)
    if isinstance(value, (bytes, bytearray)):
        return hashlib.sha256(bytes(value)).hexdigest()
    return f"{value}" if value else f"row:{row}"


# ---------------------------------------------------------------------------------------------
# Tables (Parquet, datasets' Arrow files) and images


def _is_blob(table, column: str) -> bool:
    import pyarrow as pa

    typ = table.schema.field(column).type
    return pa.types.is_struct(typ) or pa.types.is_binary(typ) or pa.types.is_large_binary(typ)


@functools.lru_cache(maxsize=4)
def _table(path: str, stamp: int):
    """The rows of a Parquet file or a `datasets` folder as one Arrow table, memory-mapped (images are read
    from the mapped file only when asked for)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(path)
    if p.is_file():
        return pq.read_table(p, memory_map=True)
    state = json.loads((p / "state.json").read_text())
    files = [p / f["filename"] for f in state.get("_data_files", [])] or sorted(p.glob("*.arrow"))
    tables = []
    for f in files:
        with pa.memory_map(str(f)) as source:
            tables.append(pa.ipc.open_stream(source).read_all())
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def user_image(data_root: Path, index: Path, layout: str, image: str, columns: dict):
    """The decoded image of one pair (ImageError with the reason when it cannot be used)."""
    if image.startswith("row:"):
        table = _table(str(index), index.stat().st_mtime_ns)
        value = table.column(columns["image"])[int(image[4:])].as_py()
        if isinstance(value, dict):
            blob = value.get("bytes")
            if blob is None and value.get("path"):
                return _file_image(data_root, value["path"])
            value = blob
        if not value:
            raise images.ImageError(f"row {image[4:]} has no image")
        return images.open_image(bytes(value), name=f"the image of row {image[4:]}")
    return _file_image(data_root, image)


def _file_image(root: Path, name: str):
    path = (root / name).resolve()
    if root.resolve() not in path.parents or not path.is_file():
        raise images.ImageError(f"image '{name}' is missing")
    return images.open_image(path.read_bytes(), name=f"'{name}'")


@functools.lru_cache(maxsize=8)
def _loaded(locator: str, kind: str) -> UserData:
    return load(locator, kind)


def pair_image(pairs: PairSet, i: int):
    """The image of pair `i`: drawn again for a generated pair, read from the user's files for theirs."""
    if pairs.dataset != USER:
        return render_pair(pairs, i)
    data = _loaded(pairs.source, "vlm")
    return user_image(data.root, data.index, data.layout, pairs.pairs[i].image, data.columns)


# ---------------------------------------------------------------------------------------------
# Single images given to explain or steer: kept by content hash in this server's cache


def save_image(data: bytes, name: str = "The file", owner: str = "") -> str:
    """Check an uploaded image (the one decoder, analysis/framework/images.py) and keep it in the upload area (its
    limits as for zips; `owner` is the visitor's id); returns `sha:HEX`."""
    images.open_image(data, name=name)
    sha = hashlib.sha256(data).hexdigest()
    uploads.UploadArea(upload_root()).add_file(f"images/{sha}.img", data, uploads.owner_key(owner), what=name)
    return f"sha:{sha}"


def image_from_ref(ref: str, pairs: PairSet | None = None):
    """The image an explain / steer request names: `pair:I` of `pairs`, `sha:HEX` of an upload, `file:PATH`
    under the allowed roots; None for ""."""
    if not ref:
        return None
    kind, _, value = ref.partition(":")
    if kind == "pair":
        if pairs is None or not value.isdigit() or int(value) >= len(pairs.pairs):
            raise SettingsError(f"There is no pair {value} to take the image from.")
        return pair_image(pairs, int(value))
    if kind == "sha":
        path = upload_root() / "images" / f"{_hex(value)}.img"
        if not path.is_file():
            raise SettingsError("That uploaded image is no longer on this server; upload it again.")
        return images.open_image(path.read_bytes(), name="The uploaded image")
    if kind == "file":
        path = access.server_path(value, "an image")
        if not path.is_file():
            raise SettingsError(f"'{access.shown(value)}' is not an image file.")
        return images.open_image(path.read_bytes(), name=f"'{path.name}'")
    raise SettingsError(f"An image is named pair:I, sha:HEX or file:PATH, got '{access.shown(ref)}'.")

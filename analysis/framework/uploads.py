"""What visitors' uploads may take on this server's disk, and for how long.

An upload that is kept (a data zip unpacked for the SAE-V page, an image given to explain or steer) is
an *entry* of an upload area: a file or folder under the area's root with a small record beside it
(`NAME.upload.json`: whose it is, when it came, how many bytes). Every entry of every kind is held to
the same limits of the deployment configuration (`[uploads]` in docs/deploy.md):

- `files`: entries one visitor may keep at once;
- `visitor_mb`: bytes one visitor's entries may take (a zip counted unpacked);
- `total_mb`: bytes every visitor's entries may take together;
- `keep_seconds`: an entry is deleted this long after it arrived (`sweep`, run at every new entry and
  every few seconds by the server, scripts/serve.py).

An entry is written into a `.partial` sibling first and renamed into place only when whole and within
the limits: a refused or failed upload leaves nothing behind. Visitors are recorded by a hash of their
id (never their address). With no configuration every limit is off, as a local run always was.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from analysis.framework.errors import UserError

RECORD = ".upload.json"
PARTIAL = ".partial"
TRASH = ".trash"  # an expired entry, renamed aside under the lock, deleted outside it
SWEEP_PASS = 256  # entries one sweep pass moves aside at most
SWEEP_INLINE = 8  # ... and a new upload's own pass
BLOCK = 4096  # what a file or a folder takes on disk at least (one block, one inode): an entry is counted so
STALE_PARTIAL_S = 600.0  # a .partial this old belongs to a write that died with its process


class UploadRefused(UserError):
    """An upload over one of the instance's limits; the message names the limit."""


@dataclass(frozen=True)
class Quota:
    files: int = 0  # 0: no limit
    visitor_bytes: int = 0
    total_bytes: int = 0
    keep_s: float = 0.0

    @classmethod
    def current(cls) -> "Quota":
        from analysis.framework import config

        u = config.current().uploads
        return cls(files=u.files, visitor_bytes=u.visitor_mb * 2**20, total_bytes=u.total_mb * 2**20,
                   keep_s=float(u.keep_seconds))


@dataclass(frozen=True)
class Entry:
    path: Path
    owner: str
    created: float
    bytes: int


def owner_key(visitor: str) -> str:
    """What an entry records of its visitor: a hash, so that no address is written to disk."""
    return hashlib.sha256(visitor.encode()).hexdigest()[:16] if visitor else ""


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f}".rstrip("0").rstrip(".") + " MB"


def size_of(path: Path) -> int:
    """What `path` takes on disk, as the limits count it: each file rounded up to whole blocks and each folder
    one block (a zip of 100 k empty folders is 400 MB of disk, not 0 bytes)."""
    if path.is_file():
        return on_disk(path.stat().st_size)
    total = BLOCK
    for p in path.rglob("*"):
        if p.is_symlink():
            continue
        total += on_disk(p.stat().st_size) if p.is_file() else BLOCK
    return total


def on_disk(n: int) -> int:
    return -(-max(n, 1) // BLOCK) * BLOCK


def _listing(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


class UploadArea:
    """The entries under one root (one lock per root in this process; renames make each entry whole)."""

    _locks: dict[str, threading.Lock] = {}

    def __init__(self, root: Path, quota: Quota | None = None) -> None:
        self.root = Path(root)
        self.quota = quota if quota is not None else Quota.current()
        self.lock = UploadArea._locks.setdefault(str(self.root.resolve()), threading.Lock())

    # -- what is there ------------------------------------------------------------------------

    def records(self) -> list[Path]:
        """The records of this area's entries. Entries are named `NAME` or `FOLDER/NAME` (uploads.py's callers:
        `SHA`, `images/SHA.img`), so records lie one or two levels down and never inside an entry: a zip that
        carries a file named like a record neither makes an entry nor costs a walk of its folders."""
        if not self.root.is_dir():
            return []
        found = []
        for child in _listing(self.root):
            if child.name.endswith(RECORD):
                found.append(child)
            elif child.is_dir() and not child.is_symlink() and not _record_of(child).exists() \
                    and not child.name.endswith((PARTIAL, TRASH)):
                found.extend(p for p in _listing(child) if p.name.endswith(RECORD))
        return found

    def entries(self) -> list[Entry]:
        out = []
        for record in self.records():
            path = record.with_name(record.name[:-len(RECORD)])
            try:
                meta = json.loads(record.read_text())
                out.append(Entry(path, str(meta.get("owner", "")), float(meta["created"]), int(meta["bytes"])))
            except (OSError, ValueError, KeyError, TypeError):  # a torn record: the entry is swept as old
                out.append(Entry(path, "", 0.0, 0))
        return out

    def usage(self, owner: str | None = None) -> tuple[int, int]:
        """(entries, bytes) of one owner (an owner_key), or of everyone."""
        mine = [e for e in self.entries() if owner is None or e.owner == owner]
        return len(mine), sum(e.bytes for e in mine)

    def disk_bytes(self) -> int:
        """Everything under the root, records and partial writes included (what a test measures)."""
        return size_of(self.root) - BLOCK if self.root.exists() else 0  # the root's own block aside

    # -- expiry -------------------------------------------------------------------------------
    # Sweeping never holds the lock that new entries need while it walks or deletes: under the lock it only
    # renames one expired entry into a `.trash` sibling (a metadata operation, microseconds), and the trash is
    # deleted outside it. A pass handles at most `limit` entries; the server's sweeper runs passes until none
    # is left (a folder of 100 k files takes seconds to delete; nobody waits on it).

    def sweep(self, now: float | None = None, limit: int = SWEEP_PASS) -> int:
        """Delete up to `limit` expired entries, stale partial writes and unrecorded leftovers, then the trash;
        how many entries and leftovers went."""
        gone = self.expire(now, limit)
        self.empty_trash()
        return gone

    def expire(self, now: float | None = None, limit: int = SWEEP_PASS) -> int:
        """Move up to `limit` expired entries (and leftovers as old as an entry may get) into the trash."""
        now = time.time() if now is None else now
        if not self.root.is_dir():
            return 0
        keep = self.quota.keep_s
        gone = 0
        for entry in self.entries():
            if gone >= limit:
                return gone
            if (keep and now - entry.created >= keep) or not entry.path.exists():
                with self.lock:
                    _to_trash(entry.path)
                    _record_of(entry.path).unlink(missing_ok=True)
                gone += 1
        for path in self._leftovers():
            if gone >= limit:
                break
            try:
                age = now - path.stat().st_mtime
            except OSError:
                continue
            partial = path.name.endswith(PARTIAL)
            if (partial and age >= STALE_PARTIAL_S) or (not partial and keep and age >= keep):
                with self.lock:  # a write that died, or a file from before entries had records
                    _to_trash(path)
                gone += 1
        return gone

    def _leftovers(self) -> list[Path]:
        """Files and folders at an entry's level that no record names (the trash aside): partial writes, and
        uploads from before entries had records."""
        out = []
        for child in _listing(self.root):
            if child.name.endswith((RECORD, TRASH)) or _record_of(child).exists():
                continue
            if child.is_dir() and not child.is_symlink() and not child.name.endswith(PARTIAL):
                inner = [p for p in _listing(child) if not p.name.endswith((RECORD, TRASH))]
                if any(_record_of(p).exists() for p in inner):  # a folder of entries (images/)
                    out.extend(p for p in inner if not _record_of(p).exists())
                    continue
            out.append(child)
        return out

    def empty_trash(self) -> None:
        """Delete what sweeping moved aside (outside the lock: new entries never wait for it)."""
        if not self.root.is_dir():
            return
        for child in _listing(self.root):
            if child.is_dir() and not child.is_symlink() and not child.name.endswith(TRASH):
                for inner in _listing(child):
                    if inner.name.endswith(TRASH):
                        _delete(inner)
            elif child.name.endswith(TRASH):
                _delete(child)

    # -- a new entry --------------------------------------------------------------------------

    def room(self, owner: str) -> int:
        """Bytes this owner may still add (refused with the limit's message when none or no entry is left)."""
        q = self.quota
        entries = self.entries()
        mine = [e for e in entries if e.owner == owner]
        if q.files and len(mine) >= q.files:
            raise UploadRefused(f"You have {len(mine)} uploads on this instance, the most one visitor may keep at "
                                f"once ({q.files}); they are deleted {_after(q.keep_s)}.")
        left = []
        if q.visitor_bytes:
            left.append(q.visitor_bytes - sum(e.bytes for e in mine))
        if q.total_bytes:
            left.append(q.total_bytes - sum(e.bytes for e in entries))
        room = min(left) if left else 1 << 62
        if room <= 0:
            raise UploadRefused(self._full_message(mine, entries))
        return room

    def _full_message(self, mine: list[Entry], entries: list[Entry]) -> str:
        q = self.quota
        if q.visitor_bytes and sum(e.bytes for e in mine) >= q.visitor_bytes:
            return (f"Your uploads take {_mb(sum(e.bytes for e in mine))} on this instance, the most one visitor may "
                    f"keep ({_mb(q.visitor_bytes)}); they are deleted {_after(q.keep_s)}.")
        return (f"This instance's space for uploads ({_mb(q.total_bytes)} for every visitor together) is full; "
                f"uploads are deleted {_after(q.keep_s)}. Try again later.")

    def too_big(self, what: str, n: int, room: int) -> UploadRefused:
        q = self.quota
        mine_limit = f"one visitor's uploads may take {_mb(q.visitor_bytes)}" if q.visitor_bytes else ""
        all_limit = f"every visitor's together {_mb(q.total_bytes)}" if q.total_bytes else ""
        limits = " and ".join(x for x in (mine_limit, all_limit) if x)
        return UploadRefused(f"{what} takes {_mb(n)}; {_mb(max(room, 0))} is left for it on this instance "
                             f"({limits}). Nothing was kept.")

    @contextlib.contextmanager
    def writing(self, name: str, owner: str, what: str = "The upload") -> Iterator[tuple[Path, int]]:
        """Write a new entry `name` (a relative path) for `owner`: yields (a partial path to write, the
        bytes it may take). When the block ends the entry is measured and, within the limits, renamed into
        place with its record; on any error or refusal the partial write is removed. The block may write a
        file or a folder at the partial path."""
        self.expire(limit=SWEEP_INLINE)  # cheap renames; the sweeper (or the next full sweep) deletes them
        room = self.room(owner)
        target = self.root / name
        partial = target.with_name(target.name + PARTIAL)
        target.parent.mkdir(parents=True, exist_ok=True)
        _delete(partial)
        try:
            yield partial, room
            n = size_of(partial) if partial.exists() else 0
            with self.lock:
                room = self.room(owner)  # again: another tab of this visitor may have added one meanwhile
                if n > room:
                    raise self.too_big(what, n, room)
                _to_trash(target)
                partial.rename(target)
                _record_of(target).write_text(json.dumps({"owner": owner, "created": time.time(), "bytes": n}))
        finally:
            _delete(partial)

    def add_file(self, name: str, data: bytes, owner: str, what: str = "The upload") -> Path:
        """Keep `data` as the entry `name` (nothing new when that entry is already there)."""
        target = self.root / name
        if target.is_file() and _record_of(target).is_file():
            return target
        with self.writing(name, owner, what) as (partial, room):
            if len(data) > room:
                raise self.too_big(what, len(data), room)
            partial.write_bytes(data)
        return target


def _record_of(path: Path) -> Path:
    return path.with_name(path.name + RECORD)


def _to_trash(path: Path) -> None:
    """Move `path` aside (one rename) for empty_trash to delete."""
    if path.exists() or path.is_symlink():
        with contextlib.suppress(OSError):
            path.rename(path.with_name(f"{path.name}.{secrets.token_hex(4)}{TRASH}"))


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _after(keep_s: float) -> str:
    if not keep_s:
        return "when the server restarts or its operator clears them"
    if keep_s >= 3600:
        return f"{keep_s / 3600:g} h after they arrived"
    if keep_s >= 60:
        return f"{keep_s / 60:g} min after they arrived"
    return f"{keep_s:g} s after they arrived"


# ---------------------------------------------------------------------------------------------
# The areas of this process, swept on a timer by the server


_ROOTS: list[Callable[[], Path]] = []


def register(root: Callable[[], Path]) -> None:
    """A module that keeps uploads names its area's root once (a function: the root may follow the environment)."""
    if root not in _ROOTS:
        _ROOTS.append(root)


def sweep_all() -> int:
    quota = Quota.current()
    return sum(UploadArea(root(), quota).sweep() for root in _ROOTS)


def start_sweeper(every_s: float | None = None) -> threading.Thread | None:
    """A daemon thread sweeping every registered area (scripts/serve.py starts it): an upload is gone
    `keep_seconds` after it came even when nobody uploads again. None when uploads are kept."""
    keep = Quota.current().keep_s
    if not keep:
        return None
    every = every_s if every_s is not None else min(60.0, max(1.0, keep / 4))

    def loop() -> None:
        while True:
            gone = 0
            with contextlib.suppress(Exception):  # a disk hiccup must not end the sweeper
                gone = sweep_all()
            time.sleep(0.05 if gone else every)  # passes follow each other while there is more to sweep

    thread = threading.Thread(target=loop, name="upload-sweeper", daemon=True)
    thread.start()
    return thread

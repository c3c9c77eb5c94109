"""Uploads bounded in entries, not only bytes (#50): a zip of folders is refused before anything is extracted
and counted by the blocks it would take; sweeping expired uploads is incremental and never holds the lock a
new upload needs for more than milliseconds."""
from __future__ import annotations

import io
import threading
import time
import zipfile

import pytest

from analysis.framework import config as cfg
from analysis.framework import uploads
from analysis.framework.uploads import Quota, UploadArea
from conftest import ROOT


@pytest.fixture()
def upload_cache(monkeypatch, tmp_path):
    from analysis.sae_v import types

    monkeypatch.setattr(types, "CACHE_ROOT", tmp_path / "sae")
    config = tmp_path / "public.toml"
    config.write_text((ROOT / "deploy" / "public.toml").read_text())
    monkeypatch.setenv(cfg.CONFIG_ENV, str(config))
    return tmp_path / "sae" / "uploads"


def _zip(names: list[str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in names:
            zf.writestr(name, "" if name.endswith("/") else "x")
    return buf.getvalue()


def test_a_zip_of_nested_folders_is_refused_before_anything_is_extracted(upload_cache):
    from analysis.sae_v import userdata

    deep = _zip(["captions.jsonl"] + [f"a{i}/b/c/f.txt" for i in range(1500)])  # 4,500 implied folders
    assert len(deep) < 500_000
    with pytest.raises(userdata.DataError, match=r"4500 folders.*at most 20000 entries, 1000 folders"):
        userdata.save_zip(deep, "'deep.zip'", owner="ip:1.2.3.4")
    named = _zip([f"{'d/' * 30}{i}/" for i in range(25_000)])  # folders only: no file at all
    with pytest.raises(userdata.DataError, match=r"25000 entries.*Nothing was extracted"):
        userdata.save_zip(named, "'dirs.zip'", owner="ip:1.2.3.4")
    assert not upload_cache.exists() or list(upload_cache.rglob("*")) == []


def test_the_folders_of_an_accepted_zip_count_as_disk(upload_cache):
    from analysis.sae_v import userdata

    data = _zip(["d/texts.txt"] + [f"d/x{i}/e.txt" for i in range(400)])  # 401 one-byte files, 402 folders
    userdata.save_zip(data, "'ok.zip'", owner="ip:v")
    area = UploadArea(upload_cache)
    entries, counted = area.usage(uploads.owner_key("ip:v"))
    assert entries == 1 and counted >= (401 + 401) * uploads.BLOCK  # before: 401 bytes
    assert counted == uploads.size_of(area.entries()[0].path)


class TimedLock:
    """A lock that records how long each holder kept it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.holds: list[float] = []
        self._since = 0.0

    def __enter__(self):
        self._lock.acquire()
        self._since = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.holds.append(time.perf_counter() - self._since)
        self._lock.release()

    acquire = __enter__

    def release(self):
        self.__exit__()


def test_a_sweep_over_many_entries_never_keeps_a_new_upload_waiting(tmp_path):
    area = UploadArea(tmp_path, Quota(keep_s=60))
    for i in range(150):
        area.add_file(f"images/{i}.img", b"x" * 10, f"v{i % 7}")
    with area.writing("big", "v0") as (partial, _):  # an extracted zip of many files
        for d in range(40):
            (partial / f"d{d}").mkdir(parents=True)
            for f in range(100):
                (partial / f"d{d}" / f"{f}.txt").write_bytes(b"y")
    lock = TimedLock()
    UploadArea._locks[str(tmp_path.resolve())] = lock
    try:
        later = time.time() + 120  # everything above has expired
        assert UploadArea(tmp_path, Quota(keep_s=60)).sweep(later, limit=60) == 60  # one bounded pass
        sweeper = threading.Thread(target=lambda: [UploadArea(tmp_path, Quota(keep_s=60)).sweep(later)
                                                   for _ in range(3)])
        sweeper.start()
        time.sleep(0.01)
        start = time.perf_counter()
        new = UploadArea(tmp_path, Quota(keep_s=60)).add_file("images/new.img", b"z" * 2400, "visitor")
        waited = time.perf_counter() - start
        assert new.read_bytes() == b"z" * 2400
        sweeper.join()
    finally:
        UploadArea._locks.pop(str(tmp_path.resolve()), None)
    assert max(lock.holds) < 0.25, f"the lock was held {max(lock.holds):.3f} s; holds: {sorted(lock.holds)[-5:]}"
    assert waited < 1.0, waited
    left = UploadArea(tmp_path, Quota(keep_s=60))
    assert {e.path.name for e in left.entries()} <= {"new.img"}  # the sweep's clock is 2 min ahead
    assert not [p for p in tmp_path.rglob("*") if uploads.TRASH in p.name]


def test_uploads_held_in_memory_are_bounded_per_visitor_not_per_tab(monkeypatch, upload_cache):
    """The public example: 4 files and 25 MB per visitor. Before, each of 30 tabs had its own 4 and 25 MB."""
    from starlette.exceptions import HTTPException
    from streamlit.runtime.uploaded_file_manager import UploadedFileRec

    from components import server_guards

    monkeypatch.setattr(server_guards, "session_visitor", lambda sid: sid.split("/")[0])
    store = server_guards.BoundedUploads("/_stcore/upload_file")

    def put(session: str, i: int, size: int) -> int:
        try:
            store.add_file(session, UploadedFileRec(f"f{i}", f"{i}.png", "image/png", b"x" * size))
            return 200
        except HTTPException as exc:
            return exc.status_code

    codes = [put(f"visitor-a/tab{i}", i, 1024) for i in range(6)]  # six tabs of one visitor
    assert codes == [200, 200, 200, 200, 413, 413]
    assert put("visitor-b/tab0", 0, 1024) == 200  # another visitor has their own
    assert put("visitor-b/tab1", 1, 25 * 2**20) == 413  # 25 MB per visitor, across tabs
    assert put("visitor-a/tab0", 0, 2048) == 200  # a file replaced in place is not one more

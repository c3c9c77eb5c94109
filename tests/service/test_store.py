"""Saved-analysis store: round trips, migration, concurrency, and crash safety."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

from analysis.hosting.store import SCHEMA_VERSION, AnalysisStore, SavedAnalysis

from analysis.framework.paths import ROOT


def _analysis(i: int = 0) -> SavedAnalysis:
    return SavedAnalysis(
        title=f"analysis {i}", note="a <b>note</b>", panel="kv", model="zoo:shapes-lm",
        params={"budget": 32 + i, "policy": "morphkv"},
        result={"kept": [[1, 2, 3]], "kl": [0.1, 0.25], "nested": {"a": None}},
        figures=[{"name": "fig", "figure": {"data": [{"type": "bar", "y": [1, 2]}], "layout": {}}}],
        tables={"rows": [{"policy": "h2o", "acc": 0.5}]}, url="?model=zoo:shapes-lm&budget=32",
    )


def test_saved_analysis_reopens_identical_after_restart(tmp_path):
    path = tmp_path / "a.db"
    original = _analysis()
    saved_id = AnalysisStore(path).save(original)
    # a fresh process opens it: same JSON
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(ROOT)!r})
        from analysis.hosting.store import AnalysisStore
        a = AnalysisStore({str(path)!r}).get({saved_id!r})
        print(json.dumps(a.to_dict()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    reopened = json.loads(out)
    expected = original.to_dict()
    for key in ("title", "note", "panel", "model", "params", "result", "figures", "tables", "url"):
        assert reopened[key] == expected[key]
    assert reopened["id"] == saved_id


def test_list_delete_and_order(tmp_path):
    store = AnalysisStore(tmp_path / "a.db")
    ids = [store.save(_analysis(i)) for i in range(3)]
    assert [a.id for a in store.list()] == ids[::-1]
    assert store.delete(ids[1]) is True
    assert store.get(ids[1]) is None
    assert store.delete(ids[1]) is False
    assert [a.id for a in store.list()] == [ids[2], ids[0]]


def test_store_uses_wal_and_current_schema(tmp_path):
    store = AnalysisStore(tmp_path / "a.db")
    assert store.schema_version() == SCHEMA_VERSION
    conn = sqlite3.connect(tmp_path / "a.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_version_1_store_is_migrated_keeping_rows(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE analyses (id TEXT PRIMARY KEY, created REAL NOT NULL, title TEXT NOT NULL,
            note TEXT NOT NULL DEFAULT '', panel TEXT NOT NULL, model TEXT NOT NULL,
            params TEXT NOT NULL, result TEXT NOT NULL);
        INSERT INTO analyses VALUES ('old1', 1.0, 'from v1', '', 'kv', 'zoo:x', '{"b": 1}', '{"r": 2}');
        PRAGMA user_version=1;
    """)
    conn.close()
    store = AnalysisStore(path)
    assert store.schema_version() == SCHEMA_VERSION
    old = store.get("old1")
    assert (old.title, old.params, old.result, old.figures, old.tables) == ("from v1", {"b": 1}, {"r": 2}, [], {})


def test_concurrent_saves_from_threads_all_land(tmp_path):
    store = AnalysisStore(tmp_path / "a.db")
    ids: list[str] = []
    errors: list[Exception] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        for i in range(10):
            try:
                saved = store.save(_analysis(w * 100 + i))
                with lock:
                    ids.append(saved)
            except Exception as exc:  # pragma: no cover - a failure is what we look for
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(ids) == 80 and len(set(ids)) == 80
    assert {a.id for a in store.list()} == set(ids)


def test_process_killed_during_saves_leaves_committed_analyses_readable(tmp_path):
    path = tmp_path / "a.db"
    AnalysisStore(path)
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from analysis.hosting.store import AnalysisStore, SavedAnalysis
        store = AnalysisStore({str(path)!r})
        big = {{"blob": "x" * 200000}}
        i = 0
        while True:
            saved = store.save(SavedAnalysis(title=f"t{{i}}", panel="p", model="m", result=big))
            print(saved, flush=True)
            i += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    committed = []
    deadline = time.time() + 60
    while len(committed) < 25 and time.time() < deadline:
        line = proc.stdout.readline()
        if line:
            committed.append(line.strip())
    proc.kill()  # SIGKILL, most likely in the middle of the next save
    proc.wait()
    assert len(committed) >= 25
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    store = AnalysisStore(path)
    for saved_id in committed:
        a = store.get(saved_id)
        assert a is not None and len(a.result["blob"]) == 200000

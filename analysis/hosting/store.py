"""Saved analyses: one interface, two backends.

    store = open_store()                       # $MODEL_INSPECTOR_STORE, the configuration, or the default
    store = open_store("postgresql://user@db/inspector")   # several servers share one gallery
    store = open_store("/data/analyses.db")    # SQLite: the embedded default, no setup

A saved analysis keeps everything needed to show it again without recomputing: the panel, the
model label, the params, the typed result (JSON), the figures (plotly JSON) and tables the panel
rendered, and who saved it. Every backend commits one save in one transaction and returns its id
only after the commit, so an id a visitor was shown survives the server being killed right after.

A save may carry a token (the share bar's: a hash of who saves what): saving again with the same token
returns the first save's id instead of a second copy, so a retry after a lost confirmation never
duplicates. Each row records its owner (a hash of the visitor's id): `delete(id, owner=...)` deletes
only the owner's. Text with a NUL character is refused by every backend alike (PostgreSQL cannot store
it; SQLite would), before anything is written.

- `SQLiteStore` (alias `AnalysisStore`): one file, WAL, versioned schema in `PRAGMA user_version`;
  short-lived connections, safe from many threads and processes on one machine.
- `PostgresStore`: a `postgresql://` URL (psycopg 3). Schema versions in `model_inspector_schema`,
  migrated under an advisory lock so replicas starting together do not race. JSON is kept as
  text, exactly as written.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from analysis.framework.results import Result, to_jsonable

SCHEMA_VERSION = 4
DEFAULT_PATH = Path(".model_inspector") / "analyses.db"
COLUMNS = ("id", "created", "title", "note", "panel", "model", "params", "result", "figures", "tables", "url",
           "saved_by", "owner", "token")
SUMMARY_COLUMNS = ("id", "created", "title", "note", "panel", "model", "url", "saved_by")
TITLE_MAX, NOTE_MAX, SAVED_BY_MAX = 200, 5000, 200

# Each migration brings the schema from version i to i + 1 (index i - 1 here); version 0 is empty.
MIGRATIONS = [
    """
    CREATE TABLE analyses (
        id TEXT PRIMARY KEY,
        created REAL NOT NULL,
        title TEXT NOT NULL,
        note TEXT NOT NULL DEFAULT '',
        panel TEXT NOT NULL,
        model TEXT NOT NULL,
        params TEXT NOT NULL,
        result TEXT NOT NULL
    );
    """,
    """
    ALTER TABLE analyses ADD COLUMN figures TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE analyses ADD COLUMN tables TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE analyses ADD COLUMN url TEXT NOT NULL DEFAULT '';
    CREATE INDEX analyses_created ON analyses(created);
    """,
    """
    ALTER TABLE analyses ADD COLUMN saved_by TEXT NOT NULL DEFAULT '';
    """,
    """
    ALTER TABLE analyses ADD COLUMN owner TEXT NOT NULL DEFAULT '';
    ALTER TABLE analyses ADD COLUMN token TEXT;
    CREATE UNIQUE INDEX analyses_token ON analyses(token);
    """,
]
# PostgreSQL: the same steps, with timestamps as DOUBLE PRECISION (REAL is 4 bytes there: seconds lost).
PG_MIGRATIONS = [m.replace("created REAL", "created DOUBLE PRECISION") for m in MIGRATIONS]
PG_LOCK_ID = 0x4D_49_53_54  # "MIST": the advisory lock migrations are run under


class StoreError(RuntimeError):
    """The store cannot be opened or used; the message is for the person running the server."""


class RefusedAnalysis(StoreError, ValueError):
    """An analysis no backend stores as given (a NUL character); the message is for the visitor."""


@dataclass
class SavedAnalysis(Result):
    title: str
    panel: str
    model: str
    params: dict = field(default_factory=dict)
    result: dict = field(default_factory=dict)
    note: str = ""
    figures: list = field(default_factory=list)  # plotly figures as JSON dicts
    tables: dict = field(default_factory=dict)  # name -> list of row dicts
    url: str = ""  # the query string that reproduces the live view
    saved_by: str = ""  # who saved it (signed-in name or e-mail; "" when nobody signs in)
    owner: str = ""  # a hash of the visitor's id: who may delete it (never shown)
    token: str = ""  # the saver's idempotency token: a second save with it returns the first's id
    id: str = ""
    created: float = 0.0


def default_store_path() -> Path:
    """Where the SQLite store lives when nothing else is configured (kept for callers of old)."""
    return Path(os.environ.get("MODEL_INSPECTOR_STORE", str(DEFAULT_PATH)))


def store_location() -> str:
    """$MODEL_INSPECTOR_STORE, else the configuration's `store`, else .model_inspector/analyses.db."""
    from analysis.framework import config

    return config.current().store or str(DEFAULT_PATH)


def is_postgres(location: str) -> bool:
    return str(location).startswith(("postgresql://", "postgres://"))


def open_store(location: str | Path | None = None) -> "Store":
    location = str(location) if location is not None else store_location()
    return PostgresStore(location) if is_postgres(location) else SQLiteStore(location)


_TEXT_FIELDS = {"title": "title", "note": "note", "panel": "panel", "model": "model", "url": "link",
                "saved_by": "name", "owner": "owner", "token": "token"}


def _refuse_nul(analysis: SavedAnalysis) -> None:
    """PostgreSQL cannot store NUL in text; SQLite could. Both refuse it, the same way, before writing."""
    for name, words in _TEXT_FIELDS.items():
        if "\x00" in str(getattr(analysis, name)):
            raise RefusedAnalysis(f"The {words} contains a NUL character (\\0), which cannot be saved; remove it "
                                  "and save again.")


def _row_values(analysis: SavedAnalysis) -> tuple:
    _refuse_nul(analysis)
    analysis_id = analysis.id or secrets.token_urlsafe(8)
    return (
        analysis_id, analysis.created or time.time(),
        analysis.title.strip()[:TITLE_MAX] or "Untitled analysis", analysis.note[:NOTE_MAX],
        analysis.panel, analysis.model, json.dumps(to_jsonable(analysis.params)),
        json.dumps(to_jsonable(analysis.result)), json.dumps(to_jsonable(analysis.figures)),
        json.dumps(to_jsonable(analysis.tables)), analysis.url, analysis.saved_by.strip()[:SAVED_BY_MAX],
        analysis.owner, analysis.token or None,
    )


def _from_mapping(row: Any, columns: tuple[str, ...] = COLUMNS) -> SavedAnalysis:
    get = (lambda k: row[k]) if not isinstance(row, tuple) else dict(zip(columns, row)).__getitem__
    values = {k: get(k) for k in columns}
    if "token" in values:
        values["token"] = values["token"] or ""
    for key in ("params", "result", "figures", "tables"):
        if key in values:
            values[key] = json.loads(values[key])
    return SavedAnalysis(**values)


class Store:
    """The interface every backend gives. Ids are short random strings; `save` returns the id only
    after its transaction committed."""

    location: str

    def save(self, analysis: SavedAnalysis) -> str:
        """Store a new analysis in one transaction and return its id (the earlier id for a token seen before)."""
        raise NotImplementedError

    def get(self, analysis_id: str) -> SavedAnalysis | None:
        raise NotImplementedError

    def list(self, panel: str | None = None) -> list[SavedAnalysis]:
        """All analyses, newest first (figures and results included)."""
        raise NotImplementedError

    def summaries(self, limit: int = 200) -> list[SavedAnalysis]:
        """The newest `limit` analyses without their figures, tables, params and results (the gallery)."""
        raise NotImplementedError

    def count(self) -> int:
        raise NotImplementedError

    def delete(self, analysis_id: str, owner: str | None = None) -> bool:
        """Delete one analysis; with `owner`, only if it is theirs. Whether one was deleted."""
        raise NotImplementedError

    def schema_version(self) -> int:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# SQLite


class SQLiteStore(Store):
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_store_path()
        self.location = str(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as conn:
                conn.execute("PRAGMA journal_mode=WAL")
                self._migrate(conn)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the saved-analyses store {self.path}: {exc}") from exc

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout=30000")
            conn.execute("PRAGMA synchronous=NORMAL")
            yield conn
        finally:
            conn.close()

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(f"store schema {version} is newer than this app ({SCHEMA_VERSION})")
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[target - 1].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version={target}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def schema_version(self) -> int:
        with self._connect() as conn:
            return conn.execute("PRAGMA user_version").fetchone()[0]

    def save(self, analysis: SavedAnalysis) -> str:
        """Store a new analysis in one transaction and return its id."""
        row = _row_values(analysis)
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(f"INSERT INTO analyses ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
                             "ON CONFLICT (token) DO NOTHING", row)
                saved = row[0] if not analysis.token else \
                    conn.execute("SELECT id FROM analyses WHERE token = ?", (analysis.token,)).fetchone()[0]
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return saved

    def get(self, analysis_id: str) -> SavedAnalysis | None:
        with self._connect() as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM analyses WHERE id = ?",
                               (str(analysis_id),)).fetchone()
        return None if row is None else _from_mapping(row)

    def list(self, panel: str | None = None) -> list[SavedAnalysis]:
        query, args = f"SELECT {', '.join(COLUMNS)} FROM analyses", ()
        if panel:
            query, args = query + " WHERE panel = ?", (panel,)
        with self._connect() as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute(query + " ORDER BY created DESC, id", args).fetchall()
        return [_from_mapping(r) for r in rows]

    def summaries(self, limit: int = 200) -> list[SavedAnalysis]:
        with self._connect() as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute(f"SELECT {', '.join(SUMMARY_COLUMNS)} FROM analyses ORDER BY created DESC, id "
                                "LIMIT ?", (int(limit),)).fetchall()
        return [_from_mapping(r, SUMMARY_COLUMNS) for r in rows]

    def count(self) -> int:
        with self._connect() as conn:
            return conn.execute("SELECT COUNT(*) FROM analyses").fetchone()[0]

    def delete(self, analysis_id: str, owner: str | None = None) -> bool:
        query, args = "DELETE FROM analyses WHERE id = ?", (str(analysis_id),)
        if owner is not None:
            query, args = query + " AND owner = ?", args + (owner,)
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            cur = conn.execute(query, args)
            conn.execute("COMMIT")
        return cur.rowcount > 0


AnalysisStore = SQLiteStore  # the name callers and tests used before there were two backends


# ---------------------------------------------------------------------------------------------
# PostgreSQL


class PostgresStore(Store):
    """The store in a PostgreSQL database, shared by every server that names the same URL.

    Connections are short-lived and kept in a small idle pool (one per thread at most), so a
    restarted database or a dropped connection costs one retry, not an error page."""

    POOL_MAX = 8

    def __init__(self, url: str, connect_timeout: float = 10) -> None:
        try:
            import psycopg  # noqa: F401  (pinned in requirements.txt)
        except ImportError as exc:  # pragma: no cover - psycopg is a requirement
            raise StoreError("a postgresql:// store needs psycopg (pip install -r requirements.txt)") from exc
        self.location = url
        self._timeout = connect_timeout
        self._idle: list = []
        self._lock = threading.Lock()
        with self._connect() as conn:
            self._migrate(conn)

    def _new_connection(self):
        import psycopg

        try:
            return psycopg.connect(self.location, connect_timeout=int(self._timeout), autocommit=False)
        except psycopg.Error as exc:
            raise StoreError(f"cannot reach the saved-analyses database: {' '.join(str(exc).split())}") from exc

    @contextlib.contextmanager
    def _connect(self):
        """A connection in a transaction: committed when the block ends, rolled back on error; a broken
        connection is dropped instead of going back to the pool."""
        import psycopg

        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed:
            conn = self._new_connection()
        ok = False
        try:
            yield conn
            conn.commit()
            ok = True
        finally:
            if not ok:
                with contextlib.suppress(psycopg.Error):
                    conn.rollback()
            healthy = not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            with self._lock:
                if ok and healthy and len(self._idle) < self.POOL_MAX:
                    self._idle.append(conn)
                    conn = None
            if conn is not None:
                conn.close()

    def _run(self, fn):
        """`fn(conn)` in a transaction; once more on a fresh connection if a pooled one was dead."""
        import psycopg

        for attempt in (0, 1):
            try:
                with self._connect() as conn:
                    return fn(conn)
            except psycopg.OperationalError as exc:
                if attempt:
                    raise StoreError(f"the saved-analyses database failed: {' '.join(str(exc).split())}") from exc
                with self._lock:
                    idle, self._idle = self._idle, []
                for c in idle:
                    c.close()

    @staticmethod
    def _migrate(conn) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (PG_LOCK_ID,))
        conn.execute("CREATE TABLE IF NOT EXISTS model_inspector_schema (version INTEGER NOT NULL)")
        row = conn.execute("SELECT version FROM model_inspector_schema").fetchone()
        version = row[0] if row else 0
        if row is None:
            conn.execute("INSERT INTO model_inspector_schema VALUES (0)")
        if version > SCHEMA_VERSION:
            raise StoreError(f"store schema {version} is newer than this app ({SCHEMA_VERSION})")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in PG_MIGRATIONS[target - 1].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("UPDATE model_inspector_schema SET version = %s", (target,))

    def schema_version(self) -> int:
        return self._run(lambda c: c.execute("SELECT version FROM model_inspector_schema").fetchone()[0])

    def save(self, analysis: SavedAnalysis) -> str:
        import psycopg

        row = _row_values(analysis)
        sql = (f"INSERT INTO analyses ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))}) "
               "ON CONFLICT (token) DO NOTHING")

        def insert(c):
            c.execute(sql, row)
            if not analysis.token:
                return row[0]
            return c.execute("SELECT id FROM analyses WHERE token = %s", (analysis.token,)).fetchone()[0]

        try:
            return self._run(insert)  # returns after COMMIT
        except psycopg.errors.UniqueViolation:
            # the first attempt committed but its connection died before saying so: the retry finds it
            if analysis.id or self.get(row[0]) is None:
                raise
        return row[0]

    def get(self, analysis_id: str) -> SavedAnalysis | None:
        row = self._run(lambda c: c.execute(f"SELECT {', '.join(COLUMNS)} FROM analyses WHERE id = %s",
                                            (str(analysis_id),)).fetchone())
        return None if row is None else _from_mapping(tuple(row))

    def list(self, panel: str | None = None) -> list[SavedAnalysis]:
        query, args = f"SELECT {', '.join(COLUMNS)} FROM analyses", ()
        if panel:
            query, args = query + " WHERE panel = %s", (panel,)
        rows = self._run(lambda c: c.execute(query + " ORDER BY created DESC, id", args).fetchall())
        return [_from_mapping(tuple(r)) for r in rows]

    def summaries(self, limit: int = 200) -> list[SavedAnalysis]:
        rows = self._run(lambda c: c.execute(
            f"SELECT {', '.join(SUMMARY_COLUMNS)} FROM analyses ORDER BY created DESC, id LIMIT %s",
            (int(limit),)).fetchall())
        return [_from_mapping(tuple(r), SUMMARY_COLUMNS) for r in rows]

    def count(self) -> int:
        return self._run(lambda c: c.execute("SELECT COUNT(*) FROM analyses").fetchone()[0])

    def delete(self, analysis_id: str, owner: str | None = None) -> bool:
        query, args = "DELETE FROM analyses WHERE id = %s", (str(analysis_id),)
        if owner is not None:
            query, args = query + " AND owner = %s", args + (owner,)
        return self._run(lambda c: c.execute(query, args).rowcount > 0)

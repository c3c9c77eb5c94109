"""Saved analyses: a small SQLite store (WAL, versioned schema, one transaction per save).

A saved analysis keeps everything needed to show it again without recomputing: the panel, the
model label, the params, the typed result (JSON), and the figures (plotly JSON) and tables the
panel rendered. Every connection is short-lived, so the store is safe to use from many threads
and processes; a process killed mid-save leaves the previous commits intact (SQLite's journal).
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from analysis.results import Result, to_jsonable

SCHEMA_VERSION = 2
DEFAULT_PATH = Path(".model_inspector") / "analyses.db"

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
]


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
    id: str = ""
    created: float = 0.0


def default_store_path() -> Path:
    return Path(os.environ.get("MODEL_INSPECTOR_STORE", str(DEFAULT_PATH)))


class AnalysisStore:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_store_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            self._migrate(conn)

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
                raise RuntimeError(f"store schema {version} is newer than this app ({SCHEMA_VERSION})")
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
        analysis_id = analysis.id or secrets.token_urlsafe(8)
        created = analysis.created or time.time()
        row = (
            analysis_id, created, analysis.title.strip() or "Untitled analysis", analysis.note,
            analysis.panel, analysis.model, json.dumps(to_jsonable(analysis.params)),
            json.dumps(to_jsonable(analysis.result)), json.dumps(to_jsonable(analysis.figures)),
            json.dumps(to_jsonable(analysis.tables)), analysis.url,
        )
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "INSERT INTO analyses (id, created, title, note, panel, model, params, result, "
                    "figures, tables, url) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row,
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return analysis_id

    def get(self, analysis_id: str) -> SavedAnalysis | None:
        with self._connect() as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute("SELECT * FROM analyses WHERE id = ?", (analysis_id,)).fetchone()
        return None if row is None else _from_row(row)

    def list(self, panel: str | None = None) -> list[SavedAnalysis]:
        """All analyses, newest first (figures and results included)."""
        query, args = "SELECT * FROM analyses", ()
        if panel:
            query, args = query + " WHERE panel = ?", (panel,)
        with self._connect() as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute(query + " ORDER BY created DESC", args).fetchall()
        return [_from_row(r) for r in rows]

    def delete(self, analysis_id: str) -> bool:
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            cur = conn.execute("DELETE FROM analyses WHERE id = ?", (analysis_id,))
            conn.execute("COMMIT")
        return cur.rowcount > 0


def _from_row(row: sqlite3.Row) -> SavedAnalysis:
    return SavedAnalysis(
        id=row["id"], created=row["created"], title=row["title"], note=row["note"], panel=row["panel"],
        model=row["model"], params=json.loads(row["params"]), result=json.loads(row["result"]),
        figures=json.loads(row["figures"]), tables=json.loads(row["tables"]), url=row["url"],
    )


"""The SQLite store's file: connection settings and the versioned schema."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from izh_trio.frontend.response_store.errors import StoreUnavailable

SCHEMA_VERSION = 1
#: How long a write waits for another process's write lock (another replica on the same file).
BUSY_TIMEOUT_MS = 5000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    status TEXT NOT NULL,
    previous_response_id TEXT,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_created ON responses (created_at);
CREATE INDEX IF NOT EXISTS responses_by_expiry ON responses (expires_at);
CREATE TABLE IF NOT EXISTS events (
    response_id TEXT NOT NULL REFERENCES responses (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (response_id, seq)
) WITHOUT ROWID;
"""


def connect(path: Path) -> sqlite3.Connection:
    """Open (creating if needed) the store's file at the current schema version. Blocking:
    call it off the event loop. The connection is used by one thread at a time (the store
    holds a lock around each call), hence ``check_same_thread=False``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
    except (OSError, sqlite3.Error) as exc:
        raise StoreUnavailable(f"response store: cannot open SQLite file {path}: {exc}") from exc
    try:
        # WAL: readers (another replica, a GET) do not wait for a writer.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        _migrate(conn, path)
    except sqlite3.Error as exc:
        conn.close()
        raise StoreUnavailable(f"response store: cannot use SQLite file {path}: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in filter(str.strip, _SCHEMA.split(";")):
            conn.execute(statement)
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        found = row[0]
        if found is None:
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        elif found > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"response store: {path} has schema version {found}, newer than this"
                f" server's {SCHEMA_VERSION}; use a newer izh_trio or another file"
            )
        # older versions: migrations go here, one step per version
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise

"""The embedded default store: one SQLite file (WAL), every call off the event loop.

One connection, used by one worker thread at a time: a trio lock is held across each
``trio.to_thread.run_sync`` call, and each call is one transaction. Other processes (another
replica on the same host) may share the file; SQLite's busy timeout bounds their waits.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import orjson
import trio

from izh_trio.frontend.response_store import errors
from izh_trio.frontend.response_store.base import StoreBase
from izh_trio.frontend.response_store.protocol import MAX_CHAIN, Clock
from izh_trio.frontend.response_store.records import (
    ResponseStatus,
    StoredResponse,
    sequence_number,
)
from izh_trio.frontend.response_store.sqlite_schema import connect

T = TypeVar("T")

_UPSERT = """
INSERT INTO responses (id, created_at, expires_at, status, previous_response_id, body)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET created_at = excluded.created_at,
    expires_at = excluded.expires_at, status = excluded.status,
    previous_response_id = excluded.previous_response_id, body = excluded.body
"""
# Newest first; a LEFT JOIN keeps the first id that is not stored, to name it.
_CHAIN = """
WITH RECURSIVE walk (id, depth) AS (
    SELECT ?, 0
    UNION ALL
    SELECT r.previous_response_id, walk.depth + 1 FROM walk JOIN responses r ON r.id = walk.id
    WHERE r.previous_response_id IS NOT NULL AND walk.depth < ?
)
SELECT walk.id, r.body, r.expires_at FROM walk LEFT JOIN responses r ON r.id = walk.id
ORDER BY walk.depth
"""


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")  # take the write lock now, not on the first write
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class SqliteStore(StoreBase):
    def __init__(
        self, conn: sqlite3.Connection, path: Path, *, ttl_s: float, max_rows: int,
        clock: Clock,
    ) -> None:
        super().__init__(ttl_s=ttl_s, max_rows=max_rows, clock=clock)
        self.path = path
        self._conn: sqlite3.Connection | None = conn
        self._lock = trio.Lock()

    @classmethod
    async def open(
        cls, path: str | Path, *, ttl_s: float, max_rows: int, clock: Clock = time.time,
    ) -> SqliteStore:
        path = Path(path).expanduser()
        conn = await trio.to_thread.run_sync(connect, path)
        return cls(conn, path, ttl_s=ttl_s, max_rows=max_rows, clock=clock)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        async with self._lock:
            if self._conn is None:
                raise errors.StoreUnavailable("response store: closed")
            try:
                return await trio.to_thread.run_sync(fn, self._conn, *args)
            except sqlite3.Error as exc:  # locked past the busy timeout, disk full, I/O error
                raise errors.StoreUnavailable(f"response store: SQLite {self.path}: {exc}") from exc

    async def aclose(self) -> None:
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                await trio.to_thread.run_sync(conn.close)

    # -- the blocking steps, in a worker thread --------------------------------------------

    def _put(self, conn: sqlite3.Connection, record: StoredResponse) -> None:
        with _transaction(conn):
            self._sweep(conn)  # an expired row under this id must not decide the transition
            row = conn.execute(
                "SELECT status FROM responses WHERE id = ?", (record.id,)
            ).fetchone()
            if row is not None and not ResponseStatus(row[0]).may_become(record.status):
                raise errors.InvalidTransition(record.id, row[0], record.status.value)
            conn.execute(_UPSERT, (
                record.id, record.created_at, record.expires_at, record.status.value,
                record.previous_response_id, orjson.dumps(record.to_json()),
            ))
            self._cap(conn)

    def _get(self, conn: sqlite3.Connection, response_id: str) -> StoredResponse | None:
        row = conn.execute(
            "SELECT body FROM responses WHERE id = ? AND expires_at > ?",
            (response_id, self._clock()),
        ).fetchone()
        return None if row is None else StoredResponse.from_json(orjson.loads(row[0]))

    def _delete(self, conn: sqlite3.Connection, response_id: str) -> bool:
        with _transaction(conn):
            rows = conn.execute(
                "DELETE FROM responses WHERE id = ? RETURNING expires_at", (response_id,)
            ).fetchall()
        return bool(rows) and rows[0][0] > self._clock()

    def _append_events(
        self, conn: sqlite3.Connection, response_id: str, events: list[dict[str, Any]]
    ) -> None:
        rows = [(response_id, sequence_number(e), orjson.dumps(e)) for e in events]
        with _transaction(conn):
            if not conn.execute(
                "SELECT 1 FROM responses WHERE id = ? AND expires_at > ?",
                (response_id, self._clock()),
            ).fetchone():
                raise errors.UnknownResponse(response_id)
            conn.executemany(
                "INSERT OR REPLACE INTO events (response_id, seq, body) VALUES (?, ?, ?)", rows
            )

    def _events(
        self, conn: sqlite3.Connection, response_id: str, starting_after: int
    ) -> list[dict[str, Any]]:
        rows = conn.execute(
            "SELECT e.body FROM events e JOIN responses r ON r.id = e.response_id"
            " WHERE e.response_id = ? AND e.seq > ? AND r.expires_at > ? ORDER BY e.seq",
            (response_id, starting_after, self._clock()),
        ).fetchall()
        return [orjson.loads(body) for (body,) in rows]

    def _chain(self, conn: sqlite3.Connection, response_id: str) -> list[StoredResponse]:
        now = self._clock()
        chain: list[StoredResponse] = []
        seen: set[str] = set()
        for rid, body, expires_at in conn.execute(_CHAIN, (response_id, MAX_CHAIN)):
            if body is None or expires_at <= now:
                raise errors.UnknownResponse(rid)
            if rid in seen:  # a loop of ids cannot come from the route; stop rather than spin
                break
            seen.add(rid)
            chain.append(StoredResponse.from_json(orjson.loads(body)))
        chain.reverse()
        return chain

    def _expire(self, conn: sqlite3.Connection) -> int:
        with _transaction(conn):
            return self._sweep(conn) + self._cap(conn)

    def _sweep(self, conn: sqlite3.Connection) -> int:
        """Delete expired responses (their events go with them: ON DELETE CASCADE)."""
        return conn.execute(
            "DELETE FROM responses WHERE expires_at <= ?", (self._clock(),)
        ).rowcount

    def _cap(self, conn: sqlite3.Connection) -> int:
        (count,) = conn.execute("SELECT count(*) FROM responses").fetchone()
        excess = count - self.max_rows
        if excess <= 0:
            return 0
        return conn.execute(
            "DELETE FROM responses WHERE id IN"
            " (SELECT id FROM responses ORDER BY created_at, id LIMIT ?)", (excess,)
        ).rowcount

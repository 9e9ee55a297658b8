"""``--response-store`` to a store: nothing is SQLite in the cache directory, ``sqlite:///path``
that file, ``redis://HOST:PORT/DB`` (or ``rediss://``) a Redis server."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import trio

from izh_trio.frontend.response_store.errors import StoreUnavailable
from izh_trio.frontend.response_store.protocol import (
    DEFAULT_MAX_ROWS,
    DEFAULT_TTL_S,
    Clock,
    ResponseStore,
)

SQLITE_FILE_NAME = "responses.sqlite3"
_SQLITE = "sqlite://"
_REDIS = ("redis://", "rediss://", "unix://")


def default_sqlite_path() -> Path:
    """The store's file in the cache directory the tiny checkpoint uses (``$IZH_CACHE_DIR``,
    else ``~/.cache/izh_trio``)."""
    from izh_trio.tiny.checkpoint import cache_root  # deferred: only the default needs it

    return cache_root() / SQLITE_FILE_NAME


def describe(url: str | None) -> str:
    """Where a store lives, for logs and errors, without a password."""
    if url is None:
        return f"sqlite://{default_sqlite_path()}"
    if url.startswith(_REDIS) and "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url


def check_url(url: str | None) -> None:
    """Raises ``ValueError`` for a URL no backend takes (settings call it at startup)."""
    if url is None or url.startswith(_REDIS):
        return
    if not url.startswith(_SQLITE) or not url[len(_SQLITE):]:
        raise ValueError(
            f"--response-store {url!r}: expected sqlite:///PATH or redis://HOST:PORT/DB"
        )


async def open_store(
    url: str | None, ttl_s: float = DEFAULT_TTL_S, max_rows: int = DEFAULT_MAX_ROWS, *,
    clock: Clock = time.time,
) -> ResponseStore:
    """Open the store ``url`` names. SQLite opens (and creates) its file now, raising
    ``StoreUnavailable`` if it cannot; Redis connects on first use, so a server whose Redis
    is down still starts and serves ``store: false`` requests."""
    check_url(url)
    if ttl_s <= 0 or max_rows < 1:
        raise ValueError("response store: the TTL must be positive and the row cap at least 1")
    if url is not None and url.startswith(_REDIS):
        from izh_trio.frontend.response_store.redis_store import RedisStore

        return RedisStore(url, ttl_s=ttl_s, max_rows=max_rows, clock=clock)
    from izh_trio.frontend.response_store.sqlite_store import SqliteStore

    path = default_sqlite_path() if url is None else Path(url[len(_SQLITE):])
    return await SqliteStore.open(path, ttl_s=ttl_s, max_rows=max_rows, clock=clock)


async def expire_periodically(
    store: ResponseStore, every_s: float, *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Enforce the TTL and the row cap every ``every_s`` seconds (writes enforce them too);
    for the server's nursery. An unreachable store is tried again next time."""
    task_status.started()
    while True:
        with contextlib.suppress(StoreUnavailable):
            await store.expire()
        await trio.sleep(every_s)

"""The shared store: Redis, so that replicas behind a load balancer continue each other's
responses. ``redis.asyncio`` needs asyncio, so the blocking client runs in trio's worker
threads, at most one per pooled connection, each call bounded by socket timeouts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import orjson
import redis
import trio
from redis.backoff import NoBackoff
from redis.retry import Retry

from izh_trio.frontend.response_store import errors, redis_scripts
from izh_trio.frontend.response_store.base import StoreBase
from izh_trio.frontend.response_store.protocol import (
    DEFAULT_MAX_ROWS,
    DEFAULT_TTL_S,
    MAX_CHAIN,
    Clock,
)
from izh_trio.frontend.response_store.records import StoredResponse, sequence_number

T = TypeVar("T")
DEFAULT_PREFIX = "izh:responses"
DEFAULT_TIMEOUT_S = 2.0
DEFAULT_CONNECTIONS = 16


class RedisStore(StoreBase):
    def __init__(
        self, url: str, *, ttl_s: float = DEFAULT_TTL_S, max_rows: int = DEFAULT_MAX_ROWS,
        clock: Clock = time.time, prefix: str = DEFAULT_PREFIX,
        timeout_s: float = DEFAULT_TIMEOUT_S, max_connections: int = DEFAULT_CONNECTIONS,
    ) -> None:
        super().__init__(ttl_s=ttl_s, max_rows=max_rows, clock=clock)
        self._prefix = prefix
        # One retry, at once: it covers a pooled connection that Redis closed while idle,
        # without stretching the wait on a server that is down.
        self._pool = redis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=timeout_s,
            socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1),
        )
        kwargs = self._pool.connection_kwargs
        self.where = f"redis://{kwargs.get('host')}:{kwargs.get('port')}/{kwargs.get('db', 0)}"
        self._client = redis.Redis(connection_pool=self._pool)
        self._limiter = trio.CapacityLimiter(max_connections)
        self._put_script = self._client.register_script(redis_scripts.PUT)
        self._append_script = self._client.register_script(redis_scripts.APPEND_EVENTS)
        self._chain_script = self._client.register_script(redis_scripts.CHAIN)
        self._closed = False

    def _key(self, kind: str, response_id: str = "") -> str:
        return f"{self._prefix}:{kind}:{response_id}" if response_id else f"{self._prefix}:{kind}"

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise errors.StoreUnavailable("response store: closed")
        try:
            return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)
        except redis.RedisError as exc:  # refused, timed out, loading, read-only replica...
            raise errors.StoreUnavailable(f"response store: Redis at {self.where}: {exc}") from exc

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await trio.to_thread.run_sync(self._pool.disconnect)

    # -- the blocking steps, in a worker thread --------------------------------------------

    def _get(self, response_id: str) -> StoredResponse | None:
        body, expires_at = self._client.hmget(self._key("r", response_id), ["body", "expires_at"])
        if body is None or expires_at is None or float(expires_at) <= self._clock():
            return None
        return StoredResponse.from_json(orjson.loads(body))

    def _append_events(self, response_id: str, events: list[dict[str, Any]]) -> None:
        args: list[Any] = [repr(self._clock())]
        for event in events:
            args += [sequence_number(event), orjson.dumps(event)]
        keys = [self._key("r", response_id), self._key("e", response_id)]
        if not self._append_script(keys, args):
            raise errors.UnknownResponse(response_id)

    def _chain(self, response_id: str) -> list[StoredResponse]:
        flat = self._chain_script([], [self._prefix, response_id, MAX_CHAIN])
        now = self._clock()
        chain: list[StoredResponse] = []
        for body, tail in zip(flat[::2], flat[1::2], strict=True):
            if not body:
                raise errors.UnknownResponse(tail.decode())
            record = StoredResponse.from_json(orjson.loads(body))
            if float(tail) <= now:
                raise errors.UnknownResponse(record.id)
            chain.append(record)
        chain.reverse()
        return chain

    def _put(self, record: StoredResponse) -> None:
        assert record.expires_at is not None
        self._drop_expired()  # an expired record under this id must not decide the transition
        ttl_ms = max(1, int((record.expires_at - self._clock()) * 1000))
        allowed = " ".join(s.value for s in record.status.predecessors())
        refused = self._put_script(
            [self._key("r", record.id), self._key("e", record.id),
             self._key("by_created"), self._key("by_expiry")],
            [record.id, record.status.value, allowed, orjson.dumps(record.to_json()),
             record.previous_response_id or "", repr(record.created_at),
             repr(record.expires_at), ttl_ms],
        )
        if refused is not None:
            raise errors.InvalidTransition(record.id, refused.decode(), record.status.value)
        self._cap()

    def _delete(self, response_id: str) -> bool:
        pipe = self._client.pipeline(transaction=True)
        pipe.hget(self._key("r", response_id), "expires_at")
        pipe.delete(self._key("r", response_id), self._key("e", response_id))
        pipe.zrem(self._key("by_created"), response_id)
        pipe.zrem(self._key("by_expiry"), response_id)
        expires_at = pipe.execute()[0]
        return expires_at is not None and float(expires_at) > self._clock()

    def _events(self, response_id: str, starting_after: int) -> list[dict[str, Any]]:
        pipe = self._client.pipeline(transaction=False)
        pipe.hget(self._key("r", response_id), "expires_at")
        pipe.zrangebyscore(self._key("e", response_id), f"({starting_after}", "+inf")
        expires_at, bodies = pipe.execute()
        if expires_at is None or float(expires_at) <= self._clock():
            return []
        return [orjson.loads(body) for body in bodies]

    def _expire(self) -> int:
        return self._drop_expired() + self._cap()

    def _drop_expired(self) -> int:
        """Redis's own key expiry removes expired records too; this also drops their index
        entries, and follows the injectable clock."""
        expired = self._client.zrangebyscore(self._key("by_expiry"), "-inf", self._clock())
        return self._remove(expired)

    def _cap(self) -> int:
        excess = self._client.zcard(self._key("by_created")) - self.max_rows
        if excess <= 0:
            return 0
        return self._remove(self._client.zrange(self._key("by_created"), 0, excess - 1))

    def _remove(self, members: Iterable[object]) -> int:
        # a sorted set's members, read without scores: ids, as bytes (replies are not decoded)
        ids = [member.decode() for member in members if isinstance(member, bytes)]
        if not ids:
            return 0
        pipe = self._client.pipeline(transaction=True)
        pipe.zrem(self._key("by_created"), *ids)
        pipe.zrem(self._key("by_expiry"), *ids)
        for response_id in ids:
            pipe.delete(self._key("r", response_id), self._key("e", response_id))
        removed: int = pipe.execute()[0]
        return removed

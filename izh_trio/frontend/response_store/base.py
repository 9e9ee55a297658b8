"""What both backends share: every protocol method is one blocking step (a backend's
``_put``, ``_get``...) run in a worker thread by the backend's ``_run``, which also turns its
driver's errors into ``StoreUnavailable``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from izh_trio.frontend.response_store.paging import DEFAULT_LIMIT, ItemPage, page_items
from izh_trio.frontend.response_store.protocol import Clock
from izh_trio.frontend.response_store.records import StoredResponse

T = TypeVar("T")


class StoreBase:
    # each backend's blocking steps, one call (and one transaction or script) each
    _put: Callable[..., None]
    _get: Callable[..., StoredResponse | None]
    _delete: Callable[..., bool]
    _append_events: Callable[..., None]
    _events: Callable[..., list[dict[str, Any]]]
    _chain: Callable[..., list[StoredResponse]]
    _expire: Callable[..., int]

    def __init__(self, *, ttl_s: float, max_rows: int, clock: Clock) -> None:
        self.ttl_s = ttl_s
        self.max_rows = max_rows
        self._clock = clock

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def put(self, record: StoredResponse) -> StoredResponse:
        stamped = attrs.evolve(record, expires_at=record.created_at + self.ttl_s)
        await self._run(self._put, stamped)
        return stamped

    async def get(self, response_id: str) -> StoredResponse | None:
        return await self._run(self._get, response_id)

    async def delete(self, response_id: str) -> bool:
        return await self._run(self._delete, response_id)

    async def append_events(
        self, response_id: str, events: Sequence[Mapping[str, Any]]
    ) -> None:
        await self._run(self._append_events, response_id, [dict(e) for e in events])

    async def events(self, response_id: str, starting_after: int = -1) -> list[dict[str, Any]]:
        return await self._run(self._events, response_id, starting_after)

    async def chain(self, response_id: str) -> list[StoredResponse]:
        return await self._run(self._chain, response_id)

    async def expire(self) -> int:
        return await self._run(self._expire)

    async def input_items(
        self, response_id: str, *, after: str | None = None, before: str | None = None,
        limit: int = DEFAULT_LIMIT, order: str = "desc",
    ) -> ItemPage | None:
        record = await self.get(response_id)
        if record is None:
            return None
        return page_items(record.input_items, after=after, before=before, limit=limit,
                          order=order)

    async def __aenter__(self) -> StoreBase:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

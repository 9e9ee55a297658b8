"""The interface every response store backend implements (all methods async, for trio).

A backend raises ``StoreUnavailable`` when it cannot be reached, within a bounded time;
records past their ``expires_at`` read as absent even before ``expire()`` removes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from izh_trio.frontend.response_store.paging import DEFAULT_LIMIT, ItemPage
from izh_trio.frontend.response_store.records import StoredResponse

#: Seconds since the epoch; injectable so tests move time without sleeping.
Clock = Callable[[], float]
DEFAULT_TTL_S = 30 * 24 * 3600.0
DEFAULT_MAX_ROWS = 100_000
#: The longest ``previous_response_id`` chain ``chain()`` follows (a guard against loops).
MAX_CHAIN = 10_000


class ResponseStore(Protocol):
    ttl_s: float
    max_rows: int

    async def put(self, record: StoredResponse) -> StoredResponse:
        """Insert or replace ``record``; returns it stamped with its ``expires_at``. Raises
        ``InvalidTransition`` if the stored status may not become the new one."""

    async def get(self, response_id: str) -> StoredResponse | None: ...

    async def delete(self, response_id: str) -> bool:
        """Remove a response and its events; False if there was none."""

    async def append_events(
        self, response_id: str, events: Sequence[Mapping[str, Any]]
    ) -> None:
        """Add a response's stream events (each with its ``sequence_number``); an event
        already stored under the same number is replaced. ``UnknownResponse`` if absent."""

    async def events(self, response_id: str, starting_after: int = -1) -> list[dict[str, Any]]:
        """The stored events numbered above ``starting_after``, in order ([] if none)."""

    async def input_items(
        self, response_id: str, *, after: str | None = None, before: str | None = None,
        limit: int = DEFAULT_LIMIT, order: str = "desc",
    ) -> ItemPage | None:
        """A page of the response's input items (None if the response is unknown);
        ``PageError`` for a bad limit, order or cursor."""

    async def chain(self, response_id: str) -> list[StoredResponse]:
        """The response and every one before it through ``previous_response_id``, oldest
        first; ``UnknownResponse`` naming the first id of the chain that is not stored."""

    async def expire(self) -> int:
        """Remove expired responses, then the oldest beyond ``max_rows``; returns how many."""

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> ResponseStore: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


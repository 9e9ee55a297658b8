"""Admission control: a cap on generations in flight, decided before any byte is sent.

A ticket is held for the whole generation. For a streamed response that means until the body
iterator ends or is closed. If the client leaves while the status line is being sent, quart
never even opens the body (so never closes it): the body's finalizer returns the ticket then,
as soon as the response object is dropped.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator
from types import TracebackType

from izh_trio.frontend.errors import APIError


class Ticket:
    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission

    def release(self) -> None:
        if self._admission is not None:
            self._admission.in_flight -= 1
            self._admission = None

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


class Admission:
    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending  # 0: no cap
        self.in_flight = 0

    def admit(self) -> Ticket:
        if self.max_pending and self.in_flight >= self.max_pending:
            raise APIError(503, f"the server is at capacity ({self.max_pending} requests in "
                                "flight); retry shortly", code="server_overloaded",
                           headers={"Retry-After": "1"})
        self.in_flight += 1
        return Ticket(self)


class TicketedBody:
    """Wraps a response body generator so its ticket is released however the body ends."""

    def __init__(self, body: AsyncIterator[bytes], ticket: Ticket) -> None:
        self._body = body
        self._ticket = ticket
        weakref.finalize(self, ticket.release)

    def __aiter__(self) -> TicketedBody:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._body.__anext__()
        except BaseException:
            self._ticket.release()
            raise

    async def aclose(self) -> None:
        self._ticket.release()
        await self._body.aclose()

"""Admission control: a cap on generations in flight, decided before any byte is sent.

A ticket is held for the whole generation: a non-streamed route holds it in a ``with`` block; a
streamed one hands it to the request's scope (``serving.pipeline``), which returns
it when the HTTP request's ASGI call ends, even when quart never ran the body. The drain waits
for the last ticket to go (:meth:`Admission.wait_empty`).
"""

from __future__ import annotations

from types import TracebackType

import attrs
import trio

from izh_trio.frontend.errors import APIError


class Ticket:
    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission

    def release(self) -> None:
        if self._admission is not None:
            self._admission._release()
            self._admission = None

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


@attrs.frozen
class AdmissionStatistics:
    #: Generations admitted and not yet finished.
    in_flight: int


class Admission:
    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending  # 0: no cap
        self.in_flight = 0
        self._empty = trio.Event()  # set while nothing is in flight
        self._empty.set()

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(self.in_flight)

    async def wait_empty(self) -> None:
        """Return once no ticket is out (at once if none is)."""
        await self._empty.wait()

    def _release(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self._empty.set()

    def admit(self) -> Ticket:
        if self.max_pending and self.in_flight >= self.max_pending:
            raise APIError(503, f"the server is at capacity ({self.max_pending} requests in "
                                "flight); retry shortly", code="server_overloaded",
                           headers={"Retry-After": "1"})
        if not self.in_flight:
            self._empty = trio.Event()
        self.in_flight += 1
        return Ticket(self)

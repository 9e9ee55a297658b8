"""One response as the store sees it: its input items, the turn it continues, its output as it
stands; stored when a foreground response ends (before its end is sent, so that a client can
continue it at once), or run in the background (``background``)."""

from __future__ import annotations

import logging
from typing import Any

import attrs

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.response_store import StoredResponse
from izh_trio.frontend.responses.output import RUNNING, ResponsesOutput
from izh_trio.frontend.responses.stored import counted, save, store_errors
from izh_trio.frontend.server import Server

log = logging.getLogger(__name__)


@attrs.define
class Turn:
    server: Server
    store: bool
    input_items: list[dict[str, Any]]
    previous_id: str | None
    output: ResponsesOutput | None = None  # made once the request is admitted

    @property
    def out(self) -> ResponsesOutput:
        assert self.output is not None
        return self.output

    def record(self) -> StoredResponse:
        """The response as it stands, to store."""
        out = self.out
        return StoredResponse(id=out.id, created_at=float(out.created), status=out.status.value,
                              response=out.response(), input_items=self.input_items,
                              previous_response_id=self.previous_id)

    async def finish(self, error: APIError | None) -> None:
        """A foreground response has ended: stored if asked, and counted. A store that fails
        now (it answered before the generation) costs the record, not the answer. One that
        failed before any of it was sent (an error status, no response) is counted only."""
        if error is not None and self.out.status in RUNNING:
            counted(self.server, "failed")
            return
        if not self.store:
            counted(self.server, self.out.status.value)
            return
        try:
            with store_errors():
                await save(self.server, self.record())
        except APIError as exc:
            counted(self.server, self.out.status.value)
            log.warning("response %s was not stored: %s", self.out.id, exc.message)

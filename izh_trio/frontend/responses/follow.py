"""``GET /v1/responses/{id}?stream=true&starting_after=N``: a background response's stored
events after N, then the new ones as they are stored, until its end.

The store is the one source (the replica that runs the response appends its events there):
a response running in this process wakes its followers when it stores events; one running
on another replica is polled every ``POLL_S``. A response whose end is stored has all its
events stored before (its runner appends them first), so the last read after it is seen
ends the stream; a cancelled one ends without a terminal event, as OpenAI's does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio

from izh_trio.frontend import sse
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.response_store import StoreUnavailable
from izh_trio.frontend.responses.stored import load, store_of
from izh_trio.frontend.server import Server

POLL_S = 0.1
#: A wake-up this process missed costs no more than this.
LOCAL_WAIT_S = 1.0
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


async def follow(server: Server, response_id: str, after: int) -> AsyncIterator[bytes]:
    store = store_of(server)
    while True:
        run = server.background.get(response_id)
        changed = run.changed if run is not None else None  # taken before reading
        try:
            record = await load(server, response_id)
            events = await store.events(response_id, after)
        except (APIError, StoreUnavailable):  # deleted, expired or unreachable: the end
            return
        if events:
            after = events[-1]["sequence_number"]
            yield b"".join(sse.typed(e["type"], e) for e in events)
        if record.status.final or any(e["type"] in TERMINAL for e in events):
            return
        if changed is not None:
            with trio.move_on_after(LOCAL_WAIT_S):
                await changed.wait()
        else:
            await trio.sleep(POLL_S)

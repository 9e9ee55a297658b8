"""Background responses: stored ``queued`` and answered at once, then generated in the server's
nursery (not the request's, so the client may leave), each in its own cancel scope.

Its events go to the store as they are made (appended after each wake-up of the generation,
which wakes whoever follows them here); its response object is rewritten at most every
``PROGRESS_S`` and at least every ``HEARTBEAT_S`` (``stored``: a silent one is orphaned).
Its end is always stored, shielded: completed or incomplete, failed (the engine failed, the
server drained it past its drain timeout), or cancelled (``POST .../cancel``: the scope is
cancelled, which leaves the generation and so aborts its engine request and frees its KV).
Another replica cancels it through the store: the next rewrite finds it cancelled and
cancels the scope.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio
from quart import Response

from izh_trio.frontend import sse
from izh_trio.frontend.admission import Ticket
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import GenerationPlan, open_generation
from izh_trio.frontend.response_store import (
    InvalidTransition,
    StoreUnavailable,
    UnknownResponse,
)
from izh_trio.frontend.responses.follow import follow
from izh_trio.frontend.responses.output import RUNNING, ResponsesOutput
from izh_trio.frontend.responses.runs import Run
from izh_trio.frontend.responses.stored import HEARTBEAT_S, save, store_errors, store_of
from izh_trio.frontend.responses.turn import Turn
from izh_trio.frontend.serving.api import Answer, Output
from izh_trio.frontend.serving.pipeline import unexpected

log = logging.getLogger(__name__)

PROGRESS_S = 1.0


async def detach(turn: Turn, plan: GenerationPlan, ticket: Ticket, output: Output, *,
                 stream: bool) -> Answer:
    """Store the response queued (a 503 if the store fails), start it, answer with it; or,
    ``stream``, with its events, followed from the store as a later GET follows them (a
    client that leaves stops following, not the response)."""
    server = turn.server
    assert isinstance(output, ResponsesOutput) and server.nursery is not None
    output.queued([])
    store = store_of(server)
    with store_errors():
        await save(server, turn.record())
        await store.append_events(output.id, _taken(output))
    run = server.background.start(output.id)
    server.nursery.start_soon(_run, _Runner(turn, output, run), plan, ticket)
    if stream:
        return Response(follow(server, output.id, -1), mimetype="text/event-stream",
                        headers=sse.HEADERS)
    return output.response()


def _taken(output: ResponsesOutput) -> list[dict[str, Any]]:
    assert output.log is not None
    events, output.log[:] = list(output.log), []
    return events


class _Runner:
    def __init__(self, turn: Turn, output: ResponsesOutput, run: Run) -> None:
        self.turn, self.output, self.run = turn, output, run
        self._written = time.monotonic()
        self.deleted = False

    async def flush(self, *, force: bool = False, final: bool = False) -> None:
        """Store the new events (waking followers), and the response when due (``force``:
        now). A store that fails is tried again next time, but for the ``final`` write. A
        response deleted meanwhile is stopped, and never written again."""
        server, output = self.turn.server, self.output
        due = force or final or time.monotonic() - self._written >= PROGRESS_S
        events = _taken(output)
        if self.deleted or not (events or due):
            return
        try:  # even with no events: it says whether the response is still stored
            await store_of(server).append_events(output.id, events)
        except UnknownResponse:
            log.info("response %s was deleted: stopping it", output.id)
            self.deleted = True
            self.run.scope.cancel()
            return
        except StoreUnavailable as exc:
            if final:
                raise
            assert output.log is not None
            output.log[:0] = events  # kept for the next try
            log.warning("response %s: its events wait for the store: %s", output.id, exc)
            return
        if events:
            self.run.stored()
        if due:
            self._written = time.monotonic()
            try:
                await save(server, self.turn.record())
            except InvalidTransition as exc:  # cancelled (or failed as orphaned) elsewhere
                if not final:  # (at the end: that stored end stands)
                    log.info("response %s is %s in the store: stopping it", output.id,
                             exc.current)
                    self.run.scope.cancel()
            except StoreUnavailable as exc:
                if final:
                    raise
                log.warning("response %s: its progress waits for the store: %s", output.id, exc)


async def _run(runner: _Runner, plan: GenerationPlan, ticket: Ticket) -> None:
    output, run, server = runner.output, runner.run, runner.turn.server
    sink: list[bytes] = []  # the events as bytes, unused: the store keeps them as objects
    try:
        with ticket, run.scope:
            try:
                await _generate(runner, plan, sink)
            except APIError as exc:  # the engine failed, or the drain aborted it
                output.failing(exc, sink)
        if run.scope.cancelled_caught and output.status in RUNNING:
            output.cancel()
    except Exception as exc:  # a bug: logged, and the response fails unless it has ended
        error = unexpected(exc)
        if output.status in RUNNING:
            output.failing(error, sink)
    finally:
        if output.status in RUNNING:  # the server's nursery is closing under it
            output.failing(APIError(503, "the server stopped before this response ended"), sink)
        with trio.CancelScope(shield=True):
            try:
                await runner.flush(final=True)
            except Exception as exc:  # never out of the server's nursery: it would stop it
                log.warning("response %s: its end (%s) was not stored: %s", output.id,
                            output.status.value, exc, exc_info=not isinstance(
                                exc, StoreUnavailable))
            server.background.end(output.id)


async def _generate(runner: _Runner, plan: GenerationPlan, sink: list[bytes]) -> None:
    output = runner.output
    async with open_generation(runner.turn.server.generation_context(), plan) as generation:
        output.opening(sink)
        await runner.flush(force=True)  # in_progress: stored at once
        while True:
            with trio.move_on_after(HEARTBEAT_S):  # else a quiet wait still rewrites it
                deltas = await generation.next()
                if not deltas:
                    break
                for delta in deltas:
                    output.stream(delta, sink)
            sink.clear()
            await runner.flush()
        output.closing(sink)

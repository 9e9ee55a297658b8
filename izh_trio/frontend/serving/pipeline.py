"""The one serving pipeline: admit a translated request, open its generation, feed the
deltas to the API's :class:`Output`, and answer: a JSON body, or server-sent events.

A streamed answer's generation is opened here, in the route, so that its engine requests
reach the core before quart starts the response, and it is entered into the request's exit
stack (``request_scope``), so that it is closed (aborting whatever still runs) however the
request ends, even when quart never runs the body. A stream that fails once its status line
is out says so in-band (the API's :meth:`Output.failing`), and still ends as documented.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio
from quart import Blueprint, Request, Response, request

from izh_trio.frontend import access_log, request_scope, sse, tracing
from izh_trio.frontend.admission import Ticket
from izh_trio.frontend.auth import bearer_token
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.fingerprint import system_fingerprint
from izh_trio.frontend.generation import (
    ChoiceDelta,
    ChoiceSpec,
    Generation,
    GenerationPlan,
    open_generation,
)
from izh_trio.frontend.server import Server
from izh_trio.frontend.serving.api import Head, Job, Keepalive, Output
from izh_trio.frontend.serving.intake import Intake, deadline_of, read_request, request_id

if TYPE_CHECKING:
    from izh_trio.frontend.request_trace import RequestTrace

R = TypeVar("R", bound=attrs.AttrsInstance)  # a request schema

log = logging.getLogger(__name__)

#: Choices (prompts x n) one request may ask for.
MAX_CHOICES = 64


async def serve(schema: type[R], translate: Callable[[Intake[R]], Awaitable[Job]],
                trace: RequestTrace | None = None) -> Response | dict[str, Any]:
    """The current request's answer: its body read by ``schema``, translated into a
    :class:`Job` by the API's ``translate``, run. Or an :class:`APIError` (400, 404, 429,
    503...) raised before any byte is sent. ``trace``: the request's span (tracing on)."""
    intake = await read_request(schema)
    job = await translate(intake)
    if trace is not None:
        trace.planned(job)
    server = intake.server
    plan = GenerationPlan(job.specs, intake.arrival, job.priority, job.cache_salt,
                          deadline_of(request, server), job.lora)
    fingerprint = await system_fingerprint(server)  # (before the ticket: no await holds it)
    ticket = admit(server, request, job.specs)
    head = Head(request_id(request, job.id_prefix), int(time.time()), job.model, fingerprint)
    if trace is not None:
        trace.admitted(head)
    output = job.output(head)
    if job.detach is not None:  # run elsewhere (a background response): it owns the ticket
        try:
            return await job.detach(plan, ticket, output)
        except BaseException:
            ticket.release()  # not detached after all (release is idempotent)
            raise
    if job.stream:
        generation = await _open_streamed(server, plan, ticket)
        if trace is not None:
            trace.opened(generation)
        return Response(_events(generation, output, job.finish, job.keepalive),
                        mimetype="text/event-stream", headers=sse.HEADERS)
    try:
        with ticket:
            async with open_generation(server.generation_context(), plan) as generation:
                if trace is not None:
                    trace.opened(generation)
                while deltas := await generation.next():
                    for delta in deltas:
                        output.add(delta)
    except APIError as exc:
        if job.finish is not None:
            await job.finish(exc)
        raise
    if job.finish is not None:
        await job.finish(None)
    return output.body()


def generation_route(name: str, path: str, schema: type[R],
                     translate: Callable[[Intake[R]], Awaitable[Job]]) -> Blueprint:
    """A blueprint serving ``POST path`` with this pipeline: an API's request schema and
    translator are all a route is."""
    bp = Blueprint(name, __name__)

    async def route() -> Response | dict[str, Any]:
        if tracing.tracer is None:  # tracing off: OpenTelemetry is never imported
            return await serve(schema, translate)
        from izh_trio.frontend.request_trace import RequestTrace

        trace = RequestTrace(tracing.tracer, name, request)
        request_scope.at_exit(trace.end)  # however the request ends, a stream's too
        return await serve(schema, translate, trace)

    bp.add_url_rule(path, name, route, methods=["POST"])
    return bp


def admit(server: Server, request: Request, specs: Sequence[ChoiceSpec]) -> Ticket:
    """Check size, take an in-flight slot, then charge the key's budget (or 400/503/429).

    The slot comes first so that a request turned away for capacity costs no budget.
    """
    if len(specs) > MAX_CHOICES:
        raise APIError(400, f"at most {MAX_CHOICES} choices (prompts x n) per request",
                       param="n")
    cost = sum(len(s.prompt_ids) + s.params.max_tokens for s in specs)
    token = bearer_token(request.scope["headers"]) if server.api_keys else b""
    key = token.decode("latin-1") if token else (request.remote_addr or "anonymous")
    ticket = server.admission.admit()
    try:
        server.limiter.charge(key, cost)
    except APIError:
        ticket.release()
        raise
    return ticket


async def _open_streamed(server: Server, plan: GenerationPlan, ticket: Ticket) -> Generation:
    """A streamed response's generation, opened now, in the route, and closed (aborting
    whatever still runs) when the request ends: its requests reach the engine core before
    quart starts the response (``request_scope``). The ticket is returned when the request
    ends too, right after the generation closes, however it ends: the body finished or
    failed, the client left, or the body never ran (a client gone before the status line
    went out). A generation that cannot be opened is an ordinary error response."""
    try:
        request_scope.at_exit(ticket.release)
    except RuntimeError:  # no request scope: an unwrapped app, a bug
        ticket.release()
        raise
    return await request_scope.enter(open_generation(server.generation_context(), plan))


async def _next(generation: Generation, keepalive: Keepalive | None) -> list[ChoiceDelta] | None:
    """The generation's next deltas, or None when ``keepalive``'s interval passed first
    (``Generation.next`` loses nothing when cancelled: it only waits to be woken)."""
    if keepalive is None:
        return await generation.next()
    with trio.move_on_after(keepalive.interval):
        return await generation.next()
    return None


async def _events(generation: Generation, output: Output,
                  finish: Callable[[APIError | None], Awaitable[None]] | None = None,
                  keepalive: Keepalive | None = None) -> AsyncIterator[bytes]:
    """The stream's body: the events of each wake-up of the generation in one write; the
    last ones with the closing events, in one write too, after ``finish`` (the job's last
    step: a stored response is stored before the client reads its end)."""
    pending: list[bytes] = []
    error: APIError | None = None
    try:
        output.opening(pending)
        if pending:
            yield b"".join(pending)
            pending.clear()
        while (deltas := await _next(generation, keepalive)) != []:
            if deltas is None:
                assert keepalive is not None
                yield keepalive.event
                continue
            for delta in deltas:
                output.stream(delta, pending)
            if pending and not generation.finished:  # the last ones go out with the end
                yield b"".join(pending)
                pending.clear()
        output.closing(pending)
    except APIError as exc:  # the status line is gone: report in-band, then end the stream
        error = exc
        output.failing(exc, pending)
    except Exception as exc:  # a bug, reported in-band too: the stream still ends as documented
        error = unexpected(exc)
        output.failing(error, pending)
    if finish is not None:
        await finish(error)
    yield b"".join(pending)


def unexpected(exc: Exception) -> APIError:
    """The error for a bug met after the status line went out: logged with its traceback
    and said as the app says one before it (a 500), so that the stream still ends as
    documented rather than cut off mid-body."""
    log.error("unhandled error in a stream", exc_info=exc)
    return access_log.noted(APIError(500, f"internal server error ({type(exc).__name__})"))

"""One generation request's span, in OpenTelemetry's GenAI semantic conventions.

Imported only while tracing is on (``serving.pipeline`` checks ``tracing.tracer`` first).
The span is a SERVER span, child of the request's W3C ``traceparent`` when it has one. It
starts when the route is entered and ends when the request's ASGI call does
(``request_scope``), so a stream's span covers its whole body and a client that left is
seen. Its events carry times the frontend already took: ``queued`` (the engine requests
sent to the core), ``scheduled`` (the core's first step of it, from the queue and prefill
seconds the core reports), ``first_token`` (the first output back) and ``end``, whose
``izh.end_cause`` says why it ended: the engine finished it, or what stopped it (a stop
string, the deadline, a drain, a slow client, a disconnect, an error, a refusal).

A request refused before any generation (4xx) still gets its span, with
``http.response.status_code`` and ``error.type``; its status is left unset, as OpenTelemetry's
HTTP server spans leave a 4xx, and only a 5xx (or an error inside a stream) is an ERROR. No
prompt or output text, and no 4xx message (it may quote the request), is recorded.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from quart import Request

from izh_trio.frontend import access_log, tracing
from izh_trio.frontend.generation import Generation
from izh_trio.frontend.serving.api import Head, Job

log = logging.getLogger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()
#: gen_ai.operation.name of each generation route (the pipeline's route names).
OPERATIONS = {"chat": "chat", "completions": "text_completion", "responses": "chat",
              "messages": "chat"}
SYSTEM = "izh_trio"


class RequestTrace:
    """What the pipeline learns of the current request, made into its span when it ends.

    The span is built in one go, its start time and events given, on tracing's own thread
    (``tracing.make_later``): a request pays a few stores into this object, and the SDK's
    locks and checks are paid once, off the event loop."""

    def __init__(self, tracer: Tracer, route: str, request: Request) -> None:
        self._tracer = tracer
        self._start = time.monotonic()
        self._carrier = {name: value for name in _PROPAGATOR.fields
                         if (value := request.headers.get(name)) is not None}
        self._operation = self._name = OPERATIONS.get(route, route)
        self._attributes: dict[str, Any] = {
            "gen_ai.operation.name": self._operation, "gen_ai.system": SYSTEM,
            "http.request.method": request.method, "url.path": request.path}
        self._generation: Generation | None = None
        self._queued: float | None = None
        self._detached = False

    def planned(self, job: Job) -> None:
        """The request, translated: its model and sampling parameters."""
        self._detached = job.detach is not None
        self._name = f"{self._operation} {job.model}"
        self._attributes.update(request_attributes(job))

    def admitted(self, head: Head) -> None:
        self._attributes["gen_ai.response.id"] = head.id

    def opened(self, generation: Generation) -> None:
        """Its engine requests were just sent to the core."""
        self._generation, self._queued = generation, time.monotonic()

    def end(self) -> None:
        """The request's ASGI call is ending: its span, made and ended."""
        try:
            self._end(time.monotonic())
        except Exception:  # a trace must never fail the request it describes
            log.warning("tracing: a request's span could not be made", exc_info=True)

    def _end(self, now: float) -> None:
        attributes, generation = self._attributes, self._generation
        # The frontend's times are time.monotonic(); a span's are nanoseconds since the epoch.
        epoch = time.time_ns() - time.monotonic_ns()

        def ns(monotonic: float) -> int:
            return epoch + int(monotonic * 1e9)

        record = access_log.current()
        # the status line's, and the error's (one inside a stream that began 200)
        sent = None if record is None else record.status
        status = None if record is None else record.error_status or sent
        events: list[tuple[str, float, dict[str, Any]]] = []
        cause: str | None = None
        if generation is not None:
            if self._queued is not None:
                events.append(("queued", self._queued, {}))
            if (first := generation.first_token) is not None:
                events += self._first_token(*first)
            totals = generation.totals()
            attributes["gen_ai.usage.input_tokens"] = totals.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = totals.completion_tokens
            attributes["gen_ai.usage.cache_read.input_tokens"] = totals.cached_tokens
            attributes["gen_ai.response.finish_reasons"] = totals.finish_reasons
            end_cause = generation.end_cause
            cause = None if end_cause is None else end_cause.value
        if cause is None:  # no generation, or one left before it ended
            cause = ("detached" if self._detached and generation is None
                     else "disconnect" if record is not None and record.disconnected
                     else "refused" if status is not None and status < 500 else "error")
        events.append(("end", now, {"izh.end_cause": cause}))
        if sent is not None:
            attributes["http.response.status_code"] = sent
        if status is not None and status >= 400:
            attributes["error.type"] = str(status)
        error = record.error if status is not None and status >= 500 and record else None
        start = ns(self._start)
        timed = [(name, ns(when), event_attributes) for name, when, event_attributes in events]

        def make() -> None:  # on tracing's thread: the data is all gathered
            span = self._tracer.start_span(
                self._name, context=_PROPAGATOR.extract(self._carrier),
                kind=SpanKind.SERVER, attributes=attributes, start_time=start)
            for name, when, event_attributes in timed:
                span.add_event(name, event_attributes, timestamp=when)
            if error is not None or (status is not None and status >= 500):
                span.set_status(Status(StatusCode.ERROR, error))
            span.end(end_time=timed[-1][1])

        tracing.make_later(make)

    def _first_token(self, when: float, timing: tuple[float, float] | None
                     ) -> list[tuple[str, float, dict[str, Any]]]:
        """The first output's event and, before it, the core's first step of the request
        (its prefill's start: the core reports its queue and prefill seconds, on its own
        clock, so the step is placed by the prefill's length back from the first token).
        Nothing the timestamps say is repeated in attributes: each one costs its export."""
        first: tuple[str, float, dict[str, Any]] = ("first_token", when, {})
        if timing is None:
            return [first]
        queue, prefill = timing
        return [("scheduled", when - prefill, {"izh.engine_queue_s": queue}), first]


def request_attributes(job: Job) -> dict[str, Any]:
    """gen_ai.request.* of a job (its first choice's parameters: a request's choices share
    them), and the frontend's own (stream, LoRA adapter, priority)."""
    attributes: dict[str, Any] = {"gen_ai.request.model": job.model, "izh.stream": job.stream}
    if not job.specs:  # nothing to generate: refused later, by the pipeline
        return attributes
    params = job.specs[0].params
    attributes["gen_ai.request.max_tokens"] = max(spec.params.max_tokens for spec in job.specs)
    attributes["gen_ai.request.temperature"] = params.temperature
    # the others where they change anything (a value at its default says nothing)
    if params.top_p < 1:
        attributes["gen_ai.request.top_p"] = params.top_p
    if params.frequency_penalty:
        attributes["gen_ai.request.frequency_penalty"] = params.frequency_penalty
    if params.presence_penalty:
        attributes["gen_ai.request.presence_penalty"] = params.presence_penalty
    if params.top_k > 0:
        attributes["gen_ai.request.top_k"] = params.top_k
    if params.seed is not None:
        attributes["gen_ai.request.seed"] = params.seed
    if job.specs[0].stop:
        attributes["gen_ai.request.stop_sequences"] = list(job.specs[0].stop)
    if len(job.specs) != 1:
        attributes["gen_ai.request.choice.count"] = len(job.specs)
    if job.lora is not None:
        attributes["izh.lora_adapter"] = job.lora
    if job.priority:
        attributes["izh.priority"] = job.priority
    return attributes

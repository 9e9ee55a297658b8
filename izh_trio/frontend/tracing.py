"""OpenTelemetry tracing (``--otlp-traces-endpoint``): the tracer provider's life.

Off by default, and then free: nothing here imports OpenTelemetry until :func:`start` is
given an endpoint, and the request path checks one module-level name (``tracer is None``)
before it does anything for a trace. On, a request's span is made on a thread of this
module's (:func:`make_later`) from what ``request_trace`` gathered, and goes through a
``BatchSpanProcessor`` (a thread of the SDK's) to the OTLP/HTTP protobuf exporter:
:func:`shutdown` makes the spans still asked for and flushes them, within a deadline, when
the server stops.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import trio

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

#: The tracer while tracing is on; None keeps every request from touching OpenTelemetry.
tracer: Tracer | None = None
_provider: TracerProvider | None = None
#: Spans to make, each a closure the request left (None: stop), and the thread making them.
_to_make: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
_maker: threading.Thread | None = None

#: The path of OTLP/HTTP's trace export, added to an endpoint given without a path.
TRACES_PATH = "/v1/traces"
#: Seconds one export may take: a collector that hangs costs spans, never the server.
EXPORT_TIMEOUT_S = 5.0
#: Seconds the spans still queued at shutdown get to reach the collector.
SHUTDOWN_DEADLINE_S = 5.0
SERVICE_NAME = "izh-trio"
MISSING_EXTRA = ("--otlp-traces-endpoint needs OpenTelemetry's SDK and OTLP exporter: "
                 "pip install 'izh-trio[otel]'")


def check_endpoint(url: str | None) -> None:
    """A settings validator: an http(s) URL with a host, or None (tracing off)."""
    if url is None:
        return
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the OTLP traces endpoint must be an http:// or https:// URL with "
                         f"a host, not {url!r}")


def traces_url(endpoint: str) -> str:
    """Where spans are POSTed: the endpoint as given, or with ``/v1/traces`` added when it
    names no path (``http://collector:4318``, as OTLP's base endpoint is spelled)."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return parts._replace(path=TRACES_PATH).geturl()
    return endpoint


def start(endpoint: str | None, model: str) -> None:
    """Turn tracing on when ``endpoint`` is set (else leave it off, importing nothing).
    Raises ``RuntimeError`` (:data:`MISSING_EXTRA`) when the SDK is not installed."""
    global tracer, _provider
    if endpoint is None:
        return
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise RuntimeError(MISSING_EXTRA) from exc
    url = traces_url(endpoint)
    resource = Resource.create({"service.name": SERVICE_NAME, "izh.model": model})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=url, timeout=EXPORT_TIMEOUT_S)))
    # Not the global provider: this server's spans go where its setting says, whatever
    # else in the process (a library's instrumentation) does with OpenTelemetry.
    _provider, tracer = provider, provider.get_tracer("izh_trio")
    global _maker
    _maker = threading.Thread(target=_make_spans, name="izh-spans", daemon=True)
    _maker.start()
    log.info("tracing: a span per generation request to %s", url)


def make_later(make: Callable[[], None]) -> None:
    """Have ``make`` (a request's span, its data gathered) run on tracing's own thread: the
    SDK's work (~80 us a span) is done while the event loop waits, not in a request's
    stead, as a wave of requests ends together."""
    _to_make.put(make)


def _make_spans() -> None:
    while (make := _to_make.get()) is not None:
        try:
            make()
        except Exception:  # a span lost, never the thread
            log.warning("tracing: a request's span could not be made", exc_info=True)


async def shutdown(deadline: float = SHUTDOWN_DEADLINE_S) -> None:
    """Send the spans still queued (for ``deadline`` seconds at most) and stop the
    exporter's thread; tracing is off afterwards."""
    global tracer, _provider, _maker
    provider, tracer, _provider = _provider, None, None
    maker, _maker = _maker, None
    if provider is None:
        return

    def flush_and_stop() -> None:
        _to_make.put(None)  # after the spans already asked for
        if maker is not None:
            maker.join(deadline)
        if not provider.force_flush(timeout_millis=int(deadline * 1000)):
            log.warning("tracing: spans still queued after %.1f s were dropped", deadline)
        provider.shutdown()

    # abandon_on_cancel: a collector that never answers holds a worker thread, not the exit
    with trio.move_on_after(deadline + EXPORT_TIMEOUT_S):
        await trio.to_thread.run_sync(flush_and_stop, abandon_on_cancel=True)

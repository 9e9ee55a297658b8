"""An OTLP/HTTP trace receiver for tests: a tiny HTTP server on 127.0.0.1 that accepts
``POST /v1/traces`` (protobuf, as the SDK's exporter sends it), decodes each export with
opentelemetry-proto's own classes and keeps the spans, which a test waits for."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def value_of(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in value.array_value.values]
    return None if kind is None else getattr(value, kind)


def attributes(pairs: Iterator[KeyValue] | Any) -> dict[str, Any]:
    return {pair.key: value_of(pair.value) for pair in pairs}


class Receiver:
    """The spans received so far (with their resource's attributes), and a way to wait."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Span]] = []
        self.posts = 0
        self._changed = threading.Condition()

    def take(self, body: bytes) -> None:
        export = ExportTraceServiceRequest.FromString(body)
        with self._changed:
            self.posts += 1
            for resource_spans in export.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend((resource, span) for span in scope_spans.spans)
            self._changed.notify_all()

    def wait(self, match: Callable[[Span], bool], *, count: int = 1, within: float = 60.0
             ) -> list[Span]:
        """The spans ``match`` picks, once there are ``count`` of them (``within`` bounds a
        hang only: the exporter sends as soon as its batch delay allows)."""
        deadline = time.monotonic() + within
        with self._changed:
            while True:
                found = [span for _, span in self.spans if match(span)]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(found)} of {count} spans arrived within "
                                         f"{within} s ({len(self.spans)} spans in all)")
                self._changed.wait(left)


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Receiver]]:
    """Serve a :class:`Receiver` on a free port of 127.0.0.1: (its base URL, the receiver)."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            receiver.take(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: pytest's output is the test's

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()

"""Tracing's setting and start-up: the endpoint's checks, the path added to a bare address,
a clear start-up error when the SDK is missing, and a provider that shuts down."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from izh_trio.frontend import tracing
from izh_trio.frontend.server import Server, StartupError
from izh_trio.frontend.settings import Settings


@pytest.mark.parametrize("url", ["http://127.0.0.1:4318", "https://collector.example/v1/x"])
def test_an_http_url_is_an_endpoint(url: str) -> None:
    assert Settings(otlp_traces_endpoint=url).otlp_traces_endpoint == url


@pytest.mark.parametrize("url", ["127.0.0.1:4318", "grpc://h:4317", "http://", "http:///x"])
def test_anything_else_is_refused_at_once(url: str) -> None:
    with pytest.raises(ValueError, match="OTLP traces endpoint"):
        Settings(otlp_traces_endpoint=url)


@pytest.mark.parametrize(("given", "url"), [
    ("http://h:4318", "http://h:4318/v1/traces"),
    ("http://h:4318/", "http://h:4318/v1/traces"),
    ("http://h:4318/custom/path", "http://h:4318/custom/path"),
])
def test_a_bare_address_gets_otlps_traces_path(given: str, url: str) -> None:
    assert tracing.traces_url(given) == url


def test_off_by_default() -> None:
    tracing.start(Settings().otlp_traces_endpoint, "m")
    assert tracing.tracer is None


@pytest.fixture
def no_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenTelemetry's SDK and exporter as if not installed (an import of them fails)."""
    for name in ("opentelemetry.sdk.trace", "opentelemetry.sdk.resources",
                 "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
        monkeypatch.setitem(sys.modules, name, None)


async def test_a_missing_sdk_is_a_one_line_startup_error(no_sdk: None, tiny_dir: Path
                                                        ) -> None:
    with pytest.raises(RuntimeError, match=r"pip install 'izh-trio\[otel\]'"):
        tracing.start("http://127.0.0.1:4318", "m")
    assert tracing.tracer is None
    server = Server(Settings(model_dir=tiny_dir, otlp_traces_endpoint="http://h:1"))
    async with trio.open_nursery() as nursery:
        with pytest.raises(StartupError) as failed:
            await server.start(nursery)
    assert str(failed.value) == tracing.MISSING_EXTRA


async def test_started_then_shut_down() -> None:
    tracing.start("http://127.0.0.1:1", "m")
    try:
        assert tracing.tracer is not None
        tracing.tracer.start_span("s").end()  # queued: its export fails, within a deadline
    finally:
        with trio.fail_after(30):
            await tracing.shutdown(deadline=0.5)
    assert tracing.tracer is None

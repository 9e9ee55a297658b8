"""OpenTelemetry tracing against a real server: ``--otlp-traces-endpoint`` pointed at an
in-process OTLP/HTTP receiver (``otlp_receiver``), requests from the official SDKs, and one
span per request with the GenAI attributes, the incoming ``traceparent`` as its parent, and
its events. With tracing off, serving requests does not import OpenTelemetry at all.

The traced server is paced (``PACED``), so a long request is still running when its client
leaves or its deadline passes however fast the machine is; every wait is for a span to
arrive (bounded), never a fixed time.
"""

from __future__ import annotations

import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.e2e.conftest import PACED, free_port, running_server, serve_args
from tests.e2e.otlp_receiver import Receiver, attributes, otlp_receiver

pytestmark = pytest.mark.timing

MODEL = "qwen3-test"
#: The SDK's batch delay, down from 5 s: spans reach the receiver soon after each request.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}
#: Too long to ever fire: only the shutdown's flush can send the spans.
NO_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "600000"}
#: The events of a request that generated: sent to the core, its first step there (from
#: the queue and prefill seconds the core reports), its first token, its end.
GENERATED = ["queued", "scheduled", "first_token", "end"]


def _importtime(args: list[str]) -> list[str]:
    """``serve_args`` with ``-X importtime``: the server logs every module it imports, when
    it imports it, so its log says what serving requests imported."""
    return [args[0], "-X", "importtime", *args[1:]]


@pytest.fixture(scope="module")
def traced(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, Receiver, Path]]:
    """A paced server tracing to an in-process receiver: (its base URL, the receiver, its
    log)."""
    log = tmp_path_factory.mktemp("logs") / "traced.log"
    with otlp_receiver() as (collector, receiver):
        port = free_port()
        args = _importtime(serve_args(hf_dir, port, "--served-model-name", MODEL,
                                      "--otlp-traces-endpoint", collector))
        with running_server(args, log, port=port, env={**PACED, **FAST_EXPORT}) as (base, _):
            yield base, receiver, log


class Parent:
    """A W3C trace context a client sends: a fresh trace id and parent span id."""

    def __init__(self) -> None:
        self.trace_id = secrets.token_bytes(16)
        self.span_id = secrets.token_bytes(8)
        self.header = {"traceparent": f"00-{self.trace_id.hex()}-{self.span_id.hex()}-01"}

    def span(self, receiver: Receiver) -> Span:
        """The one span of the request that sent this context, once it arrived."""
        (span,) = receiver.wait(lambda s: s.trace_id == self.trace_id)
        assert span.parent_span_id == self.span_id
        return span


def _attrs(span: Span) -> dict[str, Any]:
    return attributes(span.attributes)


def _events(span: Span) -> dict[str, tuple[int, dict[str, Any]]]:
    """Each event by name: (its time, its attributes); each name at most once."""
    events = {e.name: (e.time_unix_nano, attributes(e.attributes)) for e in span.events}
    assert len(events) == len(span.events), [e.name for e in span.events]
    return events


def _check_timeline(span: Span, names: list[str], cause: str) -> None:
    """The events are these, in this order, inside the span; the end says ``cause``."""
    assert [e.name for e in span.events] == names
    times = [span.start_time_unix_nano, *(e.time_unix_nano for e in span.events),
             span.end_time_unix_nano]
    assert times == sorted(times)
    events = _events(span)
    assert events["end"][1] == {"izh.end_cause": cause}
    if "scheduled" in events:
        assert events["scheduled"][1]["izh.engine_queue_s"] >= 0


def test_chat_span_carries_the_genai_attributes_under_the_incoming_traceparent(traced
                                                                               ) -> None:
    base, receiver, log = traced
    parent = Parent()
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
        temperature=0, seed=3, extra_headers={**parent.header, "X-Request-Id": "trace-chat"})
    span = parent.span(receiver)
    assert span.kind == Span.SPAN_KIND_SERVER
    assert span.name == f"chat {MODEL}"
    a = _attrs(span)
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.system"] == "izh_trio"
    assert a["gen_ai.request.model"] == MODEL
    assert a["gen_ai.request.max_tokens"] == 8
    assert a["gen_ai.request.temperature"] == 0.0 and a["gen_ai.request.seed"] == 3
    assert a["gen_ai.response.id"] == "trace-chat"
    assert a["gen_ai.usage.input_tokens"] == out.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == out.usage.completion_tokens
    assert a["gen_ai.response.finish_reasons"] == [out.choices[0].finish_reason]
    assert a["http.response.status_code"] == 200 and a["izh.stream"] is False
    assert "error.type" not in a and span.status.code == Status.STATUS_CODE_UNSET
    _check_timeline(span, GENERATED, "finished")
    resource = next(r for r, s in receiver.spans if s.trace_id == parent.trace_id)
    assert resource["service.name"] == "izh-trio"
    # the positive control of test_tracing_off_imports_nothing's check: on, it is imported
    assert "opentelemetry.sdk.trace" in log.read_text()


def test_a_request_without_traceparent_is_a_root_span(traced) -> None:
    base, receiver, _ = traced
    r = httpx.post(base + "/v1/chat/completions", timeout=60,
                   headers={"X-Request-Id": "trace-root"},
                   json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
    assert r.status_code == 200
    (span,) = receiver.wait(lambda s: _attrs(s).get("gen_ai.response.id") == "trace-root")
    assert span.parent_span_id == b"" and len(span.trace_id) == 16


def test_streamed_completion_ended_by_a_stop_string(traced) -> None:
    base, receiver, _ = traced
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    request: dict[str, Any] = dict(model=MODEL, prompt="Once upon a time there was",
                                   max_tokens=40, temperature=0,
                                   extra_body={"ignore_eos": True})
    full = client.completions.create(**request).choices[0].text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop.strip()
    parent = Parent()
    chunks = list(client.completions.create(**request, stop=[stop], stream=True,
                                            extra_headers=parent.header))
    assert chunks[-1].choices[0].finish_reason == "stop"
    span = parent.span(receiver)
    a = _attrs(span)
    assert span.name == f"text_completion {MODEL}"
    assert a["gen_ai.operation.name"] == "text_completion" and a["izh.stream"] is True
    assert a["gen_ai.request.stop_sequences"] == [stop]
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert 0 < a["gen_ai.usage.output_tokens"] < 40
    _check_timeline(span, GENERATED, "stop_string")


def test_a_client_gone_mid_stream_ends_its_span_with_disconnect(traced) -> None:
    base, receiver, _ = traced
    parent = Parent()
    body = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 1500,
            "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as client, client.stream(
            "POST", base + "/v1/chat/completions", json=body, headers=parent.header) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
    # the connection is closed: the server notices, aborts the generation, ends the span
    span = parent.span(receiver)
    a = _attrs(span)
    assert a["gen_ai.response.finish_reasons"] == []
    assert a["gen_ai.usage.output_tokens"] < 1500
    assert a["http.response.status_code"] == 200
    _check_timeline(span, GENERATED, "disconnect")


def test_a_deadline_ends_its_span_with_deadline(traced) -> None:
    base, receiver, _ = traced
    parent = Parent()
    r = httpx.post(base + "/v1/completions", timeout=60,
                   headers={**parent.header, "X-Request-Timeout": "0.3"},
                   json={"prompt": "Go on.", "max_tokens": 1500, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    a = _attrs(span := parent.span(receiver))
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["gen_ai.usage.output_tokens"] < 1500
    assert _events(span)["end"][1] == {"izh.end_cause": "deadline"}


def test_messages_and_responses_are_traced_too(traced) -> None:
    base, receiver, _ = traced
    parent = Parent()
    claude = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=60)
    msg = claude.messages.create(model=MODEL, max_tokens=5, extra_headers=parent.header,
                                 messages=[{"role": "user", "content": "Hello"}])
    a = _attrs(parent.span(receiver))
    assert a["gen_ai.operation.name"] == "chat" and a["url.path"] == "/v1/messages"
    assert a["gen_ai.request.max_tokens"] == 5
    assert a["gen_ai.usage.input_tokens"] == msg.usage.input_tokens
    assert a["gen_ai.usage.output_tokens"] == msg.usage.output_tokens

    parent = Parent()
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    resp = client.responses.create(model=MODEL, input="Hello", max_output_tokens=6,
                                   store=False, extra_headers=parent.header)
    a = _attrs(span := parent.span(receiver))
    assert a["url.path"] == "/v1/responses" and a["gen_ai.request.max_tokens"] == 6
    assert a["gen_ai.usage.output_tokens"] == resp.usage.output_tokens
    _check_timeline(span, GENERATED, "finished")


def test_a_refused_request_gets_a_span_without_error_status(traced) -> None:
    base, receiver, _ = traced
    parent = Parent()
    r = httpx.post(base + "/v1/chat/completions", headers=parent.header, timeout=60,
                   json={"model": "no-such-model", "messages": [{"role": "user",
                                                                "content": "Hi"}]})
    assert r.status_code == 404
    span = parent.span(receiver)
    a = _attrs(span)
    assert a["http.response.status_code"] == 404 and a["error.type"] == "404"
    assert "gen_ai.usage.output_tokens" not in a
    assert span.status.code == Status.STATUS_CODE_UNSET
    _check_timeline(span, ["end"], "refused")


def test_a_drained_stream_and_the_spans_queued_at_shutdown(hf_dir: Path, tmp_path: Path
                                                           ) -> None:
    """SIGTERM with no drain time fails the stream still running (in-band, a 503): its span
    ends with ``drain`` as an ERROR. The batch delay never fires here: the spans arrive only
    because the shutdown flushes them."""
    with otlp_receiver() as (collector, receiver):
        port = free_port()
        args = serve_args(hf_dir, port, "--otlp-traces-endpoint", collector + "/v1/traces",
                          "--drain-timeout", "0")
        with running_server(args, tmp_path / "server.log", port=port,
                            env={**PACED, **NO_EXPORT}) as (base, proc):
            done, drained = Parent(), Parent()
            r = httpx.post(base + "/v1/completions", headers=done.header, timeout=60,
                           json={"prompt": "Hi", "max_tokens": 2})
            assert r.status_code == 200
            body = {"prompt": "Go on.", "max_tokens": 1500, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60,
                              headers=drained.header) as stream:
                lines = stream.iter_lines()
                assert next(line for line in lines if line.startswith("data:"))
                assert receiver.posts == 0
                proc.send_signal(signal.SIGTERM)
                rest = "\n".join(lines)  # to the stream's end: its in-band error
            assert "shutting down" in rest
            assert proc.wait(timeout=60) == 0
        assert done.span(receiver).name.startswith("text_completion")
        span = drained.span(receiver)
    assert span.status.code == Status.STATUS_CODE_ERROR
    assert "shutting down" in span.status.message
    a = _attrs(span)
    assert a["http.response.status_code"] == 200 and a["error.type"] == "503"
    _check_timeline(span, GENERATED, "drain")


def test_tracing_off_imports_nothing_of_opentelemetry(hf_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    port = free_port()
    with running_server(_importtime(serve_args(hf_dir, port)), log, port=port) as (base, _):
        r = httpx.post(base + "/v1/chat/completions", timeout=60, headers=Parent().header,
                       json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        assert r.status_code == 200
        with httpx.stream("POST", base + "/v1/completions", timeout=60,
                          json={"prompt": "Hi", "max_tokens": 3, "stream": True}) as s:
            assert s.status_code == 200 and "[DONE]" in s.read().decode()
    text = log.read_text()  # the server's whole life, its shutdown included
    assert "izh_trio.frontend.serving.pipeline" in text  # -X importtime did log imports
    assert "opentelemetry" not in text

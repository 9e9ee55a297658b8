"""The access-log ASGI wrapper and the log formats, without a server (fake ASGI apps)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import pytest

from izh_trio.frontend import access_log
from izh_trio.frontend.errors import APIError, error_body
from izh_trio.wire.log_format import JsonFormatter, TextFormatter, logfmt

SCOPE = {"type": "http", "method": "POST", "path": "/v1/completions",
         "headers": [(b"content-type", b"application/json"), (b"x-request-id", b"given")]}


def _app(*, status: int | None = 200, body: bytes = b"{}", finish: bool = True,
         raise_: Exception | None = None, noted: APIError | None = None,
         wait_for_disconnect: bool = False) -> Any:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        if wait_for_disconnect:
            assert (await receive())["type"] == "http.disconnect"
        if status is not None:
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"x-request-id", b"echoed")]})
        if noted is not None:
            access_log.noted(noted)
        if raise_ is not None:
            raise raise_
        if status is not None and finish:
            await send({"type": "http.response.body", "body": body, "more_body": False})

    return access_log.with_access_log(app)


async def _call(app: Any, caplog: pytest.LogCaptureFixture, *, disconnect: bool = False,
                scope: dict | None = None) -> list[logging.LogRecord]:
    caplog.set_level(logging.INFO, logger="izh_trio.access")
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.disconnect"} if disconnect else {"type": "http.request"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope or SCOPE, receive, send)
    return [r for r in caplog.records if r.name == "izh_trio.access"]


async def test_a_plain_request_is_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    [record] = await _call(_app(), caplog)
    assert record.levelno == logging.INFO and record.getMessage() == "POST /v1/completions 200"
    f = record.fields
    assert (f["method"], f["path"], f["status"], f["request_id"]) == (
        "POST", "/v1/completions", 200, "echoed")
    assert f["disconnected"] is False and f["error"] is None and f["duration"] >= 0


async def test_a_5xx_is_logged_with_the_message_of_its_body(
        caplog: pytest.LogCaptureFixture) -> None:
    body = json.dumps(error_body(500, "the request failed in the engine: gone")).encode()
    [record] = await _call(_app(status=500, body=body), caplog)
    assert record.levelno == logging.ERROR
    assert record.fields["error"] == "the request failed in the engine: gone"
    assert record.fields["error_status"] is None  # the status line says it already
    body = json.dumps(error_body(503, "the server is shutting down")).encode()
    caplog.clear()
    [record] = await _call(_app(status=503, body=body), caplog)
    assert record.levelno == logging.WARNING
    assert record.fields["error"] == "the server is shutting down"


async def test_an_error_noted_under_a_200_is_logged_with_its_status(
        caplog: pytest.LogCaptureFixture) -> None:
    [record] = await _call(_app(noted=APIError(500, "failed in the engine")), caplog)
    assert record.levelno == logging.ERROR
    assert (record.fields["status"], record.fields["error_status"]) == (200, 500)
    assert record.fields["error"] == "failed in the engine"


async def test_a_4xx_is_logged_without_its_message(caplog: pytest.LogCaptureFixture) -> None:
    body = json.dumps(error_body(400, "invalid 'prompt': secret words")).encode()
    [record] = await _call(_app(status=400, body=body), caplog)
    assert record.levelno == logging.INFO and record.fields["error"] is None


async def test_a_client_gone_before_the_end_is_marked(caplog: pytest.LogCaptureFixture) -> None:
    [record] = await _call(_app(status=None, wait_for_disconnect=True), caplog,
                           disconnect=True)
    assert record.levelno == logging.INFO
    assert record.fields["disconnected"] is True and record.fields["status"] is None
    assert record.fields["request_id"] == "given"  # no response: the client's own id


async def test_a_response_the_server_cut_short_is_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    [record] = await _call(_app(finish=False), caplog)
    assert record.levelno == logging.WARNING and not record.fields["disconnected"]
    assert record.fields["error"] == "the response was cut short by the server"


async def test_an_unhandled_exception_is_logged_and_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(RuntimeError):
        await _call(_app(status=None, raise_=RuntimeError("boom")), caplog)
    [record] = [r for r in caplog.records if r.name == "izh_trio.access"]
    assert record.levelno == logging.ERROR
    assert record.fields["error"] == "unhandled RuntimeError: boom"


async def test_other_scopes_pass_through_unlogged(caplog: pytest.LogCaptureFixture) -> None:
    assert await _call(_app(), caplog, scope={"type": "lifespan"}) == []


def test_notes_outside_a_request_are_ignored() -> None:
    access_log.note_first_token(0.1)
    access_log.note_generation(prompt_tokens=1, completion_tokens=1, cached_tokens=0,
                               finish_reasons=["stop"])
    error = APIError(500, "x")
    assert access_log.noted(error) is error and access_log.current() is None


def test_logfmt_quotes_what_would_not_read_back() -> None:
    assert logfmt({"a": 1, "b": None, "c": False, "d": [], "e": True, "f": ["x", "y"],
                   "g": 'say "hi"', "h": "a b", "i": "line\nbreak", "j": "k=v", "k": ""}) == (
        'a=1 e=true f=x,y g="say \\"hi\\"" h="a b" i="line\\nbreak" j="k=v" k=""')


def _record(**kwargs: Any) -> logging.LogRecord:
    record = logging.LogRecord("izh_trio.x", logging.ERROR, __file__, 1, "it %s", ("failed",),
                               kwargs.pop("exc_info", None))
    record.__dict__.update(kwargs)
    return record


def test_formats_of_a_record_with_fields() -> None:
    record = _record(fields={"method": "GET", "path": "/health", "status": 200, "error": None})
    assert TextFormatter().format(record).endswith(
        " izh_trio.x ERROR method=GET path=/health status=200")
    obj = json.loads(JsonFormatter().format(record))
    assert obj["message"] == "it failed" and obj["status"] == 200 and obj["error"] is None
    assert {"time", "level", "logger"} <= set(obj) and obj["level"] == "ERROR"


def test_json_keeps_a_traceback_inside_its_one_line() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        record = _record(exc_info=sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["message"] == "it failed"
    assert obj["exc_info"].startswith("Traceback") and "ValueError: bad" in obj["exc_info"]

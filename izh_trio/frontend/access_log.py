"""The access log: one line per HTTP request, written when the request's ASGI call ends.

A streamed response is logged once, at its end, with its real totals; a client that left
before the response was complete is logged too (``disconnected``). An ASGI wrapper keeps an
:class:`AccessRecord` in a context variable for the request's whole call (trio copies the
context into the tasks quart-trio starts for it), and whoever knows a value notes it there:

* the wrapper itself: method, path, status, the ``X-Request-Id`` the response echoes (else the
  one the client sent), the duration, whether the response completed, and the cause of every
  5xx (the message of its error body);
* ``generation``: time to first token, prompt / completion / cached tokens counted as the
  response's usage counts them, finish reasons, and every failure on the engine's side,
  including one reported in-band in a stream whose status line already said 200.

No prompt, message or output text is ever noted: 4xx causes are not logged, since a
validation message may quote what the client sent; 5xx and engine-side causes come from the
server and the engine. Lines are INFO; WARNING for a 503 or an engine-side rejection, or a
response cut short by the server; ERROR for any other 5xx, in-band or not. The line's format
(text or JSON) is the log handler's: see :mod:`izh_trio.wire.log_format`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any

import attrs
from hypercorn.typing import (
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    Scope,
)

from izh_trio.frontend.asgi import ASGIApp
from izh_trio.frontend.errors import APIError

log = logging.getLogger("izh_trio.access")

_RECORD: ContextVar[AccessRecord | None] = ContextVar("izh_access_record", default=None)
_REQUEST_ID = b"x-request-id"
_MAX_ERROR_BODY = 64 << 10  # bytes of a 5xx body kept to find its cause


@attrs.define
class AccessRecord:
    """What one HTTP request came to; None where a value does not apply (or never came)."""

    method: str
    path: str
    start: float  # time.monotonic() when the ASGI call began
    status: int | None = None  # None: no response was started
    request_id: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft: float | None = None  # seconds from the route's arrival to the first token
    finish_reasons: list[str] = attrs.Factory(list)
    error: str | None = None  # the first cause noted
    error_status: int | None = None
    completed: bool = False  # the response's last bytes were handed to the server
    disconnected: bool = False  # the client left before that

    def note_error(self, status: int | None, message: str) -> None:
        if self.error is None:
            self.error, self.error_status = message, status

    def level(self) -> int:
        if self.error is None:
            return logging.INFO
        status = self.error_status or 0
        return logging.ERROR if status >= 500 and status != 503 else logging.WARNING

    def fields(self, duration: float) -> dict[str, Any]:
        """The line's fields, in order; ``error_status`` only where the status line differs
        (an error reported inside a stream that began 200)."""
        return {
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "request_id": self.request_id,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "ttft": None if self.ttft is None else round(self.ttft, 6),
            "duration": round(duration, 6),
            "finish_reasons": self.finish_reasons,
            "disconnected": self.disconnected,
            "error_status": self.error_status if self.error_status != self.status else None,
            "error": self.error,
        }


# ---------------------------------------------------------------- noted by the request's code
def current() -> AccessRecord | None:
    """The current HTTP request's record (None outside one, e.g. in unit tests)."""
    return _RECORD.get()


def note_first_token(seconds: float) -> None:
    record = _RECORD.get()
    if record is not None and record.ttft is None:
        record.ttft = seconds


def note_generation(*, prompt_tokens: int, completion_tokens: int, cached_tokens: int,
                    finish_reasons: Iterable[str]) -> None:
    """A generation of this request ended (however): add its totals."""
    record = _RECORD.get()
    if record is None:
        return
    record.prompt_tokens = (record.prompt_tokens or 0) + prompt_tokens
    record.completion_tokens = (record.completion_tokens or 0) + completion_tokens
    record.cached_tokens = (record.cached_tokens or 0) + cached_tokens
    record.finish_reasons.extend(finish_reasons)


def noted(error: APIError) -> APIError:
    """Note ``error`` as this request's cause, and return it (``raise noted(APIError(...))``)."""
    record = _RECORD.get()
    if record is not None:
        record.note_error(error.status, error.message)
    return error


# ---------------------------------------------------------------- the ASGI wrapper
def with_access_log(asgi_app: ASGIApp,
                    on_status: Callable[[int], None] | None = None) -> ASGIApp:
    """Wrap an ASGI app so that every HTTP request is logged when its call ends.
    ``on_status``: called with each response's status as its status line goes out (the
    status counts: ``http_metrics``), from this wrapper's look at every send."""

    async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http":
            return await asgi_app(scope, receive, send)
        record = AccessRecord(scope["method"], scope["path"], time.monotonic(),
                              request_id=_request_id(scope["headers"]))
        error_body: list[bytes] | None = None  # a 5xx body, kept for its cause

        async def receive_noting() -> ASGIReceiveEvent:
            message = await receive()
            if message["type"] == "http.disconnect" and not record.completed:
                record.disconnected = True
            return message

        async def send_noting(message: ASGISendEvent) -> None:
            nonlocal error_body
            if message["type"] == "http.response.start":
                record.status = message["status"]
                if on_status is not None:
                    on_status(record.status)
                record.request_id = _request_id(message.get("headers", ())) or record.request_id
                if record.status >= 500:
                    error_body = []
            elif message["type"] == "http.response.body":
                if error_body is not None and sum(map(len, error_body)) < _MAX_ERROR_BODY:
                    error_body.append(message.get("body", b""))
                if not message.get("more_body"):
                    # Before the send: a client that reads the whole body may close the
                    # socket, and so report its disconnect, before the server returns from
                    # this send.
                    record.completed = True
            await send(message)

        token = _RECORD.set(record)
        try:
            return await asgi_app(scope, receive_noting, send_noting)
        except Exception as exc:  # the app's own handlers missed it: the server answers 500
            record.note_error(500, f"unhandled {type(exc).__name__}: {exc}")
            raise
        finally:
            _RECORD.reset(token)
            if error_body is not None:
                record.note_error(record.status, _cause(b"".join(error_body)))
            elif not record.completed and not record.disconnected:
                record.note_error(record.status, "the response was cut short by the server")
            _write(record)

    return app


def _request_id(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name.lower() == _REQUEST_ID:
            return value.decode("latin-1").strip()[:256] or None
    return None


def _cause(body: bytes) -> str:
    """The message of an OpenAI error body, else the body as text."""
    with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
        return str(json.loads(body)["error"]["message"])
    return body.decode("utf-8", "replace").strip()[:1000] or "(no error message)"


def _write(record: AccessRecord) -> None:
    level = record.level()
    if log.isEnabledFor(level):
        log.log(level, "%s %s %s", record.method, record.path, record.status or "-",
                extra={"fields": record.fields(time.monotonic() - record.start)})

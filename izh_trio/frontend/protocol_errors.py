"""OpenAI-shaped bodies for the errors hypercorn answers itself, before any ASGI code runs.

A request h11 cannot parse (a malformed request line or header, a bad ``Content-Length``) is
answered 400, and one whose request line and headers outgrow ``h11_max_incomplete_size``
431, by hypercorn's ``H11Protocol._send_error_response``, with an empty body: the app never
sees these requests, so no error handler of ours can shape them. hypercorn has no setting
for that response (nor a way to choose the protocol class: ``ProtocolWrapper`` builds an
``H11Protocol`` by its module-level name), so :func:`install` points that name at a subclass
whose ``_send_error_response`` sends ``{"error": {...}}``, with the same status, headers and
``Connection: close``. It is a private method: if a hypercorn release no longer has it with
this shape, nothing is installed and those answers stay empty (a test notices).
HTTP/2 has no such answers (a malformed frame resets the stream or the connection).
"""

from __future__ import annotations

import inspect
import logging
from http import HTTPStatus

import h11
import hypercorn.protocol
import orjson
from hypercorn.protocol.h11 import H11Protocol

from izh_trio.frontend.errors import error_body

log = logging.getLogger(__name__)


def _message(status: int, max_head: int) -> str:
    if status == HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
        return f"the request line and headers are larger than the server accepts " \
               f"({max_head} bytes)"
    if status == HTTPStatus.BAD_REQUEST:
        return "the HTTP request is malformed (its request line, a header, or its framing)"
    return HTTPStatus(status).phrase


class ShapedH11Protocol(H11Protocol):
    """hypercorn's HTTP/1.1 protocol, with its own error answers in OpenAI's shape."""

    async def _send_error_response(self, status_code: int) -> None:
        body = orjson.dumps(error_body(
            status_code, _message(status_code, self.config.h11_max_incomplete_size)))
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close"), *self.config.response_headers("h11")]
        await self._send_h11_event(h11.Response(status_code=status_code, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


def install() -> bool:
    """Have hypercorn's HTTP/1.1 connections use :class:`ShapedH11Protocol` (idempotent);
    False (and hypercorn left as it is) where this hypercorn does not fit."""
    current = getattr(hypercorn.protocol, "H11Protocol", None)
    if current is ShapedH11Protocol:
        return True
    original = getattr(H11Protocol, "_send_error_response", None)
    fits = (current is H11Protocol and inspect.iscoroutinefunction(original)
            and list(inspect.signature(original).parameters) == ["self", "status_code"])
    if not fits:
        log.debug("hypercorn's H11Protocol is not the one expected: its own 400/431 answers "
                  "keep their empty bodies")
        return False
    hypercorn.protocol.H11Protocol = ShapedH11Protocol  # type: ignore[misc]
    return True

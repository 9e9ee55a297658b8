"""The ASGI application type the frontend's wrappers take and give (quart's ``asgi_app``, a
coroutine function a wrapper replaces, in hypercorn's typed scope and events), and the two
wrappers that make hypercorn close connections as a client needs."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import trio
from hypercorn.typing import (
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    HTTPResponseStartEvent,
    Scope,
)

ASGIApp = Callable[[Scope, ASGIReceiveCallable, ASGISendCallable], Coroutine[Any, Any, None]]


def shield_last_send(asgi_app: ASGIApp) -> ASGIApp:
    """Let hypercorn finish closing a ``Connection: close`` (or HTTP/1.0) response.

    The response's last send is where hypercorn closes such a connection, and quart-trio
    cancels the request's nursery as soon as hypercorn reports the disconnect that this
    close itself causes: the close is cancelled half-way and the socket stays open, so a
    client reading to EOF (HTTP/1.0 streams have no other end) waits forever. hypercorn
    already shields its socket writes, so shielding the last one adds no new wait.
    """

    async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http":
            await asgi_app(scope, receive, send)
            return

        async def send_last_shielded(message: ASGISendEvent) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                with trio.CancelScope(shield=True):
                    await send(message)
                    return
            await send(message)

        await asgi_app(scope, receive, send_last_shielded)

    return app


def close_unless_body_read(asgi_app: ASGIApp) -> ASGIApp:
    """Say ``Connection: close`` on an error answered before the request's body was read.

    A request refused for its key, its path or its size may still be sending its body, and
    hypercorn does not read a body for an app that has answered: once the answer is out it
    closes the connection, silently, dropping whatever the client sent after it. The header
    tells the client so. Only then: an error to a request whose body was read whole (bad
    JSON, a bad field) leaves the connection open, and requests pipelined behind it on
    HTTP/1.1 get their answers. quart reads the body as it arrives, whether or not the route
    asks for it, so "read" is "its last part has come in", seen here in ``receive`` (a body
    that came in with the headers may not have been taken yet when an early error goes out:
    that connection is closed too, which is never wrong, only a reconnect).
    """

    async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        # HTTP/2 ends a stream, not the connection (and forbids a Connection header).
        if scope["type"] != "http" or scope.get("http_version") not in ("1.0", "1.1"):
            await asgi_app(scope, receive, send)
            return
        # A request without a body is complete once its headers are (hypercorn still sends
        # one empty body message, which may not have been taken yet).
        body_read = not _has_body(scope["headers"])

        async def receive_noting() -> ASGIReceiveEvent:
            nonlocal body_read
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_read = True
            return message

        async def send_closing(message: ASGISendEvent) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400 \
                    and not body_read:
                headers = [(name, value) for name, value in message["headers"]
                           if name.lower() != b"connection"]
                closing: HTTPResponseStartEvent = {
                    **message, "headers": [*headers, (b"connection", b"close")]}
                message = closing
            await send(message)

        await asgi_app(scope, receive_noting, send_closing)

    return app


def _has_body(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        name = name.lower()
        if name == b"transfer-encoding" or (name == b"content-length"
                                            and value.strip() not in (b"0", b"")):
            return True
    return False

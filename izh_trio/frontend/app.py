"""The QuartTrio application: lifecycle, auth, errors, routes."""

from __future__ import annotations

import logging
from typing import Any

import trio
from quart import g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from izh_trio.frontend import protocol_errors
from izh_trio.frontend.access_log import with_access_log
from izh_trio.frontend.auth import OPEN_PATHS, authorized, bearer_token, key_bytes
from izh_trio.frontend.errors import APIError, error_body
from izh_trio.frontend.request_scope import with_request_scope
from izh_trio.frontend.responses.route import bp as responses_bp
from izh_trio.frontend.routes import BLUEPRINTS
from izh_trio.frontend.server import Server, StartupError
from izh_trio.frontend.serving.intake import REQUEST_ID_HEADER
from izh_trio.frontend.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings) -> QuartTrio:
    """Build the app; nothing heavy happens until hypercorn's lifespan startup."""
    app = QuartTrio("izh_trio")
    app.config.update(
        RESPONSE_TIMEOUT=None,  # a long stream is legitimate; deadlines are per request
        BODY_TIMEOUT=60,
        MAX_CONTENT_LENGTH=settings.max_body_bytes,
    )
    server = Server(settings)
    app.extensions["izh"] = server
    app.logger.addFilter(_startup_failure_in_one_line)

    @app.before_serving
    async def _start() -> None:
        await server.start(app.nursery)

    @app.after_serving
    async def _stop() -> None:
        await server.stop()

    keys = key_bytes(server.api_keys)
    protocol_errors.install()  # hypercorn's own 400/431 answers, in OpenAI's shape

    @app.before_request
    async def _authenticate() -> Any:
        if not keys or request.path in OPEN_PATHS:
            return None
        if not authorized(bearer_token(request.scope["headers"]), keys):
            return error_body(401, "invalid or missing API key", code="invalid_api_key"), 401
        return None

    @app.after_request
    async def _finish_headers(response: Any) -> Any:
        rid = getattr(g, "request_id", None) or request.headers.get(REQUEST_ID_HEADER)
        if rid:
            response.headers[REQUEST_ID_HEADER] = rid
        return response

    @app.errorhandler(APIError)
    async def _api_error(exc: APIError) -> Any:
        return exc.body(), exc.status, exc.headers

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Any:
        status = exc.code or 500
        headers = {"Allow": ", ".join(exc.valid_methods)} if getattr(
            exc, "valid_methods", None) else {}
        return error_body(status, exc.description or exc.name), status, headers

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Any:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_body(500, f"internal server error ({type(exc).__name__})"), 500

    for bp in (*BLUEPRINTS, responses_bp):
        app.register_blueprint(bp)
    app.asgi_app = with_access_log(  # type: ignore[method-assign]
        with_request_scope(_close_unless_body_read(_shield_last_send(app.asgi_app))))
    return app


def _startup_failure_in_one_line(record: logging.LogRecord) -> bool:
    """quart logs a failed start-up with its traceback; a StartupError's message is the whole
    story (a missing file, a device torch lacks), so it is logged as that one line."""
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, StartupError):
        record.msg, record.args, record.exc_info = "start-up failed: %s", (error,), None
    return True


def _shield_last_send(asgi_app: Any) -> Any:
    """Let hypercorn finish closing a ``Connection: close`` (or HTTP/1.0) response.

    The response's last send is where hypercorn closes such a connection, and quart-trio
    cancels the request's nursery as soon as hypercorn reports the disconnect that this
    close itself causes: the close is cancelled half-way and the socket stays open, so a
    client reading to EOF (HTTP/1.0 streams have no other end) waits forever. hypercorn
    already shields its socket writes, so shielding the last one adds no new wait.
    """

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await asgi_app(scope, receive, send)

        async def send_last_shielded(message: dict) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                with trio.CancelScope(shield=True):
                    return await send(message)
            return await send(message)

        return await asgi_app(scope, receive, send_last_shielded)

    return app


def _close_unless_body_read(asgi_app: Any) -> Any:
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

    async def app(scope: dict, receive: Any, send: Any) -> None:
        # HTTP/2 ends a stream, not the connection (and forbids a Connection header).
        if scope["type"] != "http" or scope.get("http_version") not in ("1.0", "1.1"):
            return await asgi_app(scope, receive, send)
        # A request without a body is complete once its headers are (hypercorn still sends
        # one empty body message, which may not have been taken yet).
        body_read = not _has_body(scope["headers"])

        async def receive_noting(*args: Any) -> dict:
            nonlocal body_read
            message = await receive(*args)
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_read = True
            return message

        async def send_closing(message: dict) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400 \
                    and not body_read:
                headers = [(name, value) for name, value in message.get("headers", ())
                           if name.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        return await asgi_app(scope, receive_noting, send_closing)

    return app


def _has_body(headers: Any) -> bool:
    for name, value in headers:
        name = name.lower()
        if name == b"transfer-encoding" or (name == b"content-length"
                                            and value.strip() not in (b"0", b"")):
            return True
    return False

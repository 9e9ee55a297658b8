"""The QuartTrio application: lifecycle, auth, errors, routes."""

from __future__ import annotations

import logging
from typing import Any

from quart import g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from izh_trio.frontend import connection_cycles, protocol_errors
from izh_trio.frontend.access_log import with_access_log
from izh_trio.frontend.asgi import close_unless_body_read, shield_last_send
from izh_trio.frontend.auth import OPEN_PATHS, authorized, bearer_token, key_bytes
from izh_trio.frontend.errors import APIError, error_body, forget_tracebacks
from izh_trio.frontend.messages.errors import anthropic_error, anthropic_status, speaks_anthropic
from izh_trio.frontend.messages.route import bp as messages_bp
from izh_trio.frontend.metrics import refusal_of
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
    connection_cycles.install()  # a closed connection freed at once, not by a collection

    @app.before_request
    async def _authenticate() -> Any:
        if not keys or request.path in OPEN_PATHS:
            return None
        if not authorized(bearer_token(request.scope["headers"]), keys):
            return _error(401, "invalid or missing API key", code="invalid_api_key")
        return None

    @app.after_request
    async def _finish_headers(response: Any) -> Any:
        rid = getattr(g, "request_id", None) or request.headers.get(REQUEST_ID_HEADER)
        if rid:
            response.headers[REQUEST_ID_HEADER] = rid
        return response

    def _count_refusal(status: int, code: str | None) -> None:
        if (cause := refusal_of(status, code)) is not None:
            server.metrics.requests.refused(cause)

    @app.errorhandler(APIError)
    async def _api_error(exc: APIError) -> Any:
        _count_refusal(exc.status, exc.code)
        return _error(exc.status, exc.message, param=exc.param, code=exc.code,
                      headers=exc.headers)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Any:
        status = exc.code or 500
        _count_refusal(status, None)
        headers = {"Allow": ", ".join(exc.valid_methods)} if isinstance(
            exc, MethodNotAllowed) and exc.valid_methods else {}
        # A routing error is kept on the request, and its traceback's frames refer to the
        # request: a cycle per 404 or 405 otherwise (a scanner's every probe).
        forget_tracebacks(exc)
        return _error(status, exc.description or exc.name, headers=headers)

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Any:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error(500, f"internal server error ({type(exc).__name__})")

    for bp in (*BLUEPRINTS, responses_bp, messages_bp):
        app.register_blueprint(bp)
    # quart documents replacing asgi_app to wrap the app, but types it as a method
    app.asgi_app = with_access_log(  # type: ignore[method-assign, assignment]
        with_request_scope(close_unless_body_read(shield_last_send(app.asgi_app))),
        on_status=server.metrics.statuses.count)
    return app


def _error(status: int, message: str, *, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None) -> tuple[dict[str, Any], int, dict[str, str]]:
    """An error answer in the shape of the API the request's path belongs to: Anthropic's
    under /v1/messages (with its statuses), OpenAI's everywhere else."""
    if speaks_anthropic(request.path):
        return anthropic_error(status, message), anthropic_status(status), headers or {}
    return error_body(status, message, param=param, code=code), status, headers or {}


def _startup_failure_in_one_line(record: logging.LogRecord) -> bool:
    """quart logs a failed start-up with its traceback; a StartupError's message is the whole
    story (a missing file, a device torch lacks), so it is logged as that one line."""
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, StartupError):
        record.msg, record.args, record.exc_info = "start-up failed: %s", (error,), None
    return True

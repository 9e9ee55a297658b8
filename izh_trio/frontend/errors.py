"""OpenAI-format errors: ``{"error": {"message", "type", "param", "code"}}``, right status."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def innermost_message(exc: BaseException) -> str:
    """The message of the first leaf inside whatever exception groups wrap ``exc`` (trio's
    nurseries and cattrs both group what they raise)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


def forget_tracebacks(exc: BaseException) -> None:
    """Drop the tracebacks of an exception answered for good, of those it groups and of its
    context: their frames often refer back to it (cattrs keeps a group's members in a list
    local to the raising frame; quart keeps a routing error on the request), a reference
    cycle per refused request otherwise."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo.extend(x for x in (e.__context__, e.__cause__) if x is not None)
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)


class APIError(Exception):
    """Raised anywhere in a route; the app turns it into the error body and status."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return {"error": {"message": message, "type": kind, "param": param,
                      "code": code if code is not None else status}}

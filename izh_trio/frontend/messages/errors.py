"""Errors as Anthropic's API says them: ``{"type": "error", "error": {"type", "message"}}``.

Every route under :data:`PREFIX` answers its errors in this shape, whichever part of the
server raised them (auth, the body's parsing, admission, the engine). Statuses are
Anthropic's: an overloaded server is a 529 (its SDKs retry it, as they retry a 429), with the
``Retry-After`` the OpenAI routes send with their 503.
"""

from __future__ import annotations

from typing import Any

PREFIX = "/v1/messages"
OVERLOADED = 529

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    OVERLOADED: "overloaded_error",
}


def speaks_anthropic(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def anthropic_status(status: int) -> int:
    """The status Anthropic answers where the OpenAI routes answer ``status``."""
    return OVERLOADED if status == 503 else status


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """The error object of an answer (or of a stream's ``error`` event) with this status."""
    kind = _TYPES.get(anthropic_status(status))
    if kind is None:
        kind = "invalid_request_error" if 400 <= status < 500 else "api_error"
    return {"type": "error", "error": {"type": kind, "message": message}}

"""Server-sent events as OpenAI streams them: ``data: {json}\\n\\n`` ... ``data: [DONE]``."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from izh_trio.frontend import access_log
from izh_trio.frontend.errors import APIError

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON; orjson, since one chunk per token per stream makes this hot."""
    return orjson.dumps(obj)


def event(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


def unexpected(exc: Exception) -> bytes:
    """The event for a bug met after the status line went out: logged with its traceback and
    said as the app says one before it (a 500 error body), so that the stream still ends as
    documented, with that event and then [DONE], rather than cut off mid-body."""
    log.error("unhandled error in a stream", exc_info=exc)
    return event(access_log.noted(
        APIError(500, f"internal server error ({type(exc).__name__})")).body())

"""Server-sent events as OpenAI streams them: ``data: {json}\\n\\n`` ... ``data: [DONE]``."""

from __future__ import annotations

from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON; orjson, since one chunk per token per stream makes this hot."""
    return orjson.dumps(obj)


def event(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


"""Server-sent events as OpenAI streams them: ``data: {json}\\n\\n`` ... ``data: [DONE]``
(chat, completions), or typed ``event:`` and ``data:`` lines (responses)."""

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


def typed(kind: str, obj: Any) -> bytes:
    """An event with an ``event:`` line naming its type, as the Responses API streams them."""
    return b"event: " + kind.encode() + b"\ndata: " + dumps(obj) + b"\n\n"

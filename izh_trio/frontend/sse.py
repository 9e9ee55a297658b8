"""Server-sent events as OpenAI streams them: ``data: {json}\\n\\n`` ... ``data: [DONE]``."""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def event(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"

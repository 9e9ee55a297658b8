"""The server's log formats: ``text`` (one readable line) or ``json`` (one object per line).

Every line goes through the one handler :func:`configure` installs, so an operator's log
shipper sees a single format: start-up, drain, errors with their tracebacks (escaped into the
JSON object, or indented under the line in text) and the access log alike. A record may carry
``fields`` (``extra={"fields": {...}}``): in text they *are* the message, as ``key=value``
pairs (values with spaces or quotes quoted, empty ones left out); in JSON they are keys of the
object beside ``time``, ``level``, ``logger`` and ``message`` (there a short summary).

Standard library and orjson only: both processes write their lines with it (the engine core
is told the format in its ``EngineConfig``), so the server's whole output is one format.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

#: A value that would not read back as one ``key=value`` pair: quoted (JSON string escapes).
_NEEDS_QUOTES = re.compile(r'[\s"=\\\x00-\x1f\x7f]')


def logfmt(fields: Mapping[str, Any]) -> str:
    """``key=value ...``; None, False and empty lists are left out, lists joined by commas."""
    parts = []
    for key, value in fields.items():
        if value is None or value is False or value == []:
            continue
        if value is True:
            text = "true"
        elif isinstance(value, list | tuple):
            text = ",".join(str(v) for v in value)
        else:
            text = str(value)
        if not text or _NEEDS_QUOTES.search(text):
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT``; a record's ``fields``, as ``key=value`` pairs, are its message."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None)
        if fields is not None:
            record.message = logfmt(fields)  # every format() sets it afresh: no harm to others
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the record's
    ``fields``, and ``exc_info`` / ``stack_info`` as text when there are any."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields is not None:
            out.update(fields)
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return orjson.dumps(out, default=str).decode()


def formatter(fmt: str) -> logging.Formatter:
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; one of {', '.join(FORMATS)}")
    return JsonFormatter() if fmt == "json" else TextFormatter()


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """One handler on stderr, in ``fmt``, for every logger (unless logging is set up already,
    as ``logging.basicConfig`` does)."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(fmt))
    logging.basicConfig(level=level.upper(), handlers=[handler])


def to_root_only(record: logging.LogRecord) -> bool:
    """A logger filter: hand the record to the root logger's handlers, and to no handler of
    its own (for a logger that a library equips with a handler and format of its own)."""
    logging.getLogger().handle(record)
    return False

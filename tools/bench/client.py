"""One streamed request, timed on the client the way a user would feel it.

Lean on purpose: the client shares the CPUs with the server under test, so it parses SSE on
raw bytes from ``tools.bench.http`` and decodes each event once, with orjson when installed.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from tools.bench.http import HTTPClient, Response

try:
    from orjson import dumps, loads
except ImportError:  # ~10x slower, same results
    import json

    loads = json.loads

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

MAX_ERROR_BODY = 4096


@dataclass
class Outcome:
    """What one request measured; times are ``time.perf_counter()`` seconds."""

    ok: bool = False
    error: str = ""
    start: float = 0.0
    end: float = 0.0
    ttft: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int = 0

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def itls(self) -> list[float]:
        """Gaps between arrivals: events that came in one read (one timestamp) reached the
        user together, so the gaps inside such a burst are not inter-token latencies of 0."""
        t = self.chunk_times
        return [b - a for a, b in itertools.pairwise(t) if b > a]

    @property
    def tpot(self) -> float | None:
        """Decode time per token after the first; undefined for single-token answers."""
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def chunk_text(event: dict[str, Any]) -> str:
    """The generated text in one SSE event, for either endpoint (reasoning text counts)."""
    choices = event.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    if "text" in c:
        return c.get("text") or ""
    delta = c.get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


class SSESplitter:
    """Bytes in, each event's ``data`` out: events end at a blank line (LF or CRLF), may be
    split anywhere across reads, and one read may carry several."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._rest + data if self._rest else data
        if b"\r" in buf:  # a lone trailing CR waits in _rest for its LF
            buf = buf.replace(b"\r\n", b"\n")
        *events, self._rest = buf.split(b"\n\n")
        out = []
        for e in events:
            if e[:5] == b"data:" and b"\n" not in e:  # the usual one-line event
                out.append(e[5:])
            elif (d := _data(e)) is not None:
                out.append(d)
        return out

    def flush(self) -> list[bytes]:
        """An event the stream ended inside of, without its blank line."""
        rest, self._rest = self._rest, b""
        d = _data(rest.rstrip(b"\r\n"))
        return [] if d is None else [d]


def _data(event: bytes) -> bytes | None:
    """The event's ``data:`` lines joined by LF; None for events without data (comments)."""
    lines = [line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


class _SSESink:
    """Turns one response's bytes into an Outcome as they arrive (fed by the reader task)."""

    def __init__(self, out: Outcome) -> None:
        self.out = out
        self.status = 0
        self.sse = SSESplitter()
        self.error_body = bytearray()
        self.usage: dict[str, Any] | None = None
        self.last_choice = 0.0
        self.end = 0.0

    def head(self, resp: Response) -> None:
        self.status = resp.status

    def body(self, data: bytes, now: float) -> bool:
        if self.status != 200:
            self.error_body += data
            return len(self.error_body) >= MAX_ERROR_BODY
        out = self.out
        for raw in self.sse.feed(data) if data else self.sse.flush():
            if raw[-1:] != b"}" and raw.strip() == b"[DONE]":
                self.end = now
                return True
            event = loads(raw)
            if "error" in event:
                text = raw.decode(errors="replace").strip()
                raise RuntimeError(f"in-stream error: {text[:300]}")
            if event.get("usage"):
                self.usage = event["usage"]
            if event.get("choices"):
                self.last_choice = now
            if chunk_text(event):
                if not out.chunk_times:
                    out.ttft = now - out.start
                out.chunk_times.append(now)
        if not data:
            self.end = now
        return not data


async def stream_one(
    client: HTTPClient, path: str, payload: dict[str, Any], timeout: float
) -> Outcome:
    """POST ``payload`` with ``stream: true`` and time every content chunk.

    Events are timed when their bytes arrive. Never raises for request trouble: a failure
    is an ``Outcome`` with ``ok=False`` so one bad request cannot end a run.
    """
    out = Outcome(start=time.perf_counter())
    sink = _SSESink(out)
    try:
        body = dumps(payload)
        with trio.fail_after(timeout):
            await client.post(path, body, sink)
        out.end = sink.end or time.perf_counter()
        if sink.status != 200:
            text = sink.error_body.decode(errors="replace")
            raise RuntimeError(f"HTTP {sink.status}: {text[:300]}")
        last_choice, usage = sink.last_choice, sink.usage
        if usage is not None:
            out.prompt_tokens = usage.get("prompt_tokens")
            out.output_tokens = int(usage.get("completion_tokens") or 0)
        if not out.chunk_times:
            # Tokens that all decode to "" (a random model emitting special tokens): the
            # user saw nothing until the last chunk, so that is the first "token".
            if not (last_choice and out.output_tokens):
                raise RuntimeError("stream ended without any generated tokens")
            out.chunk_times.append(last_choice)
            out.ttft = last_choice - out.start
        if not out.output_tokens:  # no usage chunk: one token per chunk is the best guess
            out.output_tokens = len(out.chunk_times)
        out.ok = True
    except trio.TooSlowError:
        out.error = f"timeout after {timeout:g} s"
    except Exception as exc:  # any failure is counted, none ends the run
        out.error = f"{type(exc).__name__}: {exc}"[:400]
    if not out.end:
        out.end = time.perf_counter()
    return out

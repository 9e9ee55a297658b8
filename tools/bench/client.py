"""One streamed request, timed on the client the way a user would feel it."""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio


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
        t = self.chunk_times
        return [b - a for a, b in itertools.pairwise(t)]

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


async def stream_one(
    client: httpx.AsyncClient, path: str, payload: dict[str, Any], timeout: float
) -> Outcome:
    """POST ``payload`` with ``stream: true`` and time every content chunk.

    Never raises for request trouble: a failure is an ``Outcome`` with ``ok=False`` so one
    bad request cannot end a run.
    """
    out = Outcome(start=time.perf_counter())
    usage: dict[str, Any] | None = None
    last_choice = 0.0
    try:
        with trio.fail_after(timeout):
            async with client.stream("POST", path, json=payload) as resp:
                if resp.status_code != 200:
                    body = (await resp.aread()).decode(errors="replace")
                    raise RuntimeError(f"HTTP {resp.status_code}: {body[:300]}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        raise RuntimeError(f"in-stream error: {json.dumps(event)[:300]}")
                    if event.get("usage"):
                        usage = event["usage"]
                    if event.get("choices"):
                        last_choice = time.perf_counter()
                    if chunk_text(event):
                        if not out.chunk_times:
                            out.ttft = last_choice - out.start
                        out.chunk_times.append(last_choice)
        out.end = time.perf_counter()
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

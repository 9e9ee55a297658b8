"""Split a Qwen3 chat completion into reasoning, content and tool calls, as text streams in.

One state machine serves both modes: the non-streaming route feeds the whole text at once,
the streaming route feeds deltas; both therefore produce the very same calls and text. Tags
may arrive split across deltas at any character: a suffix that could still become a tag is
held back until the next delta (or the end) decides.

    <think> reasoning </think> content <tool_call>\\n{"name": .., "arguments": {..}}\\n</tool_call>
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Callable
from typing import Any

import attrs

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
#: The tags this parser reads: decoded even where a checkpoint calls them special tokens.
MARKERS = (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE)


@attrs.frozen
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI's API carries it


@attrs.frozen
class Event:
    kind: str  # "reasoning" | "content" | "tool_call"
    text: str = ""
    call: ToolCall | None = None


class _State(enum.Enum):
    START = "start"  # nothing decided: the output may open with <think>
    REASONING = "reasoning"
    CONTENT = "content"
    CALL = "call"  # inside <tool_call> ... </tool_call>


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ChatOutputParser:
    def __init__(self, *, reasoning: bool = True, tools: bool = False,
                 call_id: Callable[[], str] | None = None) -> None:
        self._tools = tools
        self._call_id = call_id or _new_call_id
        self._state = _State.START if reasoning else _State.CONTENT
        self._buf = ""
        self._after_tag = False  # strip the newlines that follow </think> or </tool_call>
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        return self._drain(final=True)

    def _drain(self, *, final: bool) -> list[Event]:
        out: list[Event] = []
        while True:
            before = (self._state, len(self._buf))
            self._step(out, final)
            if (self._state, len(self._buf)) == before:
                return [e for e in out if e.text or e.call]

    def _step(self, out: list[Event], final: bool) -> None:
        buf = self._buf
        if self._after_tag:
            stripped = buf.lstrip("\n")
            if not stripped and not final:
                self._buf = ""
                return
            self._buf, buf, self._after_tag = stripped, stripped, False
        if self._state is _State.START:
            if buf.startswith(THINK_OPEN):
                self._buf, self._state = buf[len(THINK_OPEN):], _State.REASONING
            elif final or not THINK_OPEN.startswith(buf):
                self._state = _State.CONTENT
        elif self._state is _State.REASONING:
            end = buf.find(THINK_CLOSE)
            if end != -1:
                out.append(Event("reasoning", buf[:end]))
                self._buf, self._state = buf[end + len(THINK_CLOSE):], _State.CONTENT
                self._after_tag = True
            else:
                keep = 0 if final else _partial_suffix(buf, THINK_CLOSE)
                out.append(Event("reasoning", buf[: len(buf) - keep]))
                self._buf = buf[len(buf) - keep:]
        elif self._state is _State.CONTENT:
            start = buf.find(CALL_OPEN) if self._tools else -1
            if start != -1:
                out.append(Event("content", buf[:start]))
                self._buf, self._state = buf[start:], _State.CALL
            else:
                keep = 0 if final or not self._tools else _partial_suffix(buf, CALL_OPEN)
                out.append(Event("content", buf[: len(buf) - keep]))
                self._buf = buf[len(buf) - keep:]
        elif self._state is _State.CALL:
            end = buf.find(CALL_CLOSE)
            if end == -1:
                if final:  # an unterminated call is not a call: hand the text back
                    out.append(Event("content", buf))
                    self._buf = ""
                return
            raw = buf[: end + len(CALL_CLOSE)]
            self._buf, self._state = buf[end + len(CALL_CLOSE):], _State.CONTENT
            call = self._parse_call(raw[len(CALL_OPEN): -len(CALL_CLOSE)])
            if call is None:
                out.append(Event("content", raw))
            else:
                self.calls.append(call)
                out.append(Event("tool_call", call=call))
                self._after_tag = True

    def _parse_call(self, body: str) -> ToolCall | None:
        try:
            obj: Any = json.loads(body)
        except json.JSONDecodeError:
            return None
        return call_from_json(obj, self._call_id)


def call_from_json(obj: Any, call_id: Callable[[], str]) -> ToolCall | None:
    """A call from ``{"name": .., "arguments" | "parameters": {..}}`` (an id from ``call_id``),
    or None when the object is no call; arguments already JSON-encoded as a string, as some
    models send them, are accepted."""
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str) and obj["name"]):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(id=call_id(), name=obj["name"], arguments=json.dumps(args, ensure_ascii=False))


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_all(text: str, *, reasoning: bool, tools: bool) -> tuple[str | None, str, list[ToolCall]]:
    """(reasoning, content, calls) of a whole completion, exactly as streaming would give."""
    parser = ChatOutputParser(reasoning=reasoning, tools=tools)
    events = parser.feed(text) + parser.finish()
    thought = "".join(e.text for e in events if e.kind == "reasoning")
    content = "".join(e.text for e in events if e.kind == "content")
    had_think = any(e.kind == "reasoning" for e in events) or text.startswith(THINK_OPEN)
    return (thought if had_think else None), content, parser.calls

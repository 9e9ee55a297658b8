"""Llama 3.1/3.2/3.3 JSON calls: the whole assistant message is the call,
``{"name": "...", "parameters": {...}}`` (``"arguments"`` is read too), optionally after
``<|python_tag|>``. Several calls are read separated by ``;`` (as some servers accept), but
forced calls are one: the official template refuses an assistant turn of several calls.

A message that does not open with ``{`` or ``<|python_tag|>`` (leading whitespace aside) is
content from its first character, streamed as it comes; one that does is held until its
JSON closes. Text that is not a call (JSON that is no call, JSON that never closes, text
after the calls) is content, so no text is ever lost.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from typing import Any

import attrs

from izh_trio.frontend.chat_parser import Event, call_from_json
from izh_trio.frontend.structured import tool_call_schema
from izh_trio.frontend.tool_formats.base import JsonCallParser, OutputParser, ToolFormat

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


class _State(enum.Enum):
    START = "start"  # nothing decided: a call, or content
    CALL = "call"  # a call's JSON object is expected (or is arriving)
    AFTER = "after"  # after a call: ";" and another, or the end
    CONTENT = "content"  # the rest is content


class Llama3JsonParser(JsonCallParser):
    def __init__(self, *, tools: bool, call_id: Callable[[], str]) -> None:
        super().__init__(call_id)
        self._state = _State.START if tools else _State.CONTENT

    def _content(self, out: list[Event]) -> bool:
        out.append(Event("content", self._buf))
        self._buf, self._state = "", _State.CONTENT
        return False

    def _step(self, out: list[Event], final: bool) -> bool:
        """One move of the machine; False once it must wait for more text (or is done)."""
        text = self._buf.lstrip()
        if self._state is _State.CONTENT:
            if self._buf:
                out.append(Event("content", self._buf))
                self._buf = ""
            return False
        if self._state is _State.START:
            if text.startswith(PYTHON_TAG):
                self._buf, self._state, self._closed = text[len(PYTHON_TAG):], _State.CALL, True
                return True
            if text.startswith("{"):
                self._state, self._closed = _State.CALL, True
                return True
            if not final and (not text or PYTHON_TAG.startswith(text)):
                return False  # whitespace, or what may yet become the tag
            self._state = _State.CONTENT
            return True
        if self._state is _State.AFTER:
            if not text:
                if final:
                    self._buf = ""
                return False
            if text.startswith(";"):
                self._buf, self._state, self._closed = text[1:], _State.CALL, True
                return True
            self._state = _State.CONTENT  # text after the calls
            return True
        # _State.CALL
        if not text:
            if final:
                self._buf = ""  # a trailing ";" or a bare tag: no call, nothing to say
            return False
        if not (final or self._closed):
            return False  # no "}" since the last try: the object cannot have closed
        try:
            obj, end = _DECODER.raw_decode(text)
        except json.JSONDecodeError:
            self._closed = False
            return self._content(out) if final or not text.startswith("{") else False
        call = call_from_json(obj, self._call_id)
        if call is None:
            return self._content(out)
        self.calls.append(call)
        out.append(Event("tool_call", call=call))
        self._buf, self._state = text[end:], _State.AFTER
        return True


@attrs.frozen
class Llama3Json(ToolFormat):
    name: str = "llama3_json"
    reasoning: bool = False
    parallel_calls: bool = False

    @property
    def markers(self) -> tuple[str, ...]:
        return (PYTHON_TAG,)

    def parser(self, *, tools: bool) -> OutputParser:
        return Llama3JsonParser(tools=tools, call_id=self.call_id)

    def grammar(self, tools: list[dict[str, Any]], *, only: str | None, parallel: bool,
                or_json: dict[str, Any] | bool | None = None, param: str = "tools") -> str:
        """One call, exactly as the template writes one back (compact JSON). A JSON answer
        beside it is one more alternative of the same object: an object that is not a call
        is content, as the parser reads it."""
        schema = tool_call_schema(tools, only=only, param=param, args_key="parameters",
                                  or_json=or_json, embed_answer=True)
        del parallel  # see parallel_calls
        return f"start: %json {json.dumps(schema)}\n"

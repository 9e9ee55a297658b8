"""Mistral's calls (v0.3 / v7-tokenizer era, the official Mistral-7B-Instruct-v0.3
template): ``[TOOL_CALLS]`` and a JSON list ``[{"name": "...", "arguments": {...}}, ...]``.
Text before the marker is content. Call ids are 9 characters of ``[A-Za-z0-9]``: the
template refuses any other id when the call and its result come back in a later turn."""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from typing import Any

import attrs

from izh_trio.frontend.chat_parser import Event, _partial_suffix, call_from_json
from izh_trio.frontend.structured import json_answer, tool_call_schema
from izh_trio.frontend.tool_formats.base import (
    JsonCallParser,
    OutputParser,
    ToolFormat,
    alnum_call_id,
    alnum_id_of,
)

TOOL_CALLS = "[TOOL_CALLS]"
_DECODER = json.JSONDecoder()


class _State(enum.Enum):
    CONTENT = "content"
    CALLS = "calls"  # after [TOOL_CALLS]: the list is expected (or is arriving)


class MistralParser(JsonCallParser):
    CLOSERS = "]}"

    def __init__(self, *, tools: bool, call_id: Callable[[], str]) -> None:
        super().__init__(call_id)
        self._tools = tools
        self._state = _State.CONTENT

    def _step(self, out: list[Event], final: bool) -> bool:
        buf = self._buf
        if self._state is _State.CONTENT:
            start = buf.find(TOOL_CALLS) if self._tools else -1
            if start != -1:
                out.append(Event("content", buf[:start]))
                self._buf, self._state, self._closed = buf[start:], _State.CALLS, True
                return True
            keep = 0 if final or not self._tools else _partial_suffix(buf, TOOL_CALLS)
            out.append(Event("content", buf[: len(buf) - keep]))
            self._buf = buf[len(buf) - keep:]
            return False
        # _State.CALLS: self._buf starts with the marker
        body = buf[len(TOOL_CALLS):].lstrip()
        if not (final or self._closed):
            return False
        try:
            obj, end = _DECODER.raw_decode(body)
        except json.JSONDecodeError:
            self._closed = False
            if final or (body and body[0] not in "[{"):  # never a call: hand the text back
                out.append(Event("content", buf))
                self._buf, self._state = "", _State.CONTENT
            return False
        items = obj if isinstance(obj, list) else [obj]
        calls = [call_from_json(item, self._call_id) for item in items]
        rest = body[end:]
        if not items or None in calls:
            out.append(Event("content", buf[: len(buf) - len(rest)]))
        else:
            for call in calls:
                assert call is not None
                self.calls.append(call)
                out.append(Event("tool_call", call=call))
            rest = rest.lstrip()  # the separator the template leaves before </s>
        self._buf, self._state = rest, _State.CONTENT
        return True


@attrs.frozen
class Mistral(ToolFormat):
    name: str = "mistral"
    reasoning: bool = False
    #: The marker's token id, where it is one token: the grammar names the token itself,
    #: as the model writes it (its text would be spelled in other tokens).
    marker_id: int | None = None

    @property
    def markers(self) -> tuple[str, ...]:
        return (TOOL_CALLS,)

    def parser(self, *, tools: bool) -> OutputParser:
        return MistralParser(tools=tools, call_id=self.call_id)

    def call_id(self) -> str:
        return alnum_call_id()

    def history_id(self, call_id: str) -> str:
        return alnum_id_of(call_id)

    def grammar(self, tools: list[dict[str, Any]], *, only: str | None, parallel: bool,
                or_json: dict[str, Any] | bool | None = None, param: str = "tools") -> str:
        """``[TOOL_CALLS][{call}, {call}]``: the list as the template writes it back."""
        schema = tool_call_schema(tools, only=only, param=param, or_json=or_json,
                                  embed_answer=False)
        marker = f"<[{self.marker_id}]>" if self.marker_id is not None else json.dumps(TOOL_CALLS)
        items = 'call (", " call)*' if parallel else "call"
        start = f'start: calls\ncalls: {marker} "[" {items} "]"'
        if or_json is not None and or_json is not False:  # (false admits no answer at all)
            start = f"start: calls | answer\n{json_answer(or_json)}\n" \
                    f'calls: {marker} "[" {items} "]"'
        return f"{start}\ncall: %json {json.dumps(schema)}\n"

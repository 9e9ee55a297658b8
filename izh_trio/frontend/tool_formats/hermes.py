"""Hermes-style calls (Qwen2.5, Qwen3): ``<tool_call>\\n{"name": .., "arguments": {..}}\\n
</tool_call>``, parsed by ``chat_parser``; ``<think>`` reasoning only where the template has it
(Qwen3), not for Qwen2.5."""

from __future__ import annotations

from typing import Any

import attrs

from izh_trio.frontend.chat_parser import MARKERS, ChatOutputParser
from izh_trio.frontend.structured import tool_call_grammar
from izh_trio.frontend.tool_formats.base import OutputParser, ToolFormat


@attrs.frozen
class Hermes(ToolFormat):
    name: str = "hermes"
    reasoning: bool = True

    @property
    def markers(self) -> tuple[str, ...]:
        return MARKERS

    def parser(self, *, tools: bool) -> OutputParser:
        return ChatOutputParser(reasoning=self.reasoning, tools=tools, call_id=self.call_id)

    def grammar(self, tools: list[dict[str, Any]], *, only: str | None, parallel: bool,
                or_json: dict[str, Any] | bool | None = None, param: str = "tools") -> str:
        return tool_call_grammar(tools, only=only, parallel=parallel, or_json=or_json,
                                 param=param)

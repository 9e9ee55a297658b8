"""A message's content blocks, built from the chat parser's events as they come, and the
stream events that build them: the non-streamed answer is the stream's events applied, so the
two are the same message by construction.

Reasoning is a ``thinking`` block, content a ``text`` block, each call a ``tool_use`` block
(its input sent whole, as one ``input_json_delta``). A kind change closes the open block.
Blank text that would open a text block is held until text that is not blank follows (then
it opens the block with it): the blank lines around calls make no text blocks of their own.
Thinking asked with ``display: "omitted"`` opens and closes its blocks, empty.
"""

from __future__ import annotations

import json
from typing import Any

from izh_trio.frontend.chat_parser import Event

#: A stream event: its type (the SSE ``event:``) and its data.
StreamEvent = tuple[str, dict[str, Any]]
_DELTAS = {"thinking": ("thinking_delta", "thinking"), "text": ("text_delta", "text")}


def tool_use_id(call_id: str) -> str:
    """An Anthropic-style id for a call the parser named ``call_<hex>``."""
    return "toolu_" + call_id.rpartition("_")[2]


class Blocks:
    """The content blocks so far (``content``), fed the parser's events in order."""

    def __init__(self, *, show_thinking: bool = True) -> None:
        self.content: list[dict[str, Any]] = []
        self._show_thinking = show_thinking  # False: thinking blocks come back empty
        self._open: str | None = None  # the kind of the block still taking deltas
        self._blank = ""  # blank text not yet in a block

    def feed(self, event: Event) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if event.call is not None:
            self._blank = ""  # blank lines before a call are no text
            self._close(out)
            call = event.call
            start = {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name,
                     "input": {}}
            self._start(start, out)
            out.append(self._delta({"type": "input_json_delta",
                                    "partial_json": call.arguments}))
            self.content[-1]["input"] = json.loads(call.arguments)
            self._close(out)
            return out
        kind = "thinking" if event.kind == "reasoning" else "text"
        text = event.text
        if self._open != kind:
            if kind == "text":
                text, self._blank = self._blank + text, ""
                if not text.strip():  # held: it may only separate blocks
                    self._blank = text
                    return out
            self._close(out)
            self._start({"type": "thinking", "thinking": "", "signature": ""}
                        if kind == "thinking" else {"type": "text", "text": ""}, out)
        if kind == "thinking" and not self._show_thinking:
            return out
        delta_type, key = _DELTAS[kind]
        self.content[-1][key] += text
        out.append(self._delta({"type": delta_type, key: text}))
        return out

    def finish(self) -> list[StreamEvent]:
        """Close the open block; blank text held at the end is a text block of its own only
        when the answer has nothing else (an answer of blank lines is still that)."""
        out: list[StreamEvent] = []
        self._close(out)
        if self._blank and not self.content:
            self._start({"type": "text", "text": ""}, out)
            self.content[-1]["text"] = self._blank
            out.append(self._delta({"type": "text_delta", "text": self._blank}))
            self._close(out)
        self._blank = ""
        return out

    def _start(self, block: dict[str, Any], out: list[StreamEvent]) -> None:
        out.append(("content_block_start", {"type": "content_block_start",
                                            "index": len(self.content),
                                            "content_block": dict(block)}))
        self.content.append(block)
        self._open = block["type"]

    def _delta(self, delta: dict[str, Any]) -> StreamEvent:
        return ("content_block_delta", {"type": "content_block_delta",
                                        "index": len(self.content) - 1, "delta": delta})

    def _close(self, out: list[StreamEvent]) -> None:
        if self._open is not None:
            out.append(("content_block_stop", {"type": "content_block_stop",
                                               "index": len(self.content) - 1}))
            self._open = None

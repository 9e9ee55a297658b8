"""A message's answer: the choice's output parsed into thinking, text and tool calls
(``chat_parser``), built into content blocks (``blocks``), said as Anthropic's ``message`` or
as its stream of events.

A stream opens with ``message_start`` once the first output is in, so that its usage says
how much of the prompt the prefix cache held (``cache_read_input_tokens``); ``ping`` events
keep a quiet stream alive meanwhile (the pipeline's keepalive).
"""

from __future__ import annotations

from typing import Any

from izh_trio.frontend import sse
from izh_trio.frontend.chat_parser import THINK_OPEN
from izh_trio.frontend.chat_tools import ToolPlan
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import ChoiceDelta, ChoiceSpec
from izh_trio.frontend.messages.blocks import Blocks, StreamEvent
from izh_trio.frontend.messages.errors import anthropic_error
from izh_trio.frontend.serving.api import Head, Keepalive, Tally

PING = sse.typed("ping", {"type": "ping"})
#: A ping after this long without an event (Anthropic's streams ping while they think).
KEEPALIVE = Keepalive(interval=10.0, event=PING)


class MessagesOutput:
    def __init__(self, head: Head, spec: ChoiceSpec, plan: ToolPlan, *,
                 show_thinking: bool = True, opened: bool = False) -> None:
        self._head = head
        self._tally = Tally([spec])
        self._parser = plan.parser()
        if opened:  # the prompt opened the think block: the output starts inside it
            self._parser.feed(THINK_OPEN)
        self._blocks = Blocks(show_thinking=show_thinking)
        self._finish: str | None = None
        self._stop: str | int | None = None
        self._started = False

    # --- the answer as it accumulates -------------------------------------------------------

    def _fold(self, delta: ChoiceDelta) -> list[StreamEvent]:
        self._tally.add(delta)
        events = self._parser.feed(delta.text)
        if delta.finish_reason is not None:
            events += self._parser.finish()
            self._finish, self._stop = delta.finish_reason, delta.stop_reason
        out = [e for event in events for e in self._blocks.feed(event)]
        if delta.finish_reason is not None:
            out += self._blocks.finish()
        return out

    def _stop_fields(self) -> dict[str, Any]:
        if self._finish == "length":
            return {"stop_reason": "max_tokens", "stop_sequence": None}
        if any(block["type"] == "tool_use" for block in self._blocks.content):
            return {"stop_reason": "tool_use", "stop_sequence": None}
        if isinstance(self._stop, str):
            return {"stop_reason": "stop_sequence", "stop_sequence": self._stop}
        return {"stop_reason": "end_turn", "stop_sequence": None}

    def _usage(self) -> dict[str, Any]:
        """Anthropic's counts: ``input_tokens`` is the prompt beyond what the cache held."""
        cached = self._tally.cached_tokens
        return {"input_tokens": self._tally.prompt_tokens - cached,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
                "output_tokens": self._tally.completion_tokens}

    def _message(self, content: list[dict[str, Any]], stop: dict[str, Any]) -> dict[str, Any]:
        return {"id": self._head.id, "type": "message", "role": "assistant",
                "model": self._head.model, "content": content, **stop,
                "usage": self._usage()}

    # --- Output: a whole message ------------------------------------------------------------

    def add(self, delta: ChoiceDelta) -> None:
        self._fold(delta)

    def body(self) -> dict[str, Any]:
        return self._message(self._blocks.content, self._stop_fields())

    # --- Output: a stream -------------------------------------------------------------------

    def opening(self, events: list[bytes]) -> None:
        pass  # message_start waits for the first output: its usage counts the cache hits

    def _start(self, events: list[bytes]) -> None:
        if not self._started:
            self._started = True
            start = self._message([], {"stop_reason": None, "stop_sequence": None})
            events.append(sse.typed("message_start", {"type": "message_start",
                                                      "message": start}))
            events.append(PING)

    def stream(self, delta: ChoiceDelta, events: list[bytes]) -> None:
        parsed = self._fold(delta)  # first: the start's usage counts this delta's cache hits
        self._start(events)
        events.extend(sse.typed(kind, data) for kind, data in parsed)

    def closing(self, events: list[bytes]) -> None:
        self._start(events)
        events.extend(sse.typed(kind, data) for kind, data in self._blocks.finish())
        events.append(sse.typed("message_delta", {"type": "message_delta",
                                                  "delta": self._stop_fields(),
                                                  "usage": self._usage()}))
        events.append(sse.typed("message_stop", {"type": "message_stop"}))

    def failing(self, error: APIError, events: list[bytes]) -> None:
        events.append(sse.typed("error", anthropic_error(error.status, error.message)))

"""A response's output items, built as the generation's text is parsed, and the stream events
that say each step of them.

Chat's parser (``chat_parser``) splits the text into reasoning, content and calls; here each
run of reasoning becomes a ``reasoning`` item, each run of content a ``message`` item, each
call a ``function_call`` item, in the order they come. A streamed response and a plain one
fold the same deltas through the same :class:`OutputItems` (a plain one drops the events),
so both end with the very same items.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable
from typing import Any

import attrs

from izh_trio.frontend.chat_parser import Event, ToolCall
from izh_trio.frontend.chat_tools import ToolPlan
from izh_trio.frontend.generation import ChoiceDelta
from izh_trio.frontend.openai_shapes import TokenText, chat_logprobs

Emit = Callable[[dict[str, Any]], None]


class ItemStatus(enum.Enum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"


def _fresh(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


@attrs.define
class Item:
    """One output item as it accumulates."""

    kind: str  # "reasoning" | "message" | "function_call"
    index: int  # its output_index
    id: str
    call: ToolCall | None = None
    text: list[str] = attrs.Factory(list)
    logprobs: list[dict[str, Any]] = attrs.Factory(list)
    status: ItemStatus = ItemStatus.IN_PROGRESS

    def end(self, status: ItemStatus) -> None:
        """An item ends once; only one in progress may end."""
        if self.status is not ItemStatus.IN_PROGRESS or status is ItemStatus.IN_PROGRESS:
            raise RuntimeError(f"item {self.id}: {self.status.value} -> {status.value}")
        self.status = status

    def part(self) -> dict[str, Any]:
        text = "".join(self.text)
        if self.kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [],
                "logprobs": self.logprobs}

    def json(self, *, parts: bool = True) -> dict[str, Any]:
        """The item as a response carries it; ``parts``: with its content (not when added)."""
        status = self.status.value
        if self.kind == "function_call":
            assert self.call is not None
            return {"id": self.id, "type": "function_call", "status": status,
                    "call_id": self.call.id, "name": self.call.name,
                    "arguments": self.call.arguments if parts else ""}
        content = [self.part()] if parts else []
        if self.kind == "reasoning":
            return {"id": self.id, "type": "reasoning", "status": status, "summary": [],
                    "content": content}
        return {"id": self.id, "type": "message", "role": "assistant", "status": status,
                "content": content}


class ReasoningTokens:
    """How many output tokens were reasoning: those from an opening ``<think>`` token to its
    closing ``</think>`` token, both included."""

    def __init__(self, think: int | None, unthink: int | None) -> None:
        self._think, self._unthink = think, unthink
        self._inside: bool | None = None  # None: the first token has not come
        self.count = 0

    def take(self, token_ids: list[int]) -> int:
        """Read the next tokens; how many of them (the first ones) are reasoning."""
        n = 0
        for token in token_ids:
            if self._inside is None:
                self._inside = token == self._think and self._think is not None
            if not self._inside:
                break
            n += 1
            self._inside = token != self._unthink
        self.count += n
        return n


class OutputItems:
    """The items of one generation, each event of their building said to ``emit``."""

    def __init__(self, plan: ToolPlan, reasoning: ReasoningTokens, text_of: TokenText | None,
                 emit: Emit) -> None:
        self.items: list[Item] = []
        self.reasoning = reasoning
        self._parser = plan.parser()
        self._text_of = text_of  # None: no logprobs asked for
        self._pending: list[dict[str, Any]] = []  # logprobs of text not yet said
        self._emit = emit

    @property
    def _open(self) -> Item | None:
        last = self.items[-1] if self.items else None
        return last if last is not None and last.status is ItemStatus.IN_PROGRESS else None

    def fold(self, delta: ChoiceDelta) -> None:
        thought = self.reasoning.take(delta.token_ids)
        if self._text_of is not None and delta.logprobs:
            self._pending += chat_logprobs(self._text_of, delta.logprobs[thought:])
        events = self._parser.feed(delta.text)
        if delta.finish_reason is not None:
            events += self._parser.finish()
        for event in events:
            self._take(event)
        if delta.finish_reason is not None:
            open_item = self._open
            if open_item is not None and open_item.kind == "message" and self._pending:
                self._say_text(open_item, "")  # tokens whose text was held back
            self.close(ItemStatus.INCOMPLETE if delta.finish_reason == "length"
                       else ItemStatus.COMPLETED)

    def _take(self, event: Event) -> None:
        if event.call is not None:
            self.close(ItemStatus.COMPLETED)
            self._pending = []  # the call's own tokens: no text of a message
            item = self._add("function_call", "fc_", event.call)
            arguments = event.call.arguments
            self._emit(self._about(item, "response.function_call_arguments.delta",
                                   delta=arguments))
            self._emit(self._about(item, "response.function_call_arguments.done",
                                   arguments=arguments, name=event.call.name))
            self._end(item, ItemStatus.COMPLETED)
            return
        kind = "reasoning" if event.kind == "reasoning" else "message"
        open_item = self._open
        if open_item is None or open_item.kind != kind:
            self.close(ItemStatus.COMPLETED)
            open_item = self._add(kind, "rs_" if kind == "reasoning" else "msg_")
        item = open_item
        if kind == "reasoning":
            item.text.append(event.text)
            self._emit(self._about(item, "response.reasoning_text.delta", content_index=0,
                                   delta=event.text))
        else:
            self._say_text(item, event.text)

    def _say_text(self, item: Item, text: str) -> None:
        logprobs, self._pending = self._pending, []
        item.text.append(text)
        item.logprobs += logprobs
        self._emit(self._about(item, "response.output_text.delta", content_index=0,
                               delta=text, logprobs=logprobs))

    def _add(self, kind: str, prefix: str, call: ToolCall | None = None) -> Item:
        item = Item(kind, len(self.items), _fresh(prefix), call)
        self.items.append(item)
        self._emit({"type": "response.output_item.added", "output_index": item.index,
                    "item": item.json(parts=False)})
        if kind != "function_call":
            self._emit(self._about(item, "response.content_part.added", content_index=0,
                                   part={**item.part(), "text": ""}))
        return item

    def close(self, status: ItemStatus) -> None:
        """End the item in progress, if any, saying its last events."""
        item = self._open
        if item is None:
            return
        text = "".join(item.text)
        if item.kind == "reasoning":
            self._emit(self._about(item, "response.reasoning_text.done", content_index=0,
                                   text=text))
        else:
            self._emit(self._about(item, "response.output_text.done", content_index=0,
                                   text=text, logprobs=item.logprobs))
        self._end(item, status)

    def _end(self, item: Item, status: ItemStatus) -> None:
        item.end(status)
        if item.kind != "function_call":
            self._emit(self._about(item, "response.content_part.done", content_index=0,
                                   part=item.part()))
        self._emit({"type": "response.output_item.done", "output_index": item.index,
                    "item": item.json()})

    def abandon(self) -> None:
        """The generation failed: the item in progress ends incomplete, without events."""
        item = self._open
        if item is not None:
            item.end(ItemStatus.INCOMPLETE)

    @staticmethod
    def _about(item: Item, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "item_id": item.id, "output_index": item.index, **fields}

    def json(self) -> list[dict[str, Any]]:
        return [item.json() for item in self.items]

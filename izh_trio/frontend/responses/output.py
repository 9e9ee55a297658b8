"""A response's answer (the serving pipeline's ``Output``): OpenAI's ``response`` object, or
its stream of typed events.

A stream says ``response.created`` and ``response.in_progress``, then each item's events
(``output_items``), then exactly one terminal event: ``response.completed``,
``response.incomplete`` (the output hit ``max_output_tokens``) or ``response.failed`` (the
engine failed, or the server drained, once the stream had begun). Every event carries its
``type`` in an ``event:`` line and in its data, and a ``sequence_number`` one above the last;
OpenAI's Responses stream ends with its terminal event, without ``[DONE]``.
"""

from __future__ import annotations

import enum
import time
from typing import Any

import attrs

from izh_trio.frontend import sse
from izh_trio.frontend.chat_tools import ToolPlan
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import ChoiceDelta, ChoiceSpec
from izh_trio.frontend.openai_shapes import TokenText
from izh_trio.frontend.responses.output_items import OutputItems, ReasoningTokens
from izh_trio.frontend.serving.api import Head, Tally


class ResponseStatus(enum.Enum):
    QUEUED = "queued"  # a background response not yet begun
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: A finished response may still fail: its stream broke before its end was said.
_NEXT = {
    ResponseStatus.QUEUED: {ResponseStatus.IN_PROGRESS, ResponseStatus.FAILED,
                            ResponseStatus.CANCELLED},
    ResponseStatus.IN_PROGRESS: {ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE,
                                 ResponseStatus.FAILED, ResponseStatus.CANCELLED},
    ResponseStatus.COMPLETED: {ResponseStatus.FAILED},
    ResponseStatus.INCOMPLETE: {ResponseStatus.FAILED},
    ResponseStatus.FAILED: set(),
    ResponseStatus.CANCELLED: set(),
}
RUNNING = (ResponseStatus.QUEUED, ResponseStatus.IN_PROGRESS)
#: An error's status as the codes a response's ``error`` may carry.
_ERROR_CODES = {400: "invalid_prompt", 429: "rate_limit_exceeded"}


@attrs.define
class _Events:
    """Where a response's events go, numbered. Apart from the response: its items say their
    events here, and a bound method of the response would make each one a reference cycle."""

    #: Every event said, for a background response's store; None: not kept.
    log: list[dict[str, Any]] | None
    sink: list[bytes] | None = None  # None: a plain answer, no events
    sequence: int = 0

    def emit(self, event: dict[str, Any]) -> None:
        if self.sink is None:
            return
        event = {"type": event["type"], "sequence_number": self.sequence, **event}
        self.sequence += 1
        self.sink.append(sse.typed(event["type"], event))
        if self.log is not None:
            self.log.append(event)


class ResponsesOutput:
    def __init__(self, head: Head, response_id: str, spec: ChoiceSpec, plan: ToolPlan,
                 echo: dict[str, Any], *, reasoning: ReasoningTokens,
                 logprobs: TokenText | None, background: bool = False) -> None:
        self.tally = Tally([spec])
        self.status = ResponseStatus.QUEUED if background else ResponseStatus.IN_PROGRESS
        self.id = response_id
        self.background = background
        #: Every event said so far, as objects, for a background response's store
        #: (taken and cleared by its runner); None: not kept.
        self.log: list[dict[str, Any]] | None = [] if background else None
        self.created = head.created
        self._head = head
        self._id = response_id
        self._echo = echo  # the request's settings, as every response object repeats them
        self._error: dict[str, Any] | None = None
        self._completed_at: int | None = None
        self._events = _Events(self.log)
        self._emit = self._events.emit
        self.items = OutputItems(plan, reasoning, logprobs, self._emit)

    def _move(self, status: ResponseStatus) -> None:
        if status not in _NEXT[self.status]:
            raise RuntimeError(f"response {self._id}: {self.status.value} -> {status.value}")
        self.status = status

    def add(self, delta: ChoiceDelta) -> None:
        self.items.fold(delta)
        self.tally.add(delta)
        if delta.finish_reason is not None:
            self._move(ResponseStatus.INCOMPLETE if delta.finish_reason == "length"
                       else ResponseStatus.COMPLETED)
            if self.status is ResponseStatus.COMPLETED:
                self._completed_at = int(time.time())

    def body(self) -> dict[str, Any]:
        return self.response()

    def opening(self, events: list[bytes]) -> None:
        self._events.sink = events
        if self.status is ResponseStatus.QUEUED:  # created, and said so, already
            self._move(ResponseStatus.IN_PROGRESS)
        else:
            self._emit({"type": "response.created", "response": self.response()})
        self._emit({"type": "response.in_progress", "response": self.response()})

    def queued(self, events: list[bytes]) -> None:
        """A background response is created: its first event, said before it begins."""
        self._events.sink = events
        self._emit({"type": "response.created", "response": self.response()})

    def cancel(self) -> None:
        """Cancelled while it ran: the item in progress ends incomplete; no event follows,
        as in OpenAI's streams of a cancelled response."""
        self.items.abandon()
        self._move(ResponseStatus.CANCELLED)

    def stream(self, delta: ChoiceDelta, events: list[bytes]) -> None:
        self._events.sink = events
        self.add(delta)

    def closing(self, events: list[bytes]) -> None:
        self._events.sink = events
        if self.status in RUNNING:  # every choice ends with a finish
            raise RuntimeError("the generation ended without finishing its response")
        self._emit({"type": f"response.{self.status.value}", "response": self.response()})

    def failing(self, error: APIError, events: list[bytes]) -> None:
        self._events.sink = events
        self.items.abandon()
        self._move(ResponseStatus.FAILED)
        self._error = {"code": _ERROR_CODES.get(error.status, "server_error"),
                       "message": error.message}
        self._emit({"type": "response.failed", "response": self.response()})

    def response(self) -> dict[str, Any]:
        """The response object as it stands."""
        done = self.status not in RUNNING
        return {
            "id": self._id, "object": "response", "created_at": self._head.created,
            "status": self.status.value, "background": self.background,
            "completed_at": self._completed_at, "error": self._error,
            "incomplete_details": ({"reason": "max_output_tokens"}
                                   if self.status is ResponseStatus.INCOMPLETE else None),
            "model": self._head.model, **self._echo, "output": self.items.json(),
            "usage": self.usage() if done else None,
        }

    def usage(self) -> dict[str, Any]:
        tally = self.tally
        # Written: the prompt's tokens computed this time, into KV blocks the cache keeps.
        return {"input_tokens": tally.prompt_tokens,
                "input_tokens_details": {
                    "cached_tokens": tally.cached_tokens,
                    "cache_write_tokens": tally.prompt_tokens - tally.cached_tokens},
                "output_tokens": tally.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": self.items.reasoning.count},
                "total_tokens": tally.prompt_tokens + tally.completion_tokens}

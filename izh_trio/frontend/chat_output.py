"""A chat completion's answer: each choice's output parsed into reasoning, content and tool
calls (``chat_parser``), said as OpenAI's ``chat.completion`` or as its chunks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from izh_trio.frontend.chat_parser import Event, ToolCall
from izh_trio.frontend.chat_tools import ToolPlan
from izh_trio.frontend.generation import ChoiceDelta, ChoiceSpec
from izh_trio.frontend.openai_shapes import OpenAIOutput, TokenText, chat_logprobs
from izh_trio.frontend.schemas import StreamOptions
from izh_trio.frontend.serving.api import Head
from izh_trio.frontend.tool_formats import OutputParser
from izh_trio.wire import TokenLogprobs


@attrs.define
class ChatChoice:
    """One choice as it accumulates."""

    plan: ToolPlan
    parser: OutputParser
    reasoning: list[str] = attrs.Factory(list)
    content: list[str] = attrs.Factory(list)
    calls: list[ToolCall] = attrs.Factory(list)
    logprobs: list[TokenLogprobs] = attrs.Factory(list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def fold(self, d: ChoiceDelta) -> list[Event]:
        """Take a delta in; return the parsed events it completed."""
        events = self.parser.feed(d.text)
        if d.finish_reason is not None:
            events += self.parser.finish()
        for e in events:
            if e.call is not None:
                self.calls.append(e.call)
            else:
                (self.reasoning if e.kind == "reasoning" else self.content).append(e.text)
        self.logprobs += d.logprobs or []
        self.finish_reason = d.finish_reason
        if d.finish_reason == "stop" and self.calls:
            self.finish_reason = self.plan.finish_reason
        self.stop_reason = d.stop_reason
        return events

    def message_choice(self, index: int, text_of: TokenText | None) -> dict[str, Any]:
        content = "".join(self.content)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if self.calls and not content.strip() else content,
            **self.plan.message_fields(self.calls),
        }
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        logprobs = {"content": chat_logprobs(text_of, self.logprobs)} if text_of else None
        return {"index": index, "message": message, "logprobs": logprobs,
                "finish_reason": self.finish_reason, "stop_reason": self.stop_reason}


class ChatOutput(OpenAIOutput):
    def __init__(self, head: Head, specs: Sequence[ChoiceSpec], plan: ToolPlan, *,
                 options: StreamOptions | None, logprobs: TokenText | None) -> None:
        super().__init__(head, specs, options, kind="chat.completion",
                         chunk_kind="chat.completion.chunk")
        self._choices = [ChatChoice(plan, plan.parser()) for _ in specs]
        self._text_of = logprobs  # None: the request asked for no logprobs

    def add(self, delta: ChoiceDelta) -> None:
        self._choices[delta.index].fold(delta)
        self.tally.add(delta)

    def choices(self) -> list[dict[str, Any]]:
        return [out.message_choice(i, self._text_of) for i, out in enumerate(self._choices)]

    def stream(self, delta: ChoiceDelta, events: list[bytes]) -> None:
        index = delta.index
        out = self._choices[index]
        if delta.first:  # OpenAI opens every choice with the role
            events.append(self._chunk(index, {"role": "assistant", "content": ""}))
        n_calls = len(out.calls)
        parsed = out.fold(delta)
        self.tally.add(delta)
        lps = ({"content": chat_logprobs(self._text_of, delta.logprobs or [])}
               if self._text_of is not None else None)
        for e in parsed:
            if e.call is not None:
                for call_delta in out.plan.call_deltas(n_calls, e.call):
                    events.append(self._chunk(index, call_delta))
                n_calls += 1
            else:
                key = "content" if e.kind == "content" else "reasoning_content"
                events.append(self._chunk(index, {key: e.text}, lps))
                lps = None
        if lps and lps["content"]:  # tokens whose text is still held back
            events.append(self._chunk(index, {"content": ""}, lps))
        if delta.finish_reason is not None:
            events.append(self._chunk(index, {}, None, out.finish_reason, out.stop_reason))

    def _chunk(self, index: int, delta: dict[str, Any], logprobs: Any = None,
               finish: str | None = None, stop_reason: str | int | None = None) -> bytes:
        return self.chunk({"index": index, "delta": delta, "logprobs": logprobs,
                           "finish_reason": finish, "stop_reason": stop_reason})

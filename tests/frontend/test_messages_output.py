"""What the Messages API makes of a generation's deltas, in the frontend alone: content blocks,
a stream that reassembles to the whole message however the text is cut, stop reasons, usage,
errors and keepalive pings."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from izh_trio.frontend.chat_parser import ChatOutputParser, Event, ToolCall
from izh_trio.frontend.chat_tools import ToolPlan
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import ChoiceDelta, ChoiceSpec
from izh_trio.frontend.messages.blocks import Blocks
from izh_trio.frontend.messages.errors import anthropic_error, anthropic_status
from izh_trio.frontend.messages.output import KEEPALIVE, PING, MessagesOutput
from izh_trio.frontend.serving.api import Head
from izh_trio.frontend.serving.pipeline import _events
from izh_trio.wire import SamplingParams

HEAD = Head("msg_1", 0, "m", "fp_0")
SPEC = ChoiceSpec(0, [1, 2, 3, 4], SamplingParams())
TOOLS = ToolPlan(tools=[{"type": "function", "function": {"name": "f"}}], parse=True,
                 forced=None)
CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'


def _deltas(pieces: list[str], finish: str = "stop", stop: str | int | None = None,
            cached: int = 0) -> list[ChoiceDelta]:
    return [ChoiceDelta(0, text, [], None, None, finish if i == len(pieces) - 1 else None,
                        stop if i == len(pieces) - 1 else None, 4, i + 1, cached,
                        first=i == 0)
            for i, text in enumerate(pieces)]


def _streamed(output: MessagesOutput, deltas: list[ChoiceDelta]) -> list[tuple[str, Any]]:
    raw: list[bytes] = []
    output.opening(raw)
    for delta in deltas:
        output.stream(delta, raw)
    output.closing(raw)
    events = []
    for block in b"".join(raw).decode().split("\n\n"):
        if block:
            kind, data = block.split("\n")
            events.append((kind.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def _reassembled(events: list[tuple[str, Any]]) -> dict[str, Any]:
    """The message a client builds from the events, as Anthropic's SDK does."""
    message: dict[str, Any] = {}
    for kind, data in events:
        if kind == "message_start":
            message = data["message"]
        elif kind == "content_block_start":
            assert data["index"] == len(message["content"])
            message["content"].append(data["content_block"])
        elif kind == "content_block_delta":
            block, delta = message["content"][data["index"]], data["delta"]
            if delta["type"] == "input_json_delta":
                block["_json"] = block.get("_json", "") + delta["partial_json"]
            else:
                key = "text" if delta["type"] == "text_delta" else "thinking"
                block[key] += delta[key]
        elif kind == "content_block_stop":
            block = message["content"][data["index"]]
            if "_json" in block:
                block["input"] = json.loads(block.pop("_json"))
        elif kind == "message_delta":
            message.update(data["delta"])
            message["usage"].update(data["usage"])
    return message


def _whole(deltas: list[ChoiceDelta], plan: ToolPlan = TOOLS, **kw: Any) -> dict[str, Any]:
    output = MessagesOutput(HEAD, SPEC, plan, **kw)
    for delta in deltas:
        output.add(delta)
    return output.body()


TEXTS = ["<think>\nhmm\n</think>\n\nHello there.", f"{CALL}\n{CALL}",
         f"<think>a</think>\n\nLet me call.\n{CALL}\n\nDone.", "\n\n", "plain <tool_c text",
         f"<think>x</think>\n\n\n{CALL}"]


@settings(max_examples=150, deadline=None)
@given(text=st.sampled_from(TEXTS), cuts=st.lists(st.integers(0, 80), max_size=8))
def test_a_stream_reassembles_to_the_whole_message(text: str, cuts: list[int]) -> None:
    points = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    pieces = [text[a:b] for a, b in itertools.pairwise(points)] or [""]
    deltas = _deltas(pieces)
    events = _streamed(MessagesOutput(HEAD, SPEC, TOOLS), deltas)
    kinds = [k for k, _ in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta",
                                                                    "message_stop"]
    assert _ids_dropped(_reassembled(events)) == _ids_dropped(_whole(deltas))


def _ids_dropped(message: dict[str, Any]) -> dict[str, Any]:
    """A message without its calls' ids (fresh for each parse)."""
    for block in message["content"]:
        if block["type"] == "tool_use":
            assert block.pop("id").startswith("toolu_")
    return message


def test_blocks_of_each_kind() -> None:
    body = _whole(_deltas([f"<think>plan</think>\n\nI will call.\n\n{CALL}\n\n"]))
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use"]
    assert body["content"][0] == {"type": "thinking", "thinking": "plan", "signature": ""}
    assert body["content"][1] == {"type": "text", "text": "I will call.\n\n"}
    call = body["content"][2]
    assert call["name"] == "f" and call["input"] == {"x": 1}
    assert call["id"].startswith("toolu_")
    assert body["stop_reason"] == "tool_use" and body["stop_sequence"] is None


def test_blank_lines_alone_are_still_an_answer() -> None:
    assert _whole(_deltas(["\n", "\n"]))["content"] == [{"type": "text", "text": "\n\n"}]
    assert _whole(_deltas([""]))["content"] == []


@pytest.mark.parametrize(("finish", "stop", "reason", "sequence"), [
    ("stop", None, "end_turn", None), ("stop", 151645, "end_turn", None),
    ("stop", "END", "stop_sequence", "END"), ("length", None, "max_tokens", None)])
def test_stop_reasons(finish: str, stop: str | int | None, reason: str,
                      sequence: str | None) -> None:
    body = _whole(_deltas(["some text"], finish, stop))
    assert (body["stop_reason"], body["stop_sequence"]) == (reason, sequence)


def test_usage_counts_cache_reads_apart() -> None:
    usage = _whole(_deltas(["a", "b"], cached=3))["usage"]
    assert usage == {"input_tokens": 1, "cache_read_input_tokens": 3,
                     "cache_creation_input_tokens": 0, "output_tokens": 2}


def test_thinking_omitted_and_opened_by_the_prompt() -> None:
    """A budget opens the think block in the prompt: the output starts inside it."""
    body = _whole(_deltas(["deep thought</think>\n\nAnswer."]), opened=True,
                  show_thinking=False)
    assert body["content"] == [{"type": "thinking", "thinking": "", "signature": ""},
                               {"type": "text", "text": "Answer."}]


def test_a_tool_event_without_tools_is_text() -> None:
    """Calls are parsed only when the request offered tools."""
    plain = ToolPlan(tools=None, parse=False, forced=None)
    body = _whole(_deltas([CALL]), plain)
    assert body["content"] == [{"type": "text", "text": CALL}]
    assert body["stop_reason"] == "end_turn"


def test_blocks_reject_nothing_the_parser_makes() -> None:
    """Every parser event, fed in any order, leaves well-formed blocks."""
    parser = ChatOutputParser(tools=True)
    blocks = Blocks()
    events = parser.feed(f"<think>t</think>x{CALL}y") + parser.finish()
    events.append(Event("tool_call", call=ToolCall("call_ab", "g", "{}")))
    for event in events:
        blocks.feed(event)
    blocks.finish()
    assert [b["type"] for b in blocks.content] == ["thinking", "text", "tool_use", "text",
                                                   "tool_use"]
    assert blocks.content[-1]["id"] == "toolu_ab"


@pytest.mark.parametrize(("status", "shown", "kind"), [
    (400, 400, "invalid_request_error"), (401, 401, "authentication_error"),
    (404, 404, "not_found_error"), (413, 413, "request_too_large"),
    (429, 429, "rate_limit_error"), (500, 500, "api_error"), (503, 529, "overloaded_error"),
    (422, 422, "invalid_request_error"), (504, 504, "api_error")])
def test_error_shapes_and_statuses(status: int, shown: int, kind: str) -> None:
    assert anthropic_status(status) == shown
    assert anthropic_error(status, "why") == {"type": "error",
                                              "error": {"type": kind, "message": "why"}}


def test_a_failure_mid_stream_is_an_error_event() -> None:
    output = MessagesOutput(HEAD, SPEC, TOOLS)
    raw: list[bytes] = []
    output.stream(_deltas(["partial", "more"])[0], raw)
    output.failing(APIError(503, "the engine died"), raw)
    last = b"".join(raw).decode().rstrip("\n").split("\n\n")[-1]
    assert last == ('event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
                    '"message":"the engine died"}}')


class _Slow:
    """A generation that says nothing for ``quiet`` seconds, then finishes; like the real one,
    a call cancelled while it waits loses nothing."""

    def __init__(self, quiet: float) -> None:
        self.until = trio.current_time() + quiet
        self.finished = False

    async def next(self) -> list[ChoiceDelta]:
        if self.finished:
            return []
        await trio.sleep_until(self.until)
        self.finished = True
        return _deltas(["hi"])


async def test_a_quiet_stream_pings(autojump_clock: MockClock) -> None:
    quiet = KEEPALIVE.interval * 3.5
    start = trio.current_time()
    parts = [(trio.current_time() - start, part) async for part in _events(
        _Slow(quiet), MessagesOutput(HEAD, SPEC, TOOLS), None, KEEPALIVE)]  # type: ignore[arg-type]
    pings = [at for at, part in parts if part == PING]
    assert pings == [KEEPALIVE.interval * k for k in (1, 2, 3)]
    assert b"message_stop" in parts[-1][1]

"""What a Responses answer makes of a generation's deltas, in the frontend alone: its items,
its stream of events (each validated by the ``openai`` SDK's models) and its failures."""

from __future__ import annotations

import json
import weakref
from typing import Any

import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import ChoiceDelta, ChoiceSpec
from izh_trio.frontend.responses.options import tool_plan
from izh_trio.frontend.responses.output import ResponsesOutput
from izh_trio.frontend.responses.output_items import ReasoningTokens
from izh_trio.frontend.serving.api import Head
from izh_trio.frontend.serving.pipeline import _events
from izh_trio.wire import SamplingParams
from tests.refcycles import cyclic_collector_off

HEAD = Head("resp_0", 0, "m", "fp_0")
SPEC = ChoiceSpec(0, [5, 6, 7], SamplingParams())
THINK, UNTHINK = 90, 91
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
ECHO = {"tools": [], "tool_choice": "auto", "parallel_tool_calls": True}
STREAM_EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)
#: (text, token ids) of a thought, an answer in two pieces, and a call, as deltas.
PIECES = [("<think>", [THINK]), ("hm</think>", [1, UNTHINK]), ("\n\nIt is", [2, 3]),
          (" noon.<tool_call>\n", [4, 5]),
          ('{"name": "f", "arguments": {"x": 1}}\n</tool_call>', [6, 7, 8])]


def _output(tools: Any = None) -> ResponsesOutput:
    plan = tool_plan(tools, None, True)
    return ResponsesOutput(HEAD, "resp_0", SPEC, plan, ECHO,
                           reasoning=ReasoningTokens(THINK, UNTHINK), logprobs=None)


def _deltas(finish: str) -> list[ChoiceDelta]:
    out, total = [], 0
    for i, (text, ids) in enumerate(PIECES):
        total += len(ids)
        last = i == len(PIECES) - 1
        out.append(ChoiceDelta(0, text, ids, None, None, finish if last else None, None, 3,
                               total, 0, first=i == 0))
    return out


class _Deltas:
    """A generation that gives the deltas, then fails with ``error`` if given."""

    def __init__(self, deltas: list[ChoiceDelta], error: Exception | None = None) -> None:
        self._left, self._error = list(deltas), error

    @property
    def finished(self) -> bool:
        return not self._left and self._error is None

    async def next(self) -> list[ChoiceDelta]:
        if self._left:
            return [self._left.pop(0)]
        if self._error is not None:
            raise self._error
        return []


async def _stream(output: ResponsesOutput, generation: _Deltas) -> list[dict[str, Any]]:
    body = b"".join([p async for p in _events(generation, output)])  # type: ignore[arg-type]
    events = []
    for block in body.decode().split("\n\n"):
        if block:
            name, data = block.split("\n")
            event = json.loads(data.removeprefix("data: "))
            assert name == f"event: {event['type']}"
            STREAM_EVENTS.validate_python(event)
            events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def _plain(output: ResponsesOutput, finish: str) -> dict[str, Any]:
    for delta in _deltas(finish):
        output.add(delta)
    return output.body()


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    def strip(r: dict[str, Any]) -> dict[str, Any]:
        return {**r, "completed_at": None, "output": [
            {k: v for k, v in item.items() if k not in ("id", "call_id")}
            for item in r["output"]]}

    assert strip(a) == strip(b)


async def test_reasoning_text_and_a_call_are_three_items_streamed_as_they_are_built() -> None:
    plain = Response.model_validate(_plain(_output([TOOL]), "stop"))
    assert [item.type for item in plain.output] == ["reasoning", "message", "function_call"]
    reasoning, message, call = plain.output
    assert reasoning.content[0].text == "hm" and reasoning.summary == []
    assert message.content[0].text == "It is noon." and message.status == "completed"
    assert (call.name, json.loads(call.arguments)) == ("f", {"x": 1})
    assert plain.status == "completed" and plain.incomplete_details is None
    assert plain.usage.output_tokens == 10 and plain.usage.output_tokens_details \
        .reasoning_tokens == 3
    events = await _stream(_output([TOOL]), _Deltas(_deltas("stop")))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    _same(events[-1]["response"], plain.model_dump(mode="json", exclude_unset=True))
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["usage"] is None


async def test_the_length_finish_is_an_incomplete_response() -> None:
    # Without tools the call's text is content: one message, cut by max_output_tokens.
    plain = _plain(_output(), "length")
    assert plain["status"] == "incomplete"
    assert plain["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [i["status"] for i in plain["output"]] == ["completed", "incomplete"]
    events = await _stream(_output(), _Deltas(_deltas("length")))
    assert events[-1]["type"] == "response.incomplete"
    _same(events[-1]["response"], plain)


@pytest.mark.parametrize("error", [APIError(503, "the server is shutting down"),
                                   ValueError("a bug")])
async def test_a_failure_mid_stream_is_one_response_failed_event(error: Exception) -> None:
    events = await _stream(_output(), _Deltas(_deltas("stop")[:3], error))
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "response.failed" and kinds.count("response.failed") == 1
    failed = Response.model_validate(events[-1]["response"])
    assert failed.status == "failed" and failed.error.code == "server_error"
    assert failed.error.message in ("the server is shutting down",
                                    "internal server error (ValueError)")
    assert [(i.type, i.status) for i in failed.output] == [("reasoning", "completed"),
                                                           ("message", "incomplete")]


def test_reasoning_tokens_run_from_think_to_its_end() -> None:
    count = ReasoningTokens(THINK, UNTHINK)
    assert count.take([THINK, 1]) == 2
    assert count.take([2, UNTHINK, 3]) == 2
    assert count.take([THINK]) == 0 and count.count == 4
    plain = ReasoningTokens(THINK, UNTHINK)
    assert plain.take([1, THINK, 2]) == 0 and plain.count == 0
    assert ReasoningTokens(None, None).take([1]) == 0


def test_an_answered_response_is_freed_by_reference_counting() -> None:
    """Its items say their events to an object apart from it: a bound method of the
    response would make every response a reference cycle, left to the cyclic collector."""
    with cyclic_collector_off():
        output = _output([TOOL])
        events: list[bytes] = []
        output.opening(events)
        for delta in _deltas("tool_calls"):
            output.stream(delta, events)
        output.closing(events)
        assert events and output.body()["status"] == "completed"
        gone = weakref.ref(output)
        del output
        assert gone() is None

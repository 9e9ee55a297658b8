"""Anthropic's Messages API, as a new user meets it: the official ``anthropic`` SDK against a
real server on a transformers-made Qwen3 with random weights.

Greedy requests (``temperature: 0``, sent as an extra body field: the SDK no longer has the
argument) make a streamed message comparable to the same request answered whole. Forced tool
calls are sampled: every one must still give ``tool_use`` blocks whose ``input`` validates.
"""

from __future__ import annotations

import enum
import uuid
from typing import Any

import anthropic
import httpx
import jsonschema
import pydantic
import pytest

MODEL = "qwen3-test"
GREEDY = {"temperature": 0}


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Place(pydantic.BaseModel):
    city: str
    country: str | None = None


class WeatherQuery(pydantic.BaseModel):
    """What pydantic makes of a tool's arguments: $defs, an enum, optional fields, no
    additionalProperties, unbounded strings."""

    place: Place
    unit: Unit
    days: int = 1


WEATHER = {"name": "get_weather", "description": "The weather forecast for a place.",
           "input_schema": WeatherQuery.model_json_schema()}
CLOCK = {"name": "get_time", "description": "The time in a timezone.",
         "input_schema": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}},
                          "required": ["tz"]}}


@pytest.fixture(scope="module")
def client(server: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0, timeout=120)


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _blocks(message: Any) -> list[dict[str, Any]]:
    """A message's content as plain data (the stream's helper builds ``Parsed*`` classes)."""
    return [{k: v for k, v in block.model_dump().items() if k != "parsed_output"}
            for block in message.content]


def test_a_plain_message(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=MODEL, max_tokens=12, messages=_user("Hello"),
                                     system="Be brief.", extra_body=GREEDY)
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == MODEL
    assert [block.type for block in message.content] == ["text"]
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens <= 12 and message.usage.input_tokens > 0
    assert message.usage.cache_creation_input_tokens == 0


@pytest.mark.parametrize("thinking", [None, {"type": "enabled", "budget_tokens": 6}],
                         ids=["plain", "thinking"])
def test_a_stream_reassembles_to_the_whole_message(client: anthropic.Anthropic,
                                                   thinking: dict[str, Any] | None) -> None:
    ask: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "extra_body": GREEDY,
                           "messages": _user(f"Tell me something {uuid.uuid4().hex}")}
    if thinking is not None:
        ask["thinking"] = thinking
    whole = client.messages.create(**ask)
    with client.messages.stream(**ask) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert _blocks(streamed) == _blocks(whole)
    assert (streamed.stop_reason, streamed.stop_sequence) == (whole.stop_reason,
                                                              whole.stop_sequence)
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    assert streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens == \
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    if thinking is not None:
        assert [block["type"] for block in _blocks(whole)][:1] == ["thinking"]


def test_thinking_on_and_off(client: anthropic.Anthropic) -> None:
    """Enabled: the answer opens with a thinking block, closed by the engine when its budget
    is spent (a random model never closes it), then text. Disabled (and by default): no
    thinking block, and Qwen3's template renders the empty think block into the prompt."""
    text = f"Think about {uuid.uuid4().hex}"
    on = client.messages.create(model=MODEL, max_tokens=30, messages=_user(text),
                                thinking={"type": "enabled", "budget_tokens": 8},
                                extra_body=GREEDY)
    kinds = [block.type for block in on.content]
    assert kinds[0] == "thinking" and "thinking" not in kinds[1:], kinds
    assert on.content[0].thinking  # type: ignore[union-attr]
    off = client.messages.create(model=MODEL, max_tokens=30, messages=_user(text),
                                 thinking={"type": "disabled"}, extra_body=GREEDY)
    default = client.messages.create(model=MODEL, max_tokens=30, messages=_user(text),
                                     extra_body=GREEDY)
    for message in (off, default):
        assert all(block.type != "thinking" for block in message.content)
    assert _blocks(off) == _blocks(default)
    hidden = client.messages.create(model=MODEL, max_tokens=30, messages=_user(text),
                                    thinking={"type": "enabled", "budget_tokens": 8,
                                              "display": "omitted"}, extra_body=GREEDY)
    assert hidden.content[0].type == "thinking" and hidden.content[0].thinking == ""
    assert _blocks(hidden)[1:] == _blocks(on)[1:]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}],
                         ids=["any", "tool"])
def test_forced_tool_use_always_validates(client: anthropic.Anthropic,
                                          choice: dict[str, Any]) -> None:
    for seed in range(4):
        message = client.messages.create(
            model=MODEL, max_tokens=300, messages=_user("What is the weather in Paris?"),
            tools=[WEATHER, CLOCK], tool_choice=choice,  # type: ignore[arg-type]
            extra_body={"seed": seed})
        calls = [block for block in message.content if block.type == "tool_use"]
        assert calls and message.stop_reason == "tool_use", message
        for call in calls:
            assert call.id.startswith("toolu_")
            tool = {"get_weather": WEATHER, "get_time": CLOCK}[call.name]
            if choice["type"] == "tool":
                assert call.name == "get_weather"
            jsonschema.validate(call.input, tool["input_schema"])


def test_a_tool_round_trip(client: anthropic.Anthropic) -> None:
    asked = _user("What time is it in Berlin?")
    first = client.messages.create(model=MODEL, max_tokens=200, messages=asked,
                                   tools=[CLOCK], tool_choice={"type": "any"},
                                   extra_body={"seed": 1})
    call = next(block for block in first.content if block.type == "tool_use")
    with client.messages.stream(
            model=MODEL, max_tokens=16, tools=[CLOCK], extra_body=GREEDY,
            messages=[*asked, {"role": "assistant", "content": first.content},
                      {"role": "user", "content": [
                          {"type": "tool_result", "tool_use_id": call.id,
                           "content": [{"type": "text", "text": "12:00"}]}]}]) as stream:
        answer = stream.get_final_message()
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens > \
        first.usage.input_tokens + first.usage.cache_read_input_tokens


def test_count_tokens_and_the_prefix_cache(client: anthropic.Anthropic) -> None:
    """count_tokens counts the prompt the request renders; a repeated request finds most of it
    in the prefix cache and says so, as Anthropic counts: input_tokens is what was not read
    from the cache."""
    ask: dict[str, Any] = {
        "model": MODEL, "system": "You answer questions about the weather.",
        "messages": _user("Is it going to rain tomorrow in " + uuid.uuid4().hex * 8),
        "tools": [WEATHER], "thinking": {"type": "enabled", "budget_tokens": 4}}
    counted = client.messages.count_tokens(**ask).input_tokens
    first = client.messages.create(max_tokens=8, extra_body=GREEDY, **ask)
    assert first.usage.input_tokens == counted
    assert first.usage.cache_read_input_tokens == 0
    second = client.messages.create(max_tokens=8, extra_body=GREEDY, **ask)
    assert second.usage.cache_read_input_tokens > 0
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == counted
    off = client.messages.count_tokens(**{**ask, "thinking": {"type": "disabled"}})
    assert off.input_tokens != counted  # the template renders thinking off differently


def test_stop_sequences_and_prefill(client: anthropic.Anthropic) -> None:
    """A seeded sample (the same tokens each time: this checkpoint's greedy answers are blank
    lines) cut at a stop sequence taken from it; then continued from a prefill."""
    for seed in range(8):
        ask: dict[str, Any] = {"model": MODEL, "max_tokens": 20,
                               "extra_body": {"temperature": 1, "seed": seed},
                               "messages": _user("Tell me a story.")}
        free = client.messages.create(**ask)
        text = "".join(block.text for block in free.content if block.type == "text")
        at = next((i for i, c in enumerate(text) if i and not c.isspace()), None)
        if at is not None:
            break
    else:
        raise AssertionError("no seed gave an answer with text to stop at")
    stop = text[at:at + 3]
    cut = client.messages.create(**ask, stop_sequences=[stop])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert all(stop not in block.text for block in cut.content if block.type == "text")
    prefilled = client.messages.create(**{**ask, "messages": [
        *ask["messages"], {"role": "assistant", "content": text[:at]}]})
    assert prefilled.stop_reason in ("end_turn", "max_tokens")


@pytest.mark.parametrize(("body", "where"), [
    ({"messages": _user("hi")}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "hi"}]}, "role"),
    ({"max_tokens": 5, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope",
                                      "content": "x"}]}]}, "tool_use_id"),
    ({"max_tokens": 5, "messages": _user("hi"),
      "tools": [{"name": "f", "input_schema": {"type": "object", "properties": 5}}],
      "tool_choice": {"type": "any"}}, "properties must be an object"),
    ({"max_tokens": 5, "messages": _user("hi"), "tools": [{"name": "f"}]}, "input_schema"),
    ({"max_tokens": 5, "messages": _user("hi"),
      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1/x.png"}}]}]},
     "'image'"),
    ({"max_tokens": 5, "messages": _user("hi"), "tools": [CLOCK],
      "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 2}},
     "thinking"),
    ({"max_tokens": 5, "messages": _user("hi"),
      "thinking": {"type": "enabled", "budget_tokens": 5}}, "budget_tokens"),
])
def test_bad_requests_are_anthropic_400s(client: anthropic.Anthropic, server: str,
                                         body: dict[str, Any], where: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.post("/v1/messages", body=body, cast_to=httpx.Response)
    error = caught.value
    assert error.status_code == 400
    assert isinstance(error.body, dict) and error.body["type"] == "error"
    assert error.body["error"]["type"] == "invalid_request_error"
    assert where in error.body["error"]["message"], error.body
    assert httpx.get(server + "/health", timeout=10).status_code == 200


def test_unknown_model_is_a_404(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-nonesuch", max_tokens=5, messages=_user("hi"))
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]

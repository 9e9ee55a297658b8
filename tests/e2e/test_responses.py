"""``POST /v1/responses`` as the official ``openai`` SDK uses it, against the real server and
engine: plain, streamed (raw events and the SDK's stream helper), parsed into a pydantic model,
function tools round-tripped by resending items; and its refusals, in OpenAI's error shape.

Every response and event is validated by the SDK's own pydantic models (``Response``,
``ResponseStreamEvent``), so a field this server drops, renames or retypes fails here.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import jsonschema
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from tests.e2e.test_openapi import SPEC_PATH, check, deref, documented, request_schema, validate

MODEL = "qwen3-test"
TZ = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
      "additionalProperties": False}
GET_TIME = {"type": "function", "name": "get_time", "description": "The time in a zone.",
            "parameters": TZ, "strict": True}
#: Greedy and eos-free: two requests that mean the same give the same output.
SAME: dict[str, Any] = {"temperature": 0, "max_output_tokens": 12,
                        "extra_body": {"ignore_eos": True}}
STREAM_EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def post(server: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server + "/v1/responses", json=body, timeout=120)


def raw_events(server: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's events, each checked: its ``event:`` line names its data's type."""
    with httpx.stream("POST", server + "/v1/responses", json={**body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    events = []
    for name, data in zip(lines[::2], lines[1::2], strict=True):
        assert name.startswith("event: ") and data.startswith("data: "), (name, data)
        event = json.loads(data[len("data: "):])
        assert event["type"] == name[len("event: "):]
        events.append(event)
    return events


def check_stream(events: list[dict[str, Any]]) -> Response:
    """The stream's rules: SDK-valid events, sequence numbers one above the last, created
    and in_progress first, exactly one terminal event and it last; its final response."""
    for event in events:
        STREAM_EVENTS.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert [e["type"] for e in events if e["type"] in TERMINAL] == [events[-1]["type"]]
    return Response.model_validate(events[-1]["response"])


def without_ids(response: dict[str, Any]) -> dict[str, Any]:
    """A response with what differs between two runs of one request left out: ids, times,
    and the prefix cache's hits (the second run finds the first one's blocks)."""
    out = {k: v for k, v in response.items() if k not in ("id", "created_at", "completed_at")}
    out["usage"] = {k: v for k, v in response["usage"].items() if k != "input_tokens_details"}
    out["output"] = [{k: v for k, v in item.items() if k not in ("id", "call_id")}
                     for item in response["output"]]
    return out


class Reply(pydantic.BaseModel):
    mood: str
    happy: bool
    tags: list[str]


def test_a_plain_response_is_openais_shape(server: str, client: openai.OpenAI) -> None:
    raw = post(server, {"model": MODEL, "input": "Say hi.", "temperature": 0,
                        "max_output_tokens": 5, "ignore_eos": True,
                        "metadata": {"k": "v"}, "user": "u-1"})
    assert raw.status_code == 200, raw.text
    out = Response.model_validate(raw.json())
    assert out.id.startswith("resp_") and raw.headers["X-Request-Id"] == out.id
    assert out.object == "response" and out.model == MODEL
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.metadata == {"k": "v"} and out.user == "u-1" and out.store is True
    assert out.usage.output_tokens == 5
    assert out.usage.total_tokens == out.usage.input_tokens + 5
    [message] = [item for item in out.output if item.type == "message"]
    assert message.id.startswith("msg_") and message.role == "assistant"
    assert message.status == "incomplete"
    sdk = client.responses.create(model=MODEL, input="Say hi.", temperature=0,
                                  max_output_tokens=5, extra_body={"ignore_eos": True})
    assert sdk.output_text == message.content[0].text
    assert sdk.usage.input_tokens == out.usage.input_tokens


def test_a_client_request_id_is_echoed_and_the_response_keeps_its_own(server: str) -> None:
    r = httpx.post(server + "/v1/responses", json={"input": "hi", "max_output_tokens": 1},
                   headers={"X-Request-Id": "mine-1"}, timeout=120)
    assert r.headers["X-Request-Id"] == "mine-1"
    assert r.json()["id"].startswith("resp_")


def test_streamed_events_reassemble_to_the_plain_response(server: str) -> None:
    body = {"model": MODEL, "input": [{"role": "user", "content": "Tell me about rivers."}],
            "instructions": "Be brief.", "temperature": 0, "max_output_tokens": 16,
            "ignore_eos": True, "include": ["message.output_text.logprobs"],
            "top_logprobs": 2}
    plain = post(server, body).json()
    events = raw_events(server, body)
    final = check_stream(events)
    assert without_ids(final.model_dump(mode="json", exclude_unset=True)) == without_ids(plain)
    # The deltas say the same text and logprobs as the items they build.
    for index, item in enumerate(plain["output"]):
        mine = [e for e in events if e.get("output_index") == index]
        assert mine[0]["type"] == "response.output_item.added"
        assert mine[-1]["type"] == "response.output_item.done" and mine[-1]["item"]["id"] \
            == final.output[index].id
        if item["type"] == "message":
            deltas = [e for e in mine if e["type"] == "response.output_text.delta"]
            assert "".join(e["delta"] for e in deltas) == item["content"][0]["text"]
            logprobs = [lp for e in deltas for lp in e["logprobs"]]
            assert logprobs == item["content"][0]["logprobs"]
            assert all(len(lp["top_logprobs"]) == 2 for lp in logprobs)
    usage = plain["usage"]
    logprobs = sum(len(i["content"][0]["logprobs"]) for i in plain["output"]
                   if i["type"] == "message")
    assert logprobs <= usage["output_tokens"] - usage["output_tokens_details"][
        "reasoning_tokens"]


def test_the_sdks_stream_helper_ends_with_the_plain_response(client: openai.OpenAI) -> None:
    # A format that ends by itself: the helper's final response needs response.completed.
    kwargs: dict[str, Any] = {"model": MODEL, "input": "How are you?", "temperature": 0,
                              "max_output_tokens": 200}
    plain = client.responses.parse(**kwargs, text_format=Reply)
    assert plain.status == "completed"
    with client.responses.stream(**kwargs, text_format=Reply) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[-1] == "response.completed" and kinds.count(kinds[-1]) == 1
    assert final.output_text == plain.output_text
    assert final.output_parsed == plain.output_parsed
    assert final.usage.output_tokens == plain.usage.output_tokens
    raw = list(client.responses.create(**kwargs, stream=True, text={"format": {
        "type": "json_schema", "name": "Reply", "schema": Reply.model_json_schema()}}))
    assert [e.sequence_number for e in raw] == list(range(len(raw)))
    assert raw[-1].response.output_text == plain.output_text


@pytest.mark.parametrize("seed", range(3))
def test_parse_validates_into_the_model(client: openai.OpenAI, seed: int) -> None:
    out = client.responses.parse(model=MODEL, input="How are you?", text_format=Reply,
                                 temperature=1.0, max_output_tokens=200,
                                 extra_body={"seed": seed})
    assert out.status == "completed", out.output
    assert isinstance(out.output_parsed, Reply)


def test_a_function_tool_round_trip_by_resending_items(client: openai.OpenAI) -> None:
    question = [{"role": "user", "content": "What time is it in Paris?"}]
    first = client.responses.create(model=MODEL, input=question, tools=[GET_TIME],
                                    tool_choice="required", temperature=1.0,
                                    max_output_tokens=200, extra_body={"seed": 1})
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and first.status == "completed"
    for call in calls:
        assert call.id.startswith("fc_") and call.call_id.startswith("call_")
        assert call.name == "get_time" and call.status == "completed"
        jsonschema.validate(json.loads(call.arguments), TZ)
    answered = [*question, *[item.model_dump(exclude_none=True) for item in first.output],
                *[{"type": "function_call_output", "call_id": c.call_id, "output": "12:00"}
                  for c in calls]]
    second = client.responses.create(model=MODEL, input=answered, tools=[GET_TIME],
                                     tool_choice="auto", **SAME)
    # The prompt is exactly the chat conversation of the question, the assistant's calls and
    # the tool's answers.
    chat = [*question, {"role": "assistant", "content": "", "tool_calls": [
        {"id": c.call_id, "type": "function",
         "function": {"name": c.name, "arguments": c.arguments}} for c in calls]},
        *[{"role": "tool", "tool_call_id": c.call_id, "content": "12:00"} for c in calls]]
    tools = [{"type": "function", "function": {k: GET_TIME[k] for k in (
        "name", "description", "parameters")}}]
    counted = httpx.post(str(client.base_url).removesuffix("/v1/") + "/tokenize",
                         json={"messages": chat, "tools": tools}, timeout=60).json()
    assert second.usage.input_tokens == counted["count"]
    assert second.status == "incomplete" and second.output


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_time"}])
def test_forced_calls_stream_like_the_plain_ones(client: openai.OpenAI, server: str,
                                                 choice: Any) -> None:
    other = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    body = {"model": MODEL, "input": "What time is it?", "tools": [other, GET_TIME],
            "tool_choice": choice, "parallel_tool_calls": False, "temperature": 0,
            "max_output_tokens": 200}
    plain = Response.model_validate(post(server, body).json())
    [call] = plain.output
    assert call.type == "function_call"
    if isinstance(choice, dict):
        assert call.name == "get_time"
    if call.name == "get_time":
        jsonschema.validate(json.loads(call.arguments), TZ)
    events = raw_events(server, body)
    final = check_stream(events)
    assert [(c.name, c.arguments) for c in final.output] == [(call.name, call.arguments)]
    [delta] = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert delta["delta"] == call.arguments
    assert final.tool_choice == plain.tool_choice and final.tools == plain.tools


def test_reasoning_effort_and_instructions_shape_the_prompt(client: openai.OpenAI) -> None:
    def tokens(**kwargs: Any) -> int:
        out = client.responses.create(model=MODEL, input="hi", max_output_tokens=1, **kwargs)
        return out.usage.input_tokens

    thinking = tokens()
    assert tokens(reasoning={"effort": "none"}) > thinking  # the empty think block
    assert tokens(reasoning={"effort": "high", "summary": "auto"}) == thinking
    assert tokens(instructions="Answer in French.") > thinking


def test_prompt_cache_key_partitions_the_prefix_cache(client: openai.OpenAI) -> None:
    words = " ".join(f"w{i}" for i in range(300))

    def cached(key: str) -> int:
        out = client.responses.create(model=MODEL, input=words, max_output_tokens=1,
                                      prompt_cache_key=key)
        return out.usage.input_tokens_details.cached_tokens

    # keys of this test's own: the session's server is shared, and other tests salt prompts
    tenant_a, tenant_b = (f"responses-{uuid.uuid4().hex}" for _ in range(2))
    assert cached(tenant_a) == 0
    assert cached(tenant_a) > 200
    assert cached(tenant_b) == 0


def test_truncation_auto_drops_the_oldest_items(server: str) -> None:
    long = " ".join(f"word{i}" for i in range(120))
    items = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}: {long}"}
             for i in range(41)]
    body = {"model": MODEL, "input": items, "instructions": "Be brief.",
            "max_output_tokens": 8}
    refused = post(server, body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert refused.json()["error"]["param"] == "input"
    too_much = post(server, {"input": "hi", "max_output_tokens": 4096})
    assert too_much.json()["error"]["param"] == "max_output_tokens", too_much.text
    fitted = post(server, {**body, "truncation": "auto"})
    assert fitted.status_code == 200, fitted.text
    out = fitted.json()
    assert out["truncation"] == "auto"
    assert out["usage"]["input_tokens"] + 8 <= 2048
    assert out["usage"]["input_tokens"] > 1000  # only as many dropped as needed


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ({"background": True, "store": False}, "background"),
    ({"n": 2}, "n"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"text": {"format": {"type": "xml"}}}, "text"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning"),
    ({"include": ["everything"]}, "include"),
    ({"truncation": "sometimes"}, "truncation"),
    ({"max_output_tokens": "5"}, "max_output_tokens"),
    ({"input": None}, "input"),
])
def test_what_cannot_be_honoured_is_a_400_naming_it(client: openai.OpenAI, body: dict,
                                                    param: str) -> None:
    full = {"model": MODEL, "input": "hi", "max_output_tokens": 4, **body}
    with pytest.raises(openai.BadRequestError) as err:
        client.post("/responses", body=full, cast_to=Response)
    error = err.value.body
    assert error["param"] == param, error
    assert error["type"] == "BadRequestError" and error["message"]


def test_null_fields_are_their_defaults(server: str) -> None:
    base = {"model": MODEL, "input": "hi", "temperature": 0, "max_output_tokens": 4,
            "ignore_eos": True}
    expected = post(server, base).json()
    for field in ("instructions", "tools", "tool_choice", "text", "reasoning", "store",
                  "background", "previous_response_id", "metadata", "truncation",
                  "parallel_tool_calls", "top_logprobs", "include", "user", "stream"):
        out = post(server, {**base, field: None})
        assert out.status_code == 200, (field, out.text)
        assert out.json()["output"][0]["content"][0]["text"] == \
            expected["output"][0]["content"][0]["text"], field


def test_responses_and_their_streams_are_what_the_openapi_document_says(server: str) -> None:
    spec = json.loads(SPEC_PATH.read_text())
    bodies = [
        {"model": MODEL, "input": "hi", "max_output_tokens": 4, "temperature": 0,
         "include": ["message.output_text.logprobs"], "top_logprobs": 1},
        {"input": [{"role": "user", "content": "What time is it?"}], "tools": [GET_TIME],
         "tool_choice": "required", "temperature": 1.0, "seed": 2, "max_output_tokens": 200},
    ]
    for body in bodies:
        validate(spec, request_schema(spec, "/v1/responses"), body)
        check(spec, "POST", "/v1/responses", post(server, body))
        events = raw_events(server, body)
        media = documented(spec, "post", "/v1/responses", 200)["content"]["text/event-stream"]
        sse = [{"event": e["type"], "data": json.dumps(e)} for e in events]
        validate(spec, media["schema"], sse)
        for item in sse:
            validate(spec, media["itemSchema"], item)
        event_schema = deref(spec, media["itemSchema"])["properties"]["data"]["contentSchema"]
        for e in events:
            validate(spec, event_schema, e)
    refused = post(server, {"input": "hi", "background": True, "store": False})
    assert check(spec, "POST", "/v1/responses", refused)["error"]["param"] == "background"

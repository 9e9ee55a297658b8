"""Structured outputs and tools on a random-weight model: every valid output is the grammar's.

Many seeds, sampled at temperature 1, through the official client against the real server.
Schemas are bounded (maxLength, enums, no extra properties) so outputs close in few tokens.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest

from tests.e2e.conftest import assert_streamed_calls_match

MODEL = "qwen3-test"
SEEDS = range(12)
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12},
                   "unit": {"enum": ["celsius", "fahrenheit"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET", "PST"]}},
        "required": ["tz"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
MESSAGES = [{"role": "user", "content": "What's the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def _many(fn, seeds=SEEDS) -> list:
    with ThreadPoolExecutor(6) as pool:
        return list(pool.map(fn, seeds))


def _check_calls(calls: list) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_required_tool_choice_always_gives_valid_calls(client: openai.OpenAI) -> None:
    def one(seed: int):
        return client.chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
            parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=200)

    for out in _many(one):
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        assert len(choice.message.tool_calls) == 1
        _check_calls(choice.message.tool_calls)


def test_named_tool_choice_calls_that_function(client: openai.OpenAI) -> None:
    def one(seed: int):
        return client.chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=TOOLS, temperature=1.0, seed=seed,
            tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=200)

    for out in _many(one):
        calls = out.choices[0].message.tool_calls
        _check_calls(calls)
        assert {c.function.name for c in calls} == {"get_time"}


FORECAST = {"type": "object", "properties": {"summary": {"type": "string"},
                                            "high": {"type": "integer"}},
            "required": ["summary", "high"]}
FORECAST_FORMAT = {"type": "json_schema", "json_schema": {"name": "forecast",
                                                          "schema": FORECAST}}


def test_a_forced_call_with_a_response_format_is_the_call(client: openai.OpenAI) -> None:
    """Agent frameworks send tools, a forced choice and their output type's format at once
    (OpenAI accepts it): the answer is the call; the format is for a later text answer."""
    def one(seed: int):
        return client.chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
            response_format=FORECAST_FORMAT, temperature=1.0, seed=seed, max_tokens=200)

    for out in _many(one, range(4)):
        assert out.choices[0].finish_reason == "tool_calls"
        _check_calls(out.choices[0].message.tool_calls)


def test_free_tools_with_a_response_format_call_or_answer_in_it(client: openai.OpenAI
                                                                 ) -> None:
    """With tool_choice auto, the model may call a tool or answer in the requested format:
    each answer is one of the two, valid."""
    def one(seed: int):
        return client.chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=TOOLS, response_format=FORECAST_FORMAT,
            temperature=1.0, seed=seed, max_tokens=200)

    for out in _many(one, range(16)):
        choice = out.choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            _check_calls(choice.message.tool_calls)
        else:  # (which of the two a random model picks is its own affair: see test_tool_grammar)
            assert choice.finish_reason == "stop", choice
            jsonschema.validate(json.loads(choice.message.content), FORECAST)


def test_streamed_tool_calls_reassemble_to_the_non_streamed_ones(client: openai.OpenAI
                                                                  ) -> None:
    kwargs = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                  temperature=1.0, max_tokens=400)
    for seed in range(4):
        assert_streamed_calls_match(client, kwargs, seed)


def test_json_schema_outputs_always_validate(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER,
                                                  "strict": True}}

    def one(seed: int) -> str:
        return client.chat.completions.create(
            model=MODEL, messages=MESSAGES, response_format=fmt, temperature=1.0, seed=seed,
            max_tokens=120).choices[0].message.content

    for text in _many(one):
        obj = json.loads(text)
        jsonschema.validate(obj, WEATHER)
        # compact: no whitespace outside strings
        assert text == json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def test_json_object_always_parses(client: openai.OpenAI) -> None:
    """Any object allows free strings that a random model rarely closes: in its last tokens
    the engine steers the output (inside the grammar) along its shortest completion."""

    def one(seed: int):
        return client.chat.completions.create(
            model=MODEL, messages=MESSAGES, response_format={"type": "json_object"},
            temperature=1.0, seed=seed, max_tokens=120).choices[0]

    for choice in _many(one):
        assert isinstance(json.loads(choice.message.content), dict), choice.message.content


def test_regex_and_choice_always_match(client: openai.OpenAI) -> None:
    regex = r"[A-Z][a-z]{2,6}-\d{2,4}"
    choices = ["red", "green", "blue with spaces"]

    def one(seed: int) -> tuple[str, str]:
        r = client.completions.create(model=MODEL, prompt="Code:", temperature=1.0, seed=seed,
                                      max_tokens=30, extra_body={"guided_regex": regex})
        c = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, temperature=1.0, seed=seed, max_tokens=30,
            extra_body={"structured_outputs": {"choice": choices}})
        return r.choices[0].text, c.choices[0].message.content

    for code, pick in _many(one):
        assert re.fullmatch(regex, code)
        assert pick in choices


@pytest.mark.parametrize("body", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                "schema": {"type": "nope"}}}},
    {"response_format": {"type": "xml"}},
    {"structured_outputs": {"regex": "[a-"}},
    {"guided_grammar": "start: <nosuchtoken>"},
    {"guided_choice": []},
    {"structured_outputs": {"regex": "a"}, "guided_choice": ["a"]},
    {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    {"tool_choice": "required"},
    {"tools": [{"type": "function", "function": {"name": ""}}]},
])
def test_bad_constraints_are_400(server: str, body: dict) -> None:
    r = httpx.post(server + "/v1/chat/completions",
                   json={"messages": MESSAGES, "max_tokens": 5, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "BadRequestError"
    assert httpx.get(server + "/health").status_code == 200


def test_enable_thinking_false_renders_the_empty_think_block(server: str) -> None:
    def rendered(kwargs: dict) -> list[int]:
        return httpx.post(server + "/tokenize", json={"messages": MESSAGES, **kwargs}
                          ).json()["tokens"]

    on = rendered({})
    off = rendered({"chat_template_kwargs": {"enable_thinking": False}})
    tail = httpx.post(server + "/detokenize", json={"tokens": off[len(on):]}).json()["prompt"]
    assert off[: len(on)] == on and tail == "<think>\n\n</think>\n\n"


def test_multi_turn_tool_history_is_accepted(client: openai.OpenAI) -> None:
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": '
                                                              '"celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    ]
    out = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                         max_tokens=5)
    assert out.choices[0].finish_reason in ("length", "stop", "tool_calls")

"""Every constrained output ends validly within ``max_tokens``, on the schemas clients send.

200 seeded runs through the real server, sampled at temperature 1 from a random-weight model
(which writes long strings and numbers forever if let): forced tool calls (named and
``required``) and ``json_schema`` outputs, at ``max_tokens`` 64 and 200, over schemas as
pydantic, LangChain and the Agents SDK write them: unbounded strings, no
``additionalProperties``, ``$defs``/``$ref`` (recursive too), nested arrays, ``anyOf``,
numbers without bounds. Every one must parse, validate and end by itself (never ``length``).
"""

from __future__ import annotations

import enum
import itertools
import json
from typing import Any

import httpx
import jsonschema
import pydantic
import pytest
import trio

MODEL = "qwen3-test"
RUNS = 200
MESSAGES = [{"role": "user", "content": "Fill it in."}]


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Address(pydantic.BaseModel):
    street: str
    zip_code: int | None = None


class Person(pydantic.BaseModel):
    """A person, as instructor or the Agents SDK would send it (enum, nested model)."""

    name: str
    color: Color
    address: Address
    nicknames: list[str]


class Node(pydantic.BaseModel):
    label: str
    children: list[Node] = []


SCHEMAS: dict[str, dict[str, Any]] = {
    "pydantic_person": Person.model_json_schema(),
    "pydantic_recursive": Node.model_json_schema(),
    "langchain_tool": {  # @tool def search(query: str, limit: int) as LangChain converts it
        "description": "Search.", "properties": {
            "query": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["query", "limit"], "type": "object"},
    "nested_arrays": {"type": "object", "properties": {"rows": {
        "type": "array", "items": {"type": "array", "items": {"type": "number"}}}},
        "required": ["rows"]},
    "any_of": {"type": "object", "properties": {"value": {"anyOf": [
        {"type": "string"}, {"type": "number"}, {"type": "array", "items": {"type": "string"}},
        {"type": "null"}]}, "note": {"type": "string"}}, "required": ["value", "note"]},
    "free_text": {"type": "object", "properties": {"title": {"type": "string"},
                                                   "body": {"type": "string"}},
                  "required": ["title", "body"]},
    "definitions_ref": {"definitions": {"Pt": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}},
        "type": "object", "properties": {"a": {"$ref": "#/definitions/Pt"},
                                         "b": {"$ref": "#/definitions/Pt"}},
        "required": ["a", "b"]},
}
MODES = ("named_tool", "required_tool", "json_schema")
BUDGETS = (64, 200)


def _body(schema_name: str, mode: str, max_tokens: int, seed: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens,
                            "temperature": 1.0, "seed": seed}
    schema = SCHEMAS[schema_name]
    if mode == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": schema_name, "schema": schema}}
    else:
        body["tools"] = [{"type": "function", "function": {
            "name": schema_name, "description": "Use it.", "parameters": schema}}]
        body["tool_choice"] = ("required" if mode == "required_tool" else
                               {"type": "function", "function": {"name": schema_name}})
    return body


def _problem(schema_name: str, mode: str, response: httpx.Response) -> str | None:
    """What is wrong with one answer, or None."""
    if response.status_code != 200:
        return f"HTTP {response.status_code}: {response.text[:300]}"
    choice = response.json()["choices"][0]
    message = choice["message"]
    try:
        if mode == "json_schema":
            if choice["finish_reason"] != "stop":
                return f"finish_reason {choice['finish_reason']}: {message['content']!r}"
            jsonschema.validate(json.loads(message["content"]), SCHEMAS[schema_name])
        else:
            if choice["finish_reason"] != "tool_calls" or not message.get("tool_calls"):
                return f"finish_reason {choice['finish_reason']}, no call: {message!r}"
            call = message["tool_calls"][0]["function"]
            assert call["name"] == schema_name
            jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[schema_name])
    except (ValueError, AssertionError, jsonschema.ValidationError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]} in {message!r}"
    return None


async def test_constrained_outputs_always_close_and_validate(server: str) -> None:
    combos = list(itertools.product(SCHEMAS, MODES, BUDGETS))
    runs = [(*combos[i % len(combos)], i) for i in range(RUNS)]
    problems: dict[str, str] = {}
    limit = trio.CapacityLimiter(16)

    async def one(client: httpx.AsyncClient, run: tuple[str, str, int, int]) -> None:
        async with limit:
            response = await client.post("/v1/chat/completions", json=_body(*run))
        problem = _problem(run[0], run[1], response)
        if problem is not None:
            problems["/".join(map(str, run))] = problem

    async with httpx.AsyncClient(base_url=server, timeout=300) as client, \
            trio.open_nursery() as nursery:
        for run in runs:
            nursery.start_soon(one, client, run)
    assert not problems, json.dumps(problems, indent=1)


@pytest.mark.parametrize("mode", ["named_tool", "json_schema"])
def test_a_budget_too_small_for_the_shortest_output_is_a_400(server: str, mode: str) -> None:
    """A constraint that cannot be met in max_tokens is refused, not answered with a cut."""
    r = httpx.post(server + "/v1/chat/completions",
                   json=_body("pydantic_person", mode, 5, 0), timeout=60)
    assert r.status_code == 400, r.text
    assert "max_tokens=5 is too small" in r.json()["error"]["message"]

"""Hostile requests to Anthropic's Messages API: every refusal in Anthropic's error shape with
Anthropic's status, the key accepted as Anthropic's clients send it (``x-api-key``) or as
OpenAI's do, and the server unharmed (``watched``)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.hostile.conftest import KEY, MODEL, HostileServer, watched
from tests.hostile.test_http_inputs import BIG_INT, HOLE, LONE, nested, with_raw

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
HI = [{"role": "user", "content": "hi"}]
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01",
           "Content-Type": "application/json"}


def anthropic_error(r: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    """The ``error`` object of an Anthropic-shaped error with this status and type."""
    assert r.status_code == status, (r.status_code, r.text[:500])
    body = r.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    error = body["error"]
    assert set(error) == {"type", "message"} and error["type"] == kind, body
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.mark.parametrize("headers", [
    {}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"},
    {"x-api-key": "", "Authorization": "Basic " + KEY},
], ids=["none", "wrong-x-api-key", "wrong-bearer", "not-a-key"])
@pytest.mark.parametrize("path", [MESSAGES, COUNT])
def test_no_key_is_an_anthropic_401(hostile_server: HostileServer, path: str,
                                    headers: dict[str, str]) -> None:
    with watched(hostile_server):
        r = httpx.post(hostile_server.base + path, json={"max_tokens": 1, "messages": HI},
                       headers=headers, timeout=30)
        anthropic_error(r, 401, "authentication_error")


def test_the_sdk_authenticates_either_way(hostile_server: HostileServer) -> None:
    with watched(hostile_server):
        by_key = anthropic.Anthropic(base_url=hostile_server.base, api_key=KEY, max_retries=0)
        by_token = anthropic.Anthropic(base_url=hostile_server.base, auth_token=KEY,
                                       max_retries=0)
        for client in (by_key, by_token):
            message = client.messages.create(model=MODEL, max_tokens=2, messages=HI)
            assert message.usage.output_tokens <= 2
            assert client.messages.count_tokens(model=MODEL, messages=HI).input_tokens > 0
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=hostile_server.base, api_key="nope", max_retries=0
                                ).messages.create(model=MODEL, max_tokens=2, messages=HI)


@pytest.mark.parametrize(("body", "raw", "says"), [
    ({"max_tokens": 1, "messages": [{"role": "user", "content": HOLE}]}, LONE, "surrogate"),
    ({"max_tokens": 1, "messages": HI, "system": HOLE}, LONE, "surrogate"),
    ({"max_tokens": HOLE, "messages": HI}, BIG_INT, "too large"),
    ({"max_tokens": 1, "messages": HI, "temperature": HOLE}, "NaN", "NaN"),
    ({"max_tokens": 1, "messages": HOLE}, nested(1000), "nested"),
    ({"max_tokens": 1, "messages": HI, "metadata": {"user_id": HOLE}}, LONE, "surrogate"),
])
def test_unparseable_bodies_are_anthropic_400s(hostile_server: HostileServer, body: dict,
                                               raw: str, says: str) -> None:
    with watched(hostile_server):
        r = httpx.post(hostile_server.base + MESSAGES, content=with_raw(body, raw),
                       headers=HEADERS, timeout=30)
        error = anthropic_error(r, 400, "invalid_request_error")
    assert "not valid JSON" in error["message"] and says in error["message"], error


def _tool_use(call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [
        {"type": "tool_use", "id": call_id, "name": "f", "input": {}}]}


def _tool_result(call_id: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call_id, "content": "ok", **extra}]}


TOOL = {"name": "f", "input_schema": {"type": "object"}}

#: Bodies that parse and are wrong: (body, what the message must name).
WRONG = [
    ({"messages": HI}, "max_tokens"),
    ({"max_tokens": 0, "messages": HI}, "max_tokens"),
    ({"max_tokens": 1}, "messages"),
    ({"max_tokens": 1, "messages": []}, "messages"),
    ({"max_tokens": 1, "messages": "hi"}, "messages"),
    ({"max_tokens": 1, "messages": [{"role": "tool", "content": "x"}]}, "role"),
    ({"max_tokens": 1, "messages": [{"role": "user"}]}, "content"),
    ({"max_tokens": 1, "messages": [{"role": "user", "content": 5}]}, "content"),
    ({"max_tokens": 1, "messages": [{"role": "user", "content": [{"text": "x"}]}]}, "type"),
    ({"max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {}}]}]}, "'document'"),
    ({"max_tokens": 1, "messages": [*HI, _tool_use("a"), _tool_result("b")]}, "'b'"),
    ({"max_tokens": 1, "messages": [_tool_result("a")]}, "'a'"),
    ({"max_tokens": 1, "messages": [*HI, _tool_use("a"), _tool_result(5)]}, "tool_use_id"),
    ({"max_tokens": 1, "messages": [*HI, _tool_use("a"), _tool_result("a", is_error="yes")]},
     "is_error"),
    ({"max_tokens": 1, "messages": [*HI, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "f", "input": "{}"}]}]}, "input"),
    ({"max_tokens": 1, "messages": [*HI, {"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "x"}]}]}, "'redacted_thinking'"),
    ({"max_tokens": 1, "messages": HI, "system": [{"type": "image"}]}, "system"),
    ({"max_tokens": 1, "messages": HI, "tools": {"name": "f"}}, "tools"),
    ({"max_tokens": 1, "messages": HI, "tools": [{"name": "", "input_schema": {}}]}, "name"),
    ({"max_tokens": 1, "messages": HI, "tools": [TOOL], "tool_choice": "any"}, "tool_choice"),
    ({"max_tokens": 1, "messages": HI, "tools": [TOOL], "tool_choice": {"type": "all"}},
     "tool_choice"),
    ({"max_tokens": 1, "messages": HI, "tools": [TOOL],
      "tool_choice": {"type": "tool", "name": "g"}}, "'g'"),
    ({"max_tokens": 1, "messages": HI, "tool_choice": {"type": "any"}}, "tools"),
    ({"max_tokens": 1, "messages": HI, "tools": [{"name": "f", "input_schema": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}}],
      "tool_choice": {"type": "any"}}, "missing"),
    ({"max_tokens": 1, "messages": HI, "thinking": {"type": "sometimes"}}, "thinking"),
    ({"max_tokens": 9, "messages": HI, "thinking": {"type": "enabled"}}, "budget_tokens"),
    ({"max_tokens": 9, "messages": HI, "thinking": {"type": "enabled",
                                                    "budget_tokens": True}}, "budget_tokens"),
    ({"max_tokens": 9, "messages": [*HI, {"role": "assistant", "content": "So"}],
      "thinking": {"type": "enabled", "budget_tokens": 4}}, "prefill"),
    ({"max_tokens": 9, "messages": HI, "output_config": {"format": {"type": "regex"}}},
     "output_config"),
    ({"max_tokens": 9, "messages": HI, "thinking": {"type": "adaptive"},
      "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
     "thinking"),
    ({"max_tokens": 1, "messages": HI, "stop_sequences": "x"}, "stop_sequences"),
    ({"max_tokens": 1, "messages": HI, "metadata": {"session": "x"}}, "metadata"),
    ({"max_tokens": 1, "messages": HI, "mcp_servers": [{"url": "http://127.0.0.1:1"}]},
     "mcp_servers"),
    ({"max_tokens": 1, "messages": HI, "n": 2}, "n"),
    ({"max_tokens": 100000, "messages": HI}, "context length"),
]


@pytest.mark.parametrize(("body", "says"), WRONG)
def test_wrong_bodies_are_anthropic_400s(hostile_server: HostileServer, body: dict,
                                         says: str) -> None:
    with watched(hostile_server):
        r = httpx.post(hostile_server.base + MESSAGES, json={"model": MODEL, **body},
                       headers=HEADERS, timeout=30)
        error = anthropic_error(r, 400, "invalid_request_error")
    assert says in error["message"], error


def test_other_refusals_keep_anthropic_s_shape(hostile_server: HostileServer) -> None:
    with watched(hostile_server):
        base = hostile_server.base
        r = httpx.post(base + MESSAGES, json={"model": "gpt-nope", "max_tokens": 1,
                                              "messages": HI}, headers=HEADERS)
        anthropic_error(r, 404, "not_found_error")
        r = httpx.get(base + MESSAGES, headers=HEADERS)
        anthropic_error(r, 405, "invalid_request_error")
        r = httpx.post(base + MESSAGES, content=b"[" * 40_000_000, headers=HEADERS, timeout=60)
        anthropic_error(r, 413, "request_too_large")
        # The OpenAI routes beside them keep OpenAI's shape.
        r = httpx.post(base + "/v1/chat/completions", json={"messages": HI},
                       headers={"x-api-key": "wrong"})
        assert r.status_code == 401 and set(r.json()) == {"error"}


def test_a_stream_of_a_bad_request_is_a_plain_400(hostile_server: HostileServer) -> None:
    """Refused before any byte of the stream: an ordinary error answer, not an event."""
    with watched(hostile_server):
        r = httpx.post(hostile_server.base + MESSAGES, headers=HEADERS, timeout=30,
                       content=json.dumps({"max_tokens": 1, "stream": True,
                                           "messages": [{"role": "bot", "content": "x"}]}))
        anthropic_error(r, 400, "invalid_request_error")

"""``schemas/openapi.json``: a sound document, served as is, and true to the real server.

Real responses (plain, streamed and errors) are validated against the schema documented for
their route, method, status and media type, so a field the server drops, renames or retypes
fails here. Request bodies the server accepts or rejects are checked against the documented
request schemas the same way, so documented types and ranges follow the server's.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from jsonschema import Draft202012Validator

from izh_trio import __version__
from izh_trio.frontend.app import create_app
from izh_trio.frontend.settings import Settings
from tests.e2e.conftest import PACED, free_port, running_server, serve_args

SPEC_PATH = Path(__file__).resolve().parents[2] / "schemas" / "openapi.json"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
AUTOMATIC = {"HEAD", "OPTIONS"}  # added to every rule by Quart itself
MODEL = "qwen3-test"
TIMEOUT = 120
GREEDY = {"temperature": 0, "ignore_eos": True}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"enum": ["UTC", "CET", "PST"]}},
    "required": ["tz"], "additionalProperties": False}}}
HI = [{"role": "user", "content": "hi"}]
#: The routes anyone may ask when keys are configured; every other one needs a key.
OPEN_PATHS = {"/health", "/ready", "/metrics", "/version", "/openapi.json"}


# --- the document, and validation against it -------------------------------------------------


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return json.loads(SPEC_PATH.read_text())


def pointer(doc: dict[str, Any], ref: str) -> Any:
    """Follow a local ``#/a/b`` reference (RFC 6901 escapes included)."""
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def deref(doc: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in obj:
        obj = pointer(doc, obj["$ref"])
    return obj


def validator(spec: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    """A Draft 2020-12 validator whose ``#/components/...`` references resolve into ``spec``."""
    return Draft202012Validator({**schema, "components": spec["components"]})


def validate(spec: dict[str, Any], schema: dict[str, Any], instance: Any) -> None:
    validator(spec, schema).validate(instance)


def component(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def documented(spec: dict[str, Any], method: str, path: str, status: int) -> dict[str, Any]:
    """The response object the document gives for this route, method and status.

    A path the server does not serve, or a method a served path does not accept, answers
    with the document's shared NotFound or MethodNotAllowed response.
    """
    item = spec["paths"].get(path)
    if item is None:
        assert status == 404, (path, status)
        return deref(spec, spec["components"]["responses"]["NotFound"])
    op = item.get(method.lower())
    if op is None:
        assert status == 405, (method, path, status)
        return deref(spec, spec["components"]["responses"]["MethodNotAllowed"])
    responses = op["responses"]
    assert str(status) in responses, f"{method} {path} answered {status}, not documented"
    return deref(spec, responses[str(status)])


def request_schema(spec: dict[str, Any], path: str) -> dict[str, Any]:
    return spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def media_type(response: httpx.Response) -> str:
    return response.headers["content-type"].split(";")[0].strip()


def check(spec: dict[str, Any], method: str, path: str, response: httpx.Response) -> Any:
    """Validate a (non-streamed) response against its documented status and media type."""
    doc = documented(spec, method, path, response.status_code)
    content = doc["content"]
    mt = media_type(response)
    assert mt in content, f"{method} {path} {response.status_code}: {mt} not documented"
    body = response.json() if mt == "application/json" else response.text
    validate(spec, content[mt]["schema"], body)
    for name in response.headers:  # a header the server sends is documented for it
        if name.lower() in ("x-request-id", "retry-after", "allow"):
            assert any(h.lower() == name.lower() for h in doc.get("headers", {})), name
    return body


def post(server: str, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(server + path, json=body, timeout=TIMEOUT, **kwargs)


def event_schema(spec: dict[str, Any], path: str) -> dict[str, Any]:
    """The schema of one stream event's JSON: the ``contentSchema`` of the data of the
    route's ``itemSchema`` (OpenAPI 3.2), the JSON branch beside the literal ``[DONE]``."""
    media = documented(spec, "post", path, 200)["content"]["text/event-stream"]
    data = deref(spec, media["itemSchema"])["properties"]["data"]
    [json_data] = [branch for branch in data["anyOf"] if "contentSchema" in branch]
    assert json_data["contentMediaType"] == "application/json"
    return json_data["contentSchema"]


def stream(spec: dict[str, Any], server: str, path: str, body: dict[str, Any]) -> list[dict]:
    """Every ``data:`` event of a stream, each validated against the documented event schema,
    and the whole stream (its events as an SSE parser gives them) against the stream's."""
    with httpx.stream("POST", server + path, json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200, r.read()
        assert media_type(r) == "text/event-stream"
        media = documented(spec, "post", path, 200)["content"]["text/event-stream"]
        datas = [line[len("data: "):] for line in r.iter_lines() if line]
    assert datas and datas[-1] == "[DONE]", datas[-3:]
    assert all(d != "[DONE]" for d in datas[:-1])
    parsed = [{"event": "message", "data": d} for d in datas]
    validate(spec, media["schema"], parsed)
    item_validator = validator(spec, media["itemSchema"])
    for item in parsed:  # contentSchema is an annotation here: the JSON is checked below
        item_validator.validate(item)
    events = [json.loads(d) for d in datas[:-1]]
    event_validator = validator(spec, event_schema(spec, path))
    for event in events:
        assert "error" not in event, event
        event_validator.validate(event)
    return events


def walk(node: Any) -> Any:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


# --- (1) the document itself ------------------------------------------------------------------


def test_document_is_well_formed(spec: dict[str, Any]) -> None:
    assert spec["openapi"].startswith("3.2.")  # 3.2: itemSchema describes each SSE event
    assert spec["info"]["version"] == __version__
    assert spec["info"]["title"]
    # Every $ref resolves, and every schema component is a valid Draft 2020-12 schema.
    refs = [n["$ref"] for n in walk(spec) if isinstance(n.get("$ref"), str)]
    assert refs
    for ref in refs:
        pointer(spec, ref)
    for schema in spec["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    operation_ids = []
    for path, item in spec["paths"].items():
        ops = {m: op for m, op in item.items() if m in METHODS}
        assert ops, f"{path} has no operation"
        for method, op in ops.items():
            operation_ids.append(op["operationId"])
            statuses = op["responses"]
            assert any(s.startswith("2") for s in statuses), (method, path)
            for status, response in statuses.items():
                response = deref(spec, response)
                assert "X-Request-Id" in response.get("headers", {}), (method, path, status)
                for media in response.get("content", {}).values():
                    Draft202012Validator.check_schema(media["schema"])
                    if "itemSchema" in media:
                        Draft202012Validator.check_schema(media["itemSchema"])
            names = {deref(spec, p)["name"] for p in op.get("parameters", [])}
            assert "X-Request-Id" in names, (method, path)
            # Bearer auth guards every route but the probes and the server's self-description,
            # and only when keys are configured.
            if path not in OPEN_PATHS:
                assert op["security"] == [{"bearerAuth": []}, {}], path
                assert "401" in statuses
            else:
                assert "security" not in op and "401" not in statuses, path
            if "requestBody" in op:
                assert "413" in statuses and "400" in statuses, path
                schema = op["requestBody"]["content"]["application/json"]["schema"]
                assert deref(spec, schema)["additionalProperties"] is True, path
    assert len(operation_ids) == len(set(operation_ids))
    for path in ("/v1/completions", "/v1/chat/completions"):
        content = spec["paths"][path]["post"]["responses"]["200"]["content"]
        assert set(content) == {"application/json", "text/event-stream"}
        # The stream: an array of events (one [DONE]); each an SSE event whose data is
        # [DONE] or the JSON of the route's stream event.
        sse = content["text/event-stream"]
        assert sse["schema"]["type"] == "array"
        item = deref(spec, sse["itemSchema"])
        assert item["required"] == ["data"]
        assert {"const": "[DONE]"}.items() <= item["properties"]["data"]["anyOf"][0].items()
        name = "CompletionStreamEvent" if path == "/v1/completions" \
            else "ChatCompletionStreamEvent"
        assert event_schema(spec, path) == component(name)
    for name in ("CompletionChunk", "ChatCompletionChunk", "ErrorResponse", "Usage"):
        assert name in spec["components"]["schemas"]
    assert spec["components"]["securitySchemes"]["bearerAuth"] == {
        **spec["components"]["securitySchemes"]["bearerAuth"], "type": "http",
        "scheme": "bearer"}


def test_every_registered_route_is_documented_and_nothing_else(spec: dict[str, Any]) -> None:
    app = create_app(Settings())
    served: dict[str, set[str]] = {}
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        served.setdefault(path, set()).update(set(rule.methods or ()) - AUTOMATIC)
    documented_routes = {path: {m.upper() for m in item if m in METHODS}
                         for path, item in spec["paths"].items()}
    assert documented_routes == served


# --- (2) the served document ------------------------------------------------------------------


def test_served_document_is_the_file(server: str, spec: dict[str, Any]) -> None:
    r = httpx.get(server + "/openapi.json", timeout=TIMEOUT)
    assert r.status_code == 200
    assert media_type(r) == "application/json"
    assert r.content == SPEC_PATH.read_bytes()
    assert check(spec, "GET", "/openapi.json", r) == spec


# --- (3) real responses -----------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    {"prompt": ["The river", [15, 99, 1200]], "n": 2, "max_tokens": 4, "echo": True,
     "logprobs": 2, **GREEDY},
    {"prompt": "Once upon a time", "max_tokens": 3, "prompt_logprobs": 1, "logprobs": 0,
     "stop": None, "logit_bias": None, "seed": 3, "temperature": 1.0},
], ids=["batch-n-echo-logprobs", "single"])
def test_completions_validate(server: str, spec: dict[str, Any], body: dict) -> None:
    validate(spec, request_schema(spec, "/v1/completions"), body)
    r = post(server, "/v1/completions", body, headers={"X-Request-Id": "openapi-cmpl"})
    assert r.status_code == 200, r.text
    out = check(spec, "POST", "/v1/completions", r)
    assert r.headers["X-Request-Id"] == out["id"] == "openapi-cmpl"
    prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
    assert len(out["choices"]) == len(prompts) * body.get("n", 1)
    if body.get("echo"):
        for choice in out["choices"]:
            assert choice["logprobs"]["token_logprobs"][0] is None


def test_stop_reasons_validate_as_string_and_integer(server: str, spec: dict[str, Any]) -> None:
    token = post(server, "/tokenize", {"prompt": " the"}).json()["tokens"][-1]
    text = post(server, "/detokenize", {"tokens": [token]}).json()["prompt"]
    forced = {"prompt": "x", "max_tokens": 4, "temperature": 0, "logit_bias": {str(token): 100}}
    by_string = post(server, "/v1/completions", {**forced, "stop": [text]})
    by_token = post(server, "/v1/chat/completions", {
        "messages": HI, "max_tokens": 4, "temperature": 0, "logit_bias": {str(token): 100},
        "stop_token_ids": [token]})
    c = check(spec, "POST", "/v1/completions", by_string)["choices"][0]
    assert (c["finish_reason"], c["stop_reason"]) == ("stop", text)
    c = check(spec, "POST", "/v1/chat/completions", by_token)["choices"][0]
    assert (c["finish_reason"], c["stop_reason"]) == ("stop", token)


def test_chat_completions_validate(server: str, spec: dict[str, Any]) -> None:
    body = {"model": MODEL, "messages": [{"role": "system", "content": "Be terse."}, *HI],
            "n": 2, "max_completion_tokens": 5, "logprobs": True, "top_logprobs": 3, **GREEDY}
    validate(spec, request_schema(spec, "/v1/chat/completions"), body)
    out = check(spec, "POST", "/v1/chat/completions", post(server, "/v1/chat/completions", body))
    assert [c["index"] for c in out["choices"]] == [0, 1]
    for choice in out["choices"]:
        assert len(choice["logprobs"]["content"]) == 5
        assert all(len(e["top_logprobs"]) == 3 for e in choice["logprobs"]["content"])
    plain = post(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 2})
    assert check(spec, "POST", "/v1/chat/completions", plain)["choices"][0]["logprobs"] is None


def test_chat_legacy_function_call_validates(server: str, spec: dict[str, Any]) -> None:
    body = {"messages": [{"role": "user", "content": "What time is it?"}],
            "functions": [TIME_TOOL["function"]], "function_call": {"name": "get_time"},
            "seed": 1, "temperature": 1.0, "max_tokens": 200}
    validate(spec, request_schema(spec, "/v1/chat/completions"), body)
    out = check(spec, "POST", "/v1/chat/completions", post(server, "/v1/chat/completions", body))
    choice = out["choices"][0]
    assert choice["finish_reason"] == "function_call" and "tool_calls" not in choice["message"]
    assert choice["message"]["function_call"]["name"] == "get_time"
    events = stream(spec, server, "/v1/chat/completions", {**body, "stream": True})
    assert any("function_call" in e["choices"][0]["delta"] for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "function_call"


def test_chat_tool_calls_validate(server: str, spec: dict[str, Any]) -> None:
    body = {"messages": [{"role": "user", "content": "What time is it?"}], "tools": [TIME_TOOL],
            "tool_choice": "required", "parallel_tool_calls": False, "seed": 1,
            "temperature": 1.0, "max_tokens": 200}
    validate(spec, request_schema(spec, "/v1/chat/completions"), body)
    out = check(spec, "POST", "/v1/chat/completions", post(server, "/v1/chat/completions", body))
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    events = stream(spec, server, "/v1/chat/completions", {**body, "stream": True})
    deltas = [e["choices"][0]["delta"] for e in events]
    assert any("tool_calls" in d for d in deltas)
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_completion_stream_chunks_validate(server: str, spec: dict[str, Any]) -> None:
    body = {"prompt": ["Count", [15, 99]], "n": 2, "max_tokens": 5, "logprobs": 1, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}, **GREEDY}
    validate(spec, request_schema(spec, "/v1/completions"), body)
    events = stream(spec, server, "/v1/completions", body)
    last = events[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 20
    finished = {e["choices"][0]["index"] for e in events[:-1]
                if e["choices"][0]["finish_reason"] is not None}
    assert finished == {0, 1, 2, 3}
    assert all("usage" in e for e in events)
    # Without stream_options: no usage anywhere, still valid chunks.
    plain = stream(spec, server, "/v1/completions", {"prompt": "a", "max_tokens": 3,
                                                       "stream": True})
    assert plain and all("usage" not in e and len(e["choices"]) == 1 for e in plain)


def test_chat_stream_chunks_validate(server: str, spec: dict[str, Any]) -> None:
    body = {"messages": HI, "n": 2, "max_tokens": 4, "logprobs": True, "top_logprobs": 2,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}, **GREEDY}
    validate(spec, request_schema(spec, "/v1/chat/completions"), body)
    events = stream(spec, server, "/v1/chat/completions", body)
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 8
    for index in (0, 1):
        mine = [e["choices"][0] for e in events if e["choices"]
                and e["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert mine[-1]["delta"] == {} and mine[-1]["finish_reason"] == "length"
        assert sum(len((c["logprobs"] or {}).get("content") or []) for c in mine) == 4
    assert all("usage" in e for e in events)


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/ready", "/version", "/metrics"])
def test_probe_routes_validate(server: str, spec: dict[str, Any], path: str) -> None:
    r = httpx.get(server + path, timeout=TIMEOUT, headers={"X-Request-Id": "probe-1"})
    assert r.status_code == 200, r.text
    body = check(spec, "GET", path, r)
    assert r.headers["X-Request-Id"] == "probe-1"
    if path == "/v1/models":
        assert [m["id"] for m in body["data"]] == [MODEL]
    if path == "/version":
        assert body == {"version": __version__}
    if path == "/metrics":
        assert "# TYPE" in body


def test_tokenize_and_detokenize_validate(server: str, spec: dict[str, Any]) -> None:
    bodies = [{"prompt": "hello world", "return_token_strs": True},
              {"prompt": ""},
              {"model": MODEL, "messages": HI, "add_generation_prompt": True,
               "chat_template_kwargs": {"enable_thinking": False}}]
    outs = []
    for body in bodies:
        validate(spec, request_schema(spec, "/tokenize"), body)
        outs.append(check(spec, "POST", "/tokenize", post(server, "/tokenize", body)))
    assert outs[0]["token_strs"] and outs[1]["count"] == 0 and outs[2]["token_strs"] is None
    for tokens in (outs[2]["tokens"], []):
        body = {"tokens": tokens}
        validate(spec, request_schema(spec, "/detokenize"), body)
        check(spec, "POST", "/detokenize", post(server, "/detokenize", body))


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), [
    ("POST", "/v1/completions", {"prompt": "x", "n": 0}, 400, 400),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 100000}, 400,
     "context_length_exceeded"),
    ("POST", "/v1/chat/completions", {"messages": HI, "top_logprobs": 2}, 400, 400),
    ("POST", "/v1/chat/completions", {"messages": HI, "guided_regex": "[a-"}, 400, 400),
    ("POST", "/tokenize", {"prompt": "x", "messages": HI}, 400, 400),
    ("POST", "/detokenize", {"tokens": [10**9]}, 400, 400),
    ("POST", "/v1/completions", {"prompt": "x", "model": "nope"}, 404, "model_not_found"),
    ("POST", "/v1/chat/completions", {"messages": HI, "model": "nope"}, 404, "model_not_found"),
    ("POST", "/tokenize", {"prompt": "x", "model": "nope"}, 404, "model_not_found"),
    ("POST", "/detokenize", {"tokens": [1], "model": "nope"}, 404, "model_not_found"),
    ("GET", "/v1/no-such-route", None, 404, 404),
    ("POST", "/nowhere", {}, 404, 404),
    ("GET", "/v1/completions", None, 405, 405),
    ("DELETE", "/v1/models", None, 405, 405),
    ("POST", "/health", {}, 405, 405),
])
def test_error_bodies_validate(server: str, spec: dict[str, Any], method: str, path: str,
                               body: Any, status: int, code: int | str) -> None:
    r = httpx.request(method, server + path, json=body, timeout=TIMEOUT,
                      headers={"X-Request-Id": "err-1"})
    assert r.status_code == status, r.text
    out = check(spec, method, path, r)
    assert out["error"]["code"] == code
    assert r.headers["X-Request-Id"] == "err-1"
    if status == 405:
        assert method not in r.headers["Allow"].split(", ")


def test_a_body_that_is_not_json_is_a_documented_400(server: str, spec: dict[str, Any]) -> None:
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        r = httpx.post(server + path, content=b"{not json", timeout=TIMEOUT,
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 400
        check(spec, "POST", path, r)


# Bodies the server accepts (200) and rejects (400 naming ``param``), with the documented
# request schema agreeing both ways: its types and ranges are the server's.
ACCEPTED = [
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "n": 16, "temperature": 2, "top_p": 1,
                         "top_k": -1, "min_p": 1, "presence_penalty": -2,
                         "frequency_penalty": 2, "repetition_penalty": 10,
                         "logit_bias": {"5": -100}, "logprobs": 20, "prompt_logprobs": 0,
                         "stop": "zz", "stop_token_ids": None, "best_of": 16, "suffix": "",
                         "priority": -3, "cache_salt": "s", "user": "u", "unknown": [1]}),
    ("/v1/completions", {"prompt": [[1, 2], "ab"], "max_tokens": 1, "stream_options": None,
                         "response_format": {"type": "text"}, "min_tokens": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "developer", "content": [
        {"type": "text", "text": "Be brief."}]}, {"role": "user", "content": "hi", "name": "a"}],
        "max_tokens": 1, "top_logprobs": None, "tools": None, "tool_choice": "none",
        "response_format": None, "structured_outputs": {"choice": ["a", "b"]}}),
    ("/v1/chat/completions", {"messages": [
        *HI, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_time", "arguments": "{\"tz\": \"UTC\"}"}}]},
        {"role": "tool", "content": "12:00", "tool_call_id": "call_1"}],
        "tools": [TIME_TOOL], "max_completion_tokens": 1}),
    # null is the default for every optional field, nested stream_options members included
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "n": None, "stream": None,
                         "echo": None, "logprobs": None, "presence_penalty": None,
                         "frequency_penalty": None, "temperature": None, "stop": None,
                         "stream_options": {"include_usage": None}, "prompt_cache_key": None,
                         "min_tokens": None, "priority": None}),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "n": None, "stream": None,
                              "logprobs": None, "parallel_tool_calls": None,
                              "presence_penalty": None, "functions": None,
                              "function_call": None, "reasoning_effort": None, "audio": None,
                              "modalities": None, "prediction": None,
                              "web_search_options": None, "metadata": None, "store": None}),
    # OpenAI's informational fields, and those it honours here
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "service_tier": "auto",
                              "user": "u", "metadata": {"k": "v"}, "store": False,
                              "safety_identifier": "s", "verbosity": "low",
                              "modalities": ["text"], "reasoning_effort": "none",
                              "prompt_cache_key": "p", "cache_salt": "p"}),
    ("/v1/chat/completions", {"messages": [
        *HI, {"role": "assistant", "content": None, "function_call": {
            "name": "get_time", "arguments": "{\"tz\": \"UTC\"}"}},
        {"role": "function", "name": "get_time", "content": "12:00"}],
        "functions": [TIME_TOOL["function"]], "function_call": "none", "max_tokens": 1}),
    # the cross-field rules' other side: what they let through
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "n": 2, "best_of": 2}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "best_of": 1}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "response_format": {"type": "text"},
                         "guided_choice": ["a", "b"], "guided_regex": None}),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "structured_outputs": {
        "choice": ["a", "b"], "json_object": False, "regex": None}, "guided_json": None}),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 1, "tool_choice": "none",
                              "logprobs": False, "top_logprobs": None}),
    ("/v1/chat/completions", {"messages": [*HI, {"role": "assistant", "content": "Hel"}],
                              "continue_final_message": True, "add_generation_prompt": False,
                              "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": [
        *HI, {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function",
             "function": {"name": "get_time", "arguments": {"tz": "UTC"}}}]},
        {"role": "tool", "content": "12:00"}], "max_tokens": 1}),
]
REJECTED = [
    ("/v1/completions", {"prompt": "x", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "x", "n": 17}, "n"),
    ("/v1/completions", {"prompt": "x", "temperature": 2.5}, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "x", "top_k": -2}, "top_k"),
    ("/v1/completions", {"prompt": "x", "min_p": 1.5}, "min_p"),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    ("/v1/completions", {"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": -1}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "min_tokens": -1}, "min_tokens"),
    ("/v1/completions", {"prompt": "x", "stop": 5}, "stop"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 500}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": None}, "prompt"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"continuous_usage_stats": 1}},
     "stream_options"),
    ("/v1/completions", {"prompt": "x", "echo": 1}, "echo"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": "yes"}},
     "stream_options"),
    ("/v1/completions", {"prompt": "x", "suffix": "tail"}, "suffix"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": [True]}, "prompt"),
    ("/v1/completions", {"n": 1}, "prompt"),
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "yaml"}}, "response_format"),
    ("/v1/completions", {"prompt": "x", "guided_choice": []}, "guided_choice"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ("/v1/chat/completions", {"messages": None}, "messages"),
    ("/v1/chat/completions", {"messages": HI, "logprobs": 1}, "logprobs"),
    ("/v1/chat/completions", {"messages": HI, "audio": {"voice": "alloy", "format": "wav"}},
     "audio"),
    ("/v1/chat/completions", {"messages": HI, "modalities": ["text", "audio"]}, "modalities"),
    ("/v1/chat/completions", {"messages": HI, "prediction": {"type": "content",
                                                             "content": "x"}}, "prediction"),
    ("/v1/chat/completions", {"messages": HI, "web_search_options": {}}, "web_search_options"),
    ("/v1/chat/completions", {"messages": HI, "reasoning_effort": "extreme"},
     "reasoning_effort"),
    ("/v1/chat/completions", {"messages": HI, "verbosity": "loud"}, "verbosity"),
    ("/v1/chat/completions", {"messages": HI, "metadata": {"k": 1}}, "metadata"),
    ("/v1/chat/completions", {"messages": HI, "store": "yes"}, "store"),
    ("/v1/chat/completions", {"messages": HI, "prompt_cache_key": ""}, "prompt_cache_key"),
    ("/v1/chat/completions", {"messages": HI, "functions": [TIME_TOOL["function"]],
                              "tools": [TIME_TOOL]}, "functions"),
    ("/v1/chat/completions", {"messages": HI, "tools": [TIME_TOOL], "function_call": "auto"},
     "function_call"),
    ("/v1/chat/completions", {"messages": HI, "functions": [{"name": ""}]}, "functions"),
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": 0},
     "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": HI, "tool_choice": "sometimes"}, "tool_choice"),
    ("/v1/chat/completions", {"messages": HI, "tools": [{"type": "retrieval"}]}, "tools"),
    ("/v1/chat/completions", {"messages": HI, "chat_template_kwargs": {"messages": []}},
     "chat_template_kwargs"),
    # cross-field rules, stated in the request schemas
    ("/v1/completions", {"prompt": "x", "n": 2, "best_of": 3}, "best_of"),
    ("/v1/completions", {"prompt": "x", "best_of": 2}, "best_of"),
    ("/v1/completions", {"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]},
     "guided_choice"),
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_object"},
                         "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"regex": "a",
                                                               "json_object": True}},
     "structured_outputs"),
    ("/v1/completions", {"prompt": "x", "guided_json": True}, "guided_json"),
    ("/v1/completions", {"prompt": "x", "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": False}}},
     "response_format"),
    ("/v1/chat/completions", {"messages": HI, "guided_grammar": "start: \"a\"",
                              "response_format": {"type": "json_schema",
                                                  "json_schema": {"schema": {}}}},
     "guided_grammar"),
    ("/v1/chat/completions", {"messages": HI, "logprobs": False, "top_logprobs": 1},
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": [*HI, {"role": "assistant", "content": "Hel"}],
                              "continue_final_message": True}, "continue_final_message"),
    ("/v1/chat/completions", {"messages": HI, "tool_choice": "auto"}, "tool_choice"),
    ("/v1/chat/completions", {"messages": HI, "tools": [], "tool_choice": "required"},
     "tool_choice"),
    ("/v1/chat/completions", {"messages": HI, "function_call": {"name": "get_time"}},
     "function_call"),
    ("/v1/chat/completions", {"messages": HI, "chat_template": "{{ messages }}"},
     "chat_template"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": None,
                                            "tool_calls": []}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"function": {"name": "f", "arguments": "{}"}}]}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x", "function_call": {
        "name": "f", "arguments": "{}"}}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "function_call": {
        "name": "f", "arguments": "{}"}, "tool_calls": [
        {"function": {"name": "f", "arguments": "{}"}}]}]}, "messages"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
]


@pytest.mark.parametrize(("path", "body"), ACCEPTED)
def test_accepted_requests_match_the_request_schema(server: str, spec: dict[str, Any],
                                                    path: str, body: dict) -> None:
    validate(spec, request_schema(spec, path), body)
    r = post(server, path, body)
    assert r.status_code == 200, r.text
    check(spec, "POST", path, r)


@pytest.mark.parametrize(("path", "body", "param"), REJECTED)
def test_rejected_requests_fail_the_request_schema(server: str, spec: dict[str, Any], path: str,
                                                   body: dict, param: str) -> None:
    with pytest.raises(jsonschema.ValidationError):
        validate(spec, request_schema(spec, path), body)
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    assert check(spec, "POST", path, r)["error"]["param"] == param


@pytest.fixture(scope="module")
def guarded(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server with an API key, a token budget, a one-request cap and a small body limit."""
    port = free_port()
    args = serve_args(hf_dir, port, "--served-model-name", MODEL, "--api-key", "k1",
                      "--rate-limit-tokens-per-minute", "2000", "--max-pending", "1",
                      "--max-body-bytes", "4096")
    log = tmp_path_factory.mktemp("openapi") / "guarded.log"
    # Paced: the stream that holds the one slot below runs 18 s or more, on any machine.
    with running_server(args, log, port=port, env=PACED) as (base, _proc):
        yield base


@pytest.mark.timing
def test_guard_errors_validate(guarded: str, spec: dict[str, Any]) -> None:
    """401, 413, 429 and 503 (capacity) from a real server, each as documented."""
    auth = {"Authorization": "Bearer k1"}
    for method, path, body in (("GET", "/v1/models", None),
                               ("POST", "/v1/completions", {"prompt": "x"}),
                               ("POST", "/v1/chat/completions", {"messages": HI}),
                               ("POST", "/tokenize", {"prompt": "x"}),
                               ("POST", "/detokenize", {"tokens": [1]})):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.request(method, guarded + path, json=body, headers=headers,
                              timeout=TIMEOUT)
            assert r.status_code == 401, r.text
            assert check(spec, method, path, r)["error"]["code"] == "invalid_api_key"
    check(spec, "GET", "/v1/models", httpx.get(guarded + "/v1/models", headers=auth))
    check(spec, "GET", "/health", httpx.get(guarded + "/health"))  # probes need no key

    big = {"prompt": "x" * 5000}
    for path in ("/v1/completions", "/tokenize"):
        r = post(guarded, path, big, headers=auth)
        assert r.status_code == 413, r.text
        check(spec, "POST", path, r)

    # One request alone over the per-minute budget: 429 (no Retry-After can help it).
    r = post(guarded, "/v1/completions", {"prompt": "x", "max_tokens": 2040}, headers=auth)
    assert r.status_code == 429, r.text
    assert check(spec, "POST", "/v1/completions", r)["error"]["code"] == "rate_limit_exceeded"

    # The one slot taken by an open stream: the next generation is a 503 with Retry-After.
    long = {"prompt": "Go on.", "max_tokens": 1800, "stream": True, **GREEDY}
    with httpx.Client(timeout=TIMEOUT, headers=auth) as client, \
            client.stream("POST", guarded + "/v1/completions", json=long) as held:
        assert held.status_code == 200
        r = client.post(guarded + "/v1/chat/completions", json={"messages": HI})
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "1"
        assert check(spec, "POST", "/v1/chat/completions", r)["error"]["code"] \
            == "server_overloaded"


# --- (4) the schemas are strict -------------------------------------------------------------

def test_real_responses_fail_without_any_required_field(server: str,
                                                       spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    completion = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 2,
                                                  "logprobs": 1}).json()
    chat = post(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 2,
                                                 "logprobs": True}).json()
    cases = [  # (top-level schema, response, where in it, the schema of that part)
        ("Completion", completion, lambda d: d, "Completion"),
        ("Completion", completion, lambda d: d["choices"][0], "CompletionChoice"),
        ("Completion", completion, lambda d: d["choices"][0]["logprobs"], "CompletionLogprobs"),
        ("Completion", completion, lambda d: d["usage"], "Usage"),
        ("ChatCompletion", chat, lambda d: d, "ChatCompletion"),
        ("ChatCompletion", chat, lambda d: d["choices"][0], "ChatCompletionChoice"),
        ("ChatCompletion", chat, lambda d: d["choices"][0]["message"], "ChatMessage"),
        ("ChatCompletion", chat, lambda d: d["choices"][0]["logprobs"]["content"][0],
         "ChatTokenLogprob"),
    ]
    for top, response, part, name in cases:
        validate(spec, component(top), response)
        required = schemas[name]["required"]
        assert required
        for key in required:
            broken = copy.deepcopy(response)
            del part(broken)[key]
            with pytest.raises(jsonschema.ValidationError):
                validate(spec, component(top), broken)


COMPLETION = {
    "id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
    "system_fingerprint": "fp_0123456789",
    "choices": [{"index": 0, "text": "hi", "finish_reason": "length", "stop_reason": None,
                 "logprobs": {"tokens": ["h", "i"], "token_logprobs": [None, -1.5],
                              "top_logprobs": [None, {"i": -1.5}], "text_offset": [0, 1]}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3,
              "prompt_tokens_details": {"cached_tokens": 0}},
}
CHAT = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
    "system_fingerprint": "fp_0123456789",
    "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": 7,
                 "message": {"role": "assistant", "content": "hi"},
                 "logprobs": {"content": [{"token": "hi", "logprob": -0.5, "bytes": [104, 105],
                                           "top_logprobs": [{"token": "hi", "logprob": -0.5,
                                                             "bytes": [104, 105]}]}]}}],
    "usage": COMPLETION["usage"],
}
CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
         "system_fingerprint": "fp_0123456789",
         "choices": [{"index": 0, "delta": {"content": "h"}, "logprobs": None,
                      "finish_reason": None, "stop_reason": None}]}
ERROR = {"error": {"message": "no", "type": "BadRequestError", "param": None, "code": 400}}


def _node(doc: Any, dotted: str) -> tuple[Any, str]:
    *parents, last = dotted.split(".")
    for key in parents:
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    return doc, last


def drop(name: str, instance: dict, dotted: str) -> Any:
    def mutate(doc: Any) -> None:
        node, last = _node(doc, dotted)
        del node[last]
    return pytest.param(name, instance, mutate, id=f"{name}-without-{dotted}")


def replace(name: str, instance: dict, dotted: str, value: Any) -> Any:
    def mutate(doc: Any) -> None:
        node, last = _node(doc, dotted)
        node[last] = value
    return pytest.param(name, instance, mutate, id=f"{name}-{dotted}={value!r}")


@pytest.mark.parametrize(("name", "instance", "mutate"), [
    drop("Completion", COMPLETION, "choices.0.finish_reason"),
    drop("Completion", COMPLETION, "choices.0.stop_reason"),
    drop("Completion", COMPLETION, "choices.0.logprobs.text_offset"),
    drop("Completion", COMPLETION, "usage.prompt_tokens_details.cached_tokens"),
    drop("Completion", COMPLETION, "usage"),
    replace("Completion", COMPLETION, "choices.0.finish_reason", "eos"),
    replace("Completion", COMPLETION, "object", "chat.completion"),
    replace("Completion", COMPLETION, "choices.0.stop_reason", 1.5),
    drop("Completion", COMPLETION, "system_fingerprint"),
    replace("Completion", COMPLETION, "system_fingerprint", "fp_x"),
    replace("ChatCompletion", CHAT, "choices.0.message.tool_calls", []),  # none: no key
    replace("ChatCompletion", CHAT, "choices.0.finish_reason", "functions"),
    drop("ChatCompletion", CHAT, "system_fingerprint"),
    drop("ChatCompletionChunk", CHUNK, "system_fingerprint"),
    drop("ChatCompletion", CHAT, "choices.0.message.content"),
    drop("ChatCompletion", CHAT, "choices.0.logprobs.content.0.bytes"),
    drop("ChatCompletion", CHAT, "choices.0.logprobs.content.0.top_logprobs.0.logprob"),
    replace("ChatCompletion", CHAT, "choices.0.logprobs.content.0.logprob", 0.5),
    drop("ChatCompletionChunk", CHUNK, "choices.0.delta"),
    drop("ChatCompletionChunk", CHUNK, "choices"),
    replace("ChatCompletionChunk", CHUNK, "choices", []),  # a usage-only chunk needs usage
    # include_usage: null usage in every chunk but the usage-only one
    replace("ChatCompletionChunk", {**CHUNK, "usage": None}, "choices", []),
    replace("ChatCompletionChunk", {**CHUNK, "usage": None}, "usage", 0),
    drop("ChatCompletionStreamEvent", CHUNK, "id"),
    drop("ErrorResponse", ERROR, "error.param"),
    replace("ErrorResponse", ERROR, "error.code", None),
])
def test_schemas_are_strict(spec: dict[str, Any], name: str, instance: dict, mutate: Any
                            ) -> None:
    schema = component(name)
    validate(spec, schema, instance)  # the intact instance is valid ...
    broken = copy.deepcopy(instance)
    mutate(broken)
    with pytest.raises(jsonschema.ValidationError):  # ... and the damaged one is not
        validate(spec, schema, broken)

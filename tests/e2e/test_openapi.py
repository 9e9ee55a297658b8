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
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
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
    with the document's shared UnknownPath or MethodNotAllowed response.
    """
    item = spec["paths"].get(path)
    if item is None:
        assert status == 404, (path, status)
        return deref(spec, spec["components"]["responses"]["UnknownPath"])
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
    route's ``itemSchema`` (OpenAPI 3.2); for a data-only stream, the JSON branch beside the
    literal ``[DONE]``."""
    media = documented(spec, "post", path, 200)["content"]["text/event-stream"]
    data = deref(spec, media["itemSchema"])["properties"]["data"]
    [json_data] = [branch for branch in data.get("anyOf", [data]) if "contentSchema" in branch]
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


def sse_items(lines: Iterator[str]) -> list[dict[str, str]]:
    """A stream's events as an SSE parser gives them: ``event`` (``message`` when the server
    names none) and ``data`` (its data lines joined)."""
    items: list[dict[str, str]] = []
    event: str | None = None
    datas: list[str] = []
    for line in [*lines, ""]:
        if not line:
            if datas:
                items.append({"event": event or "message", "data": "\n".join(datas)})
            event, datas = None, []
        elif line.startswith("event:"):
            event = line[len("event:"):].removeprefix(" ")
        elif line.startswith("data:"):
            datas.append(line[len("data:"):].removeprefix(" "))
    return items


def typed_stream(spec: dict[str, Any], server: str, path: str, body: dict[str, Any],
                 **kwargs: Any) -> list[dict[str, Any]]:
    """Every event of a stream whose events are named by their type (the Messages API's),
    validated: the whole stream against the documented schema, each event against the
    ``itemSchema``, its data against the ``contentSchema``, and its name against its type."""
    with httpx.stream("POST", server + path, json=body, timeout=TIMEOUT, **kwargs) as r:
        assert r.status_code == 200, r.read()
        assert media_type(r) == "text/event-stream"
        items = sse_items(r.iter_lines())
    media = documented(spec, "post", path, 200)["content"]["text/event-stream"]
    validate(spec, media["schema"], items)
    item_validator = validator(spec, media["itemSchema"])
    event_validator = validator(spec, event_schema(spec, path))
    events = []
    for item in items:  # contentSchema is an annotation here: the JSON is checked below
        item_validator.validate(item)
        event = json.loads(item["data"])
        event_validator.validate(event)
        assert event["type"] == item["event"], item
        events.append(event)
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
            # A key (Authorization: Bearer, or x-api-key) guards every route but the probes and
            # the server's self-description, and only when keys are configured.
            if path not in OPEN_PATHS:
                assert op["security"] == [{"bearerAuth": []}, {"apiKeyAuth": []}, {}], path
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
    assert spec["components"]["securitySchemes"]["apiKeyAuth"] == {
        **spec["components"]["securitySchemes"]["apiKeyAuth"], "type": "apiKey",
        "in": "header", "name": "x-api-key"}
    # The Messages routes: Anthropic's typed stream, and every error in Anthropic's shape.
    content = spec["paths"][MESSAGES]["post"]["responses"]["200"]["content"]
    assert set(content) == {"application/json", "text/event-stream"}
    assert content["text/event-stream"]["itemSchema"] == component("MessagesServerSentEvent")
    assert event_schema(spec, MESSAGES) == component("MessagesStreamEvent")
    for path in (MESSAGES, COUNT_TOKENS):
        statuses = spec["paths"][path]["post"]["responses"]
        assert "529" in statuses and "503" not in statuses, path
        for status, response in statuses.items():
            if status != "200":
                [schema] = [m["schema"] for m in deref(spec, response)["content"].values()]
                assert schema["allOf"][0] == component("MessagesErrorResponse"), (path, status)


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
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize", MESSAGES,
                 COUNT_TOKENS):
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


# --- (3b) the Messages API (Anthropic's) --------------------------------------------------------

#: TIME_TOOL, as Anthropic's API spells a tool.
TIME = {"name": "get_time", "description": "The time in a zone.",
        "input_schema": TIME_TOOL["function"]["parameters"]}
CALLED = [*HI, {"role": "assistant", "content": [
    {"type": "thinking", "thinking": "The user greets me.", "signature": "sig"},
    {"type": "text", "text": "Checking."},
    {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {"tz": "UTC"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "12:00"},
        {"type": "text", "text": "And now?"}]}]


def reassemble(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The message a Messages stream builds, as Anthropic's SDKs build it: message_start's,
    each block from its start and deltas (a call's input from its JSON), then message_delta's
    stop reason and usage. Each delta and stop is for the block still open."""
    [start] = [e for e in events if e["type"] == "message_start"]
    message = copy.deepcopy(start["message"])
    blocks = message["content"]
    open_index: int | None = None
    partial = ""
    for event in events:
        kind = event["type"]
        if kind == "content_block_start":
            assert open_index is None and event["index"] == len(blocks), event
            blocks.append(copy.deepcopy(event["content_block"]))
            open_index, partial = event["index"], ""
        elif kind == "content_block_delta":
            assert event["index"] == open_index, event
            block, delta = blocks[open_index], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                assert block["type"] == "tool_use", event
                partial += delta["partial_json"]
        elif kind == "content_block_stop":
            assert event["index"] == open_index, event
            if blocks[open_index]["type"] == "tool_use":
                blocks[open_index]["input"] = json.loads(partial)
            open_index = None
        elif kind == "message_delta":
            assert open_index is None, event
            message.update(event["delta"])
            message["usage"] = event["usage"]
    assert events[-1]["type"] == "message_stop", events[-3:]
    return message


def without_call_ids(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in b.items() if not (b["type"] == "tool_use" and k == "id")}
            for b in message["content"]]


@pytest.mark.parametrize("body", [
    {"model": MODEL, "system": "Be terse.", "messages": HI, "max_tokens": 5, **GREEDY},
    {"messages": [{"role": "user", "content": "What time is it?"}], "tools": [TIME],
     "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "seed": 1,
     "temperature": 1.0, "max_tokens": 200},
    {"system": [{"type": "text", "text": "Think first."}], "messages": HI, "max_tokens": 12,
     "thinking": {"type": "enabled", "budget_tokens": 4}, **GREEDY},
], ids=["text", "tool-use", "thinking"])
def test_messages_and_their_streams_validate(server: str, spec: dict[str, Any],
                                             body: dict) -> None:
    """A message, and the same request streamed: each event as documented, and the events
    building the same message. count_tokens counts its prompt."""
    validate(spec, request_schema(spec, MESSAGES), body)
    r = post(server, MESSAGES, body, headers={"X-Request-Id": "openapi-msg"})
    assert r.status_code == 200, r.text
    plain = check(spec, "POST", MESSAGES, r)
    assert r.headers["X-Request-Id"] == plain["id"] == "openapi-msg"
    kinds = [block["type"] for block in plain["content"]]
    if "tools" in body:
        assert plain["stop_reason"] == "tool_use" and kinds == ["tool_use"]
        assert plain["content"][0]["input"]["tz"] in ("UTC", "CET", "PST")
    else:
        assert plain["stop_reason"] == "max_tokens"
        assert plain["usage"]["output_tokens"] == body["max_tokens"]
        assert kinds[0] == ("thinking" if "thinking" in body else "text")

    streamed = {**body, "stream": True}
    validate(spec, request_schema(spec, MESSAGES), streamed)
    events = typed_stream(spec, server, MESSAGES, streamed)
    assert events[0]["type"] == "message_start" and events[1]["type"] == "ping"
    message = reassemble(events)
    validate(spec, component("Message"), message)
    assert message["id"].startswith("msg_")
    assert without_call_ids(message) == without_call_ids(plain)
    for key in ("stop_reason", "stop_sequence"):
        assert message[key] == plain[key], key
    usage = message["usage"]
    assert usage["output_tokens"] == plain["usage"]["output_tokens"]
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert prompt == plain["usage"]["input_tokens"] + plain["usage"]["cache_read_input_tokens"]

    counted = {k: v for k, v in body.items() if k in ("model", "system", "messages", "tools",
                                                      "tool_choice", "thinking")}
    validate(spec, request_schema(spec, COUNT_TOKENS), counted)
    count = check(spec, "POST", COUNT_TOKENS, post(server, COUNT_TOKENS, counted))
    assert count == {"input_tokens": prompt}


def test_a_message_stopped_by_a_stop_sequence_validates(server: str,
                                                       spec: dict[str, Any]) -> None:
    token = post(server, "/tokenize", {"prompt": " the"}).json()["tokens"][-1]
    text = post(server, "/detokenize", {"tokens": [token]}).json()["prompt"]
    body = {"messages": HI, "max_tokens": 4, "temperature": 0,
            "logit_bias": {str(token): 100}, "stop_sequences": [text]}
    validate(spec, request_schema(spec, MESSAGES), body)
    out = check(spec, "POST", MESSAGES, post(server, MESSAGES, body))
    assert (out["stop_reason"], out["stop_sequence"]) == ("stop_sequence", text)
    events = typed_stream(spec, server, MESSAGES, {**body, "stream": True})
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": text}


@pytest.mark.parametrize(("method", "path", "body", "status", "kind"), [
    ("POST", MESSAGES, {"messages": HI}, 400, "invalid_request_error"),
    ("POST", MESSAGES, {"messages": HI, "max_tokens": 4,
                        "thinking": {"type": "enabled", "budget_tokens": 4}}, 400,
     "invalid_request_error"),
    ("POST", MESSAGES, {"messages": HI, "max_tokens": 100000}, 400, "invalid_request_error"),
    ("POST", MESSAGES, {"messages": HI, "max_tokens": 1, "model": "nope"}, 404,
     "not_found_error"),
    ("POST", COUNT_TOKENS, {}, 400, "invalid_request_error"),
    ("POST", COUNT_TOKENS, {"messages": HI, "model": "nope"}, 404, "not_found_error"),
    ("POST", MESSAGES + "/batches", {}, 404, "not_found_error"),
    ("GET", MESSAGES, None, 405, "invalid_request_error"),
    ("GET", COUNT_TOKENS, None, 405, "invalid_request_error"),
])
def test_messages_errors_validate(server: str, spec: dict[str, Any], method: str, path: str,
                                  body: Any, status: int, kind: str) -> None:
    r = httpx.request(method, server + path, json=body, timeout=TIMEOUT,
                      headers={"X-Request-Id": "err-msg"})
    assert r.status_code == status, r.text
    out = check(spec, method, path, r)
    assert out["type"] == "error" and out["error"]["type"] == kind
    assert r.headers["X-Request-Id"] == "err-msg"
    if status == 405:
        assert "POST" in r.headers["Allow"].split(", ")
        assert method not in r.headers["Allow"].split(", ")


# Messages bodies the server accepts (200) and rejects (a 400 whose message names ``field``),
# with the documented request schema agreeing both ways.
MESSAGES_ACCEPTED = [
    (MESSAGES, {"model": MODEL, "max_tokens": 1, "messages": CALLED, "tools": [
        {**TIME, "type": "custom", "cache_control": {"type": "ephemeral"}, "strict": True}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "stop_sequences": ["zz"], "temperature": 1, "top_p": 0.5, "top_k": 5,
        "metadata": {"user_id": "u"}, "output_config": {"effort": "low"}, "n": 1,
        "service_tier": "auto", "cache_control": {"type": "ephemeral"}, "speed": "fast",
        "inference_geo": "us", "min_p": 0.1, "seed": 3, "priority": 1, "stop": "yy",
        "unknown": [1]}),
    # null is the default for every optional field
    (MESSAGES, {"max_tokens": 1, "messages": HI, "model": None, "system": None,
                "stop_sequences": None, "stream": None, "tools": None, "tool_choice": None,
                "thinking": None, "output_config": None, "metadata": {"user_id": None},
                "temperature": None, "n": None, "mcp_servers": None, "container": None,
                "chat_template_kwargs": None, "service_tier": None}),
    # a prefill (adaptive thinking may continue one), and roles that do not alternate
    (MESSAGES, {"max_tokens": 1, "thinking": {"type": "adaptive", "display": "omitted"},
                "messages": [*HI, {"role": "user", "content": []},
                             {"role": "assistant", "content": "Hel"}]}),
    (MESSAGES, {"max_tokens": 1, "messages": [
        *CALLED[:2], {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
             "content": [{"type": "text", "text": "no clock"}]}]}]}),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "tools": [], "tool_choice": {"type": "none"}}),
    (MESSAGES, {"max_tokens": 3, "messages": HI, "thinking": {"type": "disabled"},
                "output_config": {"format": {"type": "json_schema",
                                             "schema": "{\"type\": \"object\"}"}}}),
    (MESSAGES, {"max_tokens": 40, "messages": HI, "tools": [TIME],
                "tool_choice": {"type": "tool", "name": "get_time"},
                "thinking": {"type": "disabled"}}),
    (MESSAGES, {"max_tokens": 3, "messages": HI,
                "thinking": {"type": "enabled", "budget_tokens": 2, "display": "summarized"}}),
    (COUNT_TOKENS, {"messages": CALLED, "tools": [TIME], "tool_choice": {"type": "any"},
                    "system": "s", "max_tokens": 5, "stream": True, "unknown": 1}),
    (COUNT_TOKENS, {"messages": HI, "model": None, "thinking": {"type": "between_tools"},
                    "tools": None, "tool_choice": None, "output_config": None}),
]
MESSAGES_REJECTED = [
    (MESSAGES, {"messages": HI}, "max_tokens"),
    (MESSAGES, {"messages": HI, "max_tokens": None}, "max_tokens"),
    (MESSAGES, {"messages": HI, "max_tokens": 0}, "max_tokens"),
    (MESSAGES, {"messages": HI, "max_tokens": "5"}, "max_tokens"),
    (MESSAGES, {"max_tokens": 1}, "messages"),
    (MESSAGES, {"max_tokens": 1, "messages": []}, "messages"),
    (MESSAGES, {"max_tokens": 1, "messages": [{"role": "system", "content": "x"}]},
     "messages[0].role"),
    (MESSAGES, {"max_tokens": 1, "messages": [{"role": "user"}]}, "messages[0].content"),
    (MESSAGES, {"max_tokens": 1, "messages": [{"role": "user", "content": None}]},
     "messages[0].content"),
    (MESSAGES, {"max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "x"}}]}]}, "messages[0].content[0]"),
    (MESSAGES, {"max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "thinking", "thinking": "x"}]}]}, "messages[0].content[0]"),
    (MESSAGES, {"max_tokens": 1, "messages": [*HI, {"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "x"}]}]}, "messages[1].content[0]"),
    (MESSAGES, {"max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "x"}]}]}, "messages[0].content[0].tool_use_id"),
    (MESSAGES, {"max_tokens": 1, "messages": [*HI, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}, *HI]},
     "messages[1].content[0].input"),
    (MESSAGES, {"max_tokens": 1, "messages": [*CALLED[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": "yes"}]}]},
     "messages[2].content[0].is_error"),
    (MESSAGES, {"max_tokens": 1, "messages": [*CALLED[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "image"}]}]}]},
     "messages[2].content[0].content[0]"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "system": [{"type": "image"}]}, "system[0]"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "system": 5}, "system"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "tools": [
        {"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "tools": [{"name": "f"}]},
     "tools[0].input_schema"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "tools": [{**TIME, "name": ""}]},
     "tools[0].name"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "tools": [{**TIME, "strict": None}]},
     "tools[0]"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "tools": [{**TIME, "parameters": {}}]},
     "tools[0]"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "tools": TIME}, "tools"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "tool_choice": "auto", "tools": [TIME]},
     "tool_choice"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "tool_choice": {"type": "tool"},
                "tools": [TIME]}, "tool_choice"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "tool_choice": {"type": "some"},
                "tools": [TIME]}, "tool_choice"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "tool_choice": {"type": "auto", "name": "f"},
                "tools": [TIME]}, "tool_choice"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "tools": [TIME], "tool_choice": {
        "type": "none", "disable_parallel_tool_use": True}}, "tool_choice"),
    (MESSAGES, {"max_tokens": 1, "messages": HI, "tools": [TIME], "tool_choice": {
        "type": "auto", "disable_parallel_tool_use": None}}, "tool_choice"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "thinking": {"type": "enabled"}}, "thinking"),
    (MESSAGES, {"max_tokens": 8, "messages": HI,
                "thinking": {"type": "enabled", "budget_tokens": True}}, "thinking"),
    (MESSAGES, {"max_tokens": 8, "messages": HI,
                "thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking"),
    (MESSAGES, {"max_tokens": 8, "messages": HI,
                "thinking": {"type": "disabled", "budget_tokens": 4}}, "thinking"),
    (MESSAGES, {"max_tokens": 8, "messages": HI,
                "thinking": {"type": "adaptive", "display": "full"}}, "thinking"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "thinking": {"type": "sometimes"}},
     "thinking"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "output_config": {"effort": "extreme"}},
     "output_config"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "output_config": {"verbosity": "low"}},
     "output_config"),
    (MESSAGES, {"max_tokens": 8, "messages": HI,
                "output_config": {"format": {"type": "json_object"}}}, "output_config"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "metadata": {"user_id": 5}}, "metadata"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "metadata": {"k": "v"}}, "metadata"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "stop_sequences": [""]}, "stop_sequences"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "stop_sequences": "x"}, "stop_sequences"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "n": 2}, "'n'"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "mcp_servers": []}, "mcp_servers"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "container": "c"}, "container"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "temperature": 2.5}, "temperature"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "top_p": 0}, "top_p"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "service_tier": 1}, "service_tier"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "chat_template_kwargs": {"tools": []}},
     "chat_template_kwargs"),
    # cross-field rules, stated in the request schemas
    (MESSAGES, {"max_tokens": 8, "messages": HI, "tool_choice": {"type": "auto"}},
     "tool_choice"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "tools": [], "tool_choice": {"type": "any"}},
     "tool_choice"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "tools": [TIME], "tool_choice": {
        "type": "any"}, "thinking": {"type": "adaptive"}}, "thinking"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "tools": [TIME], "tool_choice": {
        "type": "tool", "name": "get_time"}, "thinking": {"type": "between_tools"}}, "thinking"),
    (MESSAGES, {"max_tokens": 8, "messages": HI, "thinking": {"type": "adaptive"},
                "output_config": {"format": {"type": "json_schema", "schema": {}}}}, "thinking"),
    (MESSAGES, {"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1"}]}]}, "messages[0]"),
    (COUNT_TOKENS, {}, "messages"),
    (COUNT_TOKENS, {"messages": None}, "messages"),
    (COUNT_TOKENS, {"messages": HI, "tool_choice": {"type": "any"}}, "tool_choice"),
    (COUNT_TOKENS, {"messages": HI, "tools": [TIME], "tool_choice": {"type": "any"},
                    "thinking": {"type": "enabled", "budget_tokens": 10}}, "thinking"),
    (COUNT_TOKENS, {"messages": HI, "thinking": {"type": "on"}}, "thinking"),
]


@pytest.mark.parametrize(("path", "body"), MESSAGES_ACCEPTED)
def test_accepted_messages_match_the_request_schema(server: str, spec: dict[str, Any],
                                                    path: str, body: dict) -> None:
    validate(spec, request_schema(spec, path), body)
    r = post(server, path, body)
    assert r.status_code == 200, r.text
    check(spec, "POST", path, r)


@pytest.mark.parametrize(("path", "body", "field"), MESSAGES_REJECTED)
def test_rejected_messages_fail_the_request_schema(server: str, spec: dict[str, Any],
                                                   path: str, body: dict, field: str) -> None:
    with pytest.raises(jsonschema.ValidationError):
        validate(spec, request_schema(spec, path), body)
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    error = check(spec, "POST", path, r)["error"]
    assert error["type"] == "invalid_request_error" and field in error["message"], error


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
    """401, 413, 429 and 503 (capacity) from a real server, each as documented; on the
    Messages routes, in Anthropic's shape, and 529 for 503."""
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
    # Anthropic's clients send the key as x-api-key (apiKeyAuth), on every guarded route.
    api_key = {"x-api-key": "k1"}
    check(spec, "GET", "/v1/models", httpx.get(guarded + "/v1/models", headers=api_key))
    count = {"messages": HI}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"},
                    {"Authorization": "Bearer wrong", **api_key}):
        for path in (MESSAGES, COUNT_TOKENS):
            r = post(guarded, path, count, headers=headers)
            assert r.status_code == 401, r.text
            assert check(spec, "POST", path, r)["error"]["type"] == "authentication_error"
        r = post(guarded, MESSAGES + "/batches", count, headers=headers)  # not served: 401 too
        assert r.status_code == 401, r.text
        validate(spec, component("MessagesErrorResponse"), r.json())
    for headers in (auth, api_key):
        check(spec, "POST", COUNT_TOKENS, post(guarded, COUNT_TOKENS, count, headers=headers))

    big = {"prompt": "x" * 5000}
    for path in ("/v1/completions", "/tokenize", MESSAGES, COUNT_TOKENS):
        r = post(guarded, path, big, headers=auth)
        assert r.status_code == 413, r.text
        check(spec, "POST", path, r)

    # One request alone over the per-minute budget: 429 (no Retry-After can help it).
    r = post(guarded, "/v1/completions", {"prompt": "x", "max_tokens": 2040}, headers=auth)
    assert r.status_code == 429, r.text
    assert check(spec, "POST", "/v1/completions", r)["error"]["code"] == "rate_limit_exceeded"
    r = post(guarded, MESSAGES, {"messages": HI, "max_tokens": 2020}, headers=api_key)
    assert r.status_code == 429, r.text
    assert check(spec, "POST", MESSAGES, r)["error"]["type"] == "rate_limit_error"

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
        r = client.post(guarded + MESSAGES, json={"messages": HI, "max_tokens": 1})
        assert r.status_code == 529, r.text
        assert r.headers["Retry-After"] == "1"
        assert check(spec, "POST", MESSAGES, r)["error"]["type"] == "overloaded_error"


# --- (4) the schemas are strict -------------------------------------------------------------

def test_real_responses_fail_without_any_required_field(server: str,
                                                       spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    completion = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 2,
                                                  "logprobs": 1}).json()
    chat = post(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 2,
                                                 "logprobs": True}).json()
    # Seeded (the same tokens every run) and long enough for text after the think block.
    message = post(server, MESSAGES, {"messages": HI, "max_tokens": 24, "seed": 5,
                                      "temperature": 1, "ignore_eos": True,
                                      "thinking": {"type": "enabled", "budget_tokens": 3}}).json()
    assert [b["type"] for b in message["content"]] == ["thinking", "text"], message
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
        ("Message", message, lambda d: d, "Message"),
        ("Message", message, lambda d: d["content"][0], "MessagesThinkingBlock"),
        ("Message", message, lambda d: d["content"][1], "MessagesTextBlock"),
        ("Message", message, lambda d: d["usage"], "MessagesUsage"),
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
MESSAGE = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": MODEL,
    "content": [{"type": "thinking", "thinking": "hm", "signature": ""},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {"tz": "UTC"}}],
    "stop_reason": "tool_use", "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 9, "cache_creation_input_tokens": 0,
              "cache_read_input_tokens": 16},
}
MESSAGE_DELTA = {"type": "message_delta", "usage": MESSAGE["usage"],
                 "delta": {"stop_reason": "stop_sequence", "stop_sequence": "##"}}
BLOCK_START = {"type": "content_block_start", "index": 0,
               "content_block": {"type": "text", "text": ""}}
MESSAGES_ERROR = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}


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
    drop("Message", MESSAGE, "stop_sequence"),
    drop("Message", MESSAGE, "usage.cache_read_input_tokens"),
    drop("Message", MESSAGE, "content.0.signature"),
    drop("Message", MESSAGE, "content.2.input"),
    replace("Message", MESSAGE, "type", "completion"),
    replace("Message", MESSAGE, "content.2.id", "call_1"),
    replace("Message", MESSAGE, "content.1.type", "output_text"),
    replace("Message", MESSAGE, "stop_reason", "end_turn"),  # a call: tool_use or max_tokens
    replace("Message", MESSAGE, "stop_reason", "stop_sequence"),  # ... and it names none
    replace("Message", MESSAGE, "stop_sequence", "##"),  # a stop string: stop_sequence
    replace("Message", {**MESSAGE, "content": MESSAGE["content"][:2], "stop_reason": "end_turn"},
            "stop_reason", "tool_use"),  # tool_use: a call
    replace("MessagesStreamEvent", MESSAGE_DELTA, "delta.stop_sequence", None),
    drop("MessagesStreamEvent", MESSAGE_DELTA, "usage"),
    replace("MessagesStreamEvent", BLOCK_START, "content_block.text", "h"),  # opens empty
    replace("MessagesStreamEvent", BLOCK_START, "type", "content_block"),
    replace("MessagesStreamEvent", MESSAGES_ERROR, "error.type", "BadRequestError"),
    drop("MessagesErrorResponse", MESSAGES_ERROR, "type"),
    drop("MessagesErrorResponse", MESSAGES_ERROR, "error.message"),
])
def test_schemas_are_strict(spec: dict[str, Any], name: str, instance: dict, mutate: Any
                            ) -> None:
    schema = component(name)
    validate(spec, schema, instance)  # the intact instance is valid ...
    broken = copy.deepcopy(instance)
    mutate(broken)
    with pytest.raises(jsonschema.ValidationError):  # ... and the damaged one is not
        validate(spec, schema, broken)

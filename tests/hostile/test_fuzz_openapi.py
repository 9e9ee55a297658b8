"""A property-based fuzz of the generation routes, generated from ``schemas/openapi.json``.

schemathesis draws request bodies (and the X-Request-Id / X-Request-Timeout headers) from the
document's request schemas and sends them, with the API key, to the hostile server while
``/health`` is watched. Every answer must be one the document promises: no 5xx, a documented
status and content type, a body of the documented schema and, for a stream, every
server-sent event of the documented ``itemSchema`` (its data the JSON of a chunk or of an
in-band error, checked against the ``contentSchema``) and the stream as a whole of the
documented ``schema`` (one ``[DONE]``), which must also come last.

What is *not* asked: that every schema-valid request is accepted. The schema cannot say every
rule the server keeps (token ids below the vocabulary size, a prompt that fits the context,
a grammar that compiles, a named tool that is among the tools), so a documented 400 naming
the problem is a right answer too; the cross-field rules JSON Schema can say are in the
document, so that the draws mostly keep them.

The draws are made cheap (``_cheap``): a few tokens and choices per request, short prompts,
few logprobs; so that the thousands of cases take a minute or two on two cores. Hypothesis
runs derandomized and without its example database: CI draws the same cases every run.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, ValidationError
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.hostile.conftest import AUTH, HostileServer, watched

ROOT = Path(__file__).resolve().parents[2]
SPEC: dict[str, Any] = json.loads((ROOT / "schemas" / "openapi.json").read_text())
SCHEMA = schemathesis.openapi.from_dict(SPEC)
# Every event of a stream is read and validated (schemathesis stops at 20 by default, and
# then leaves the whole-stream schema unchecked).
SCHEMA.config.max_stream_events = 10_000
ROUTES = ("/v1/completions", "/v1/chat/completions")
#: Cases per route: the issue asks for at least 2,000 in all.
CASES = 1000
#: Bounds on what one drawn request may cost the tiny model.
MAX_TOKENS = 4
MAX_PROMPTS = 2
MAX_PROMPT_CHARS = 200
MAX_IDS = 32
BOUNDS = {"max_tokens": MAX_TOKENS, "max_completion_tokens": MAX_TOKENS, "n": 2,
          "logprobs": 3, "top_logprobs": 3, "prompt_logprobs": 3}
#: Everything a response must be, and nothing a request must be (no positive_data_acceptance
#: and no negative_data_rejection: see the module's docstring).
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]
#: The error types of 5xx statuses (``errors.error_body``), in-band in a stream.
SERVER_ERRORS = ("InternalServerError", "ServiceUnavailableError")


# --- what is drawn ------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _at_most(value: Any, bound: int) -> Any:
    """A positive integer brought into [1, bound]; any other value kept as drawn (a wrong type
    or range is a 400 worth asking for)."""
    return 1 + (value - 1) % bound if _is_int(value) and value > bound else value


@SCHEMA.hook("map_body")
def _cheap(_ctx: schemathesis.HookContext, body: Any) -> Any:
    """The drawn body, its cost to the engine bounded; still valid wherever it was valid."""
    if not isinstance(body, dict):
        return body
    body = dict(body)
    n = body.get("n")
    for name, bound in BOUNDS.items():
        if name in body:
            body[name] = _at_most(body[name], bound)
    # An unset or null token bound runs to the end of the context: the one that counts is set.
    bound_name = "max_tokens" if "prompt" in body else "max_completion_tokens"
    if body.get(bound_name) is None:
        body[bound_name] = MAX_TOKENS
    if body.get("best_of") == (1 if n is None else n):  # accepted only equal to n: keep it so
        body["best_of"] = 1 if n is None else body["n"]
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        body["prompt"] = prompt[:MAX_PROMPT_CHARS]
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        body["prompt"] = prompt[:MAX_IDS]
    elif isinstance(prompt, list):
        body["prompt"] = [p[:MAX_PROMPT_CHARS] if isinstance(p, str)
                          else p[:MAX_IDS] if isinstance(p, list) else p
                          for p in prompt[:MAX_PROMPTS]]
    return body


@SCHEMA.hook("flatmap_body")
def _streamed(_ctx: schemathesis.HookContext, body: Any) -> st.SearchStrategy[Any]:
    """Half the bodies that leave ``stream`` unset stream, some with usage chunks: drawn from
    the schema alone, among dozens of optional fields, few would."""
    if not isinstance(body, dict) or body.get("stream") is not None:
        return st.just(body)
    options = st.sampled_from([{}, {"include_usage": True},
                               {"include_usage": True, "continuous_usage_stats": True}])
    streamed = options.map(lambda o: {
        **body, "stream": True,
        **({"stream_options": o} if o and body.get("stream_options") is None else {})})
    return st.booleans().flatmap(lambda stream: streamed if stream else st.just(body))


# --- what is checked beyond schemathesis's checks ------------------------------------------


def _event_validators() -> dict[str, Draft202012Validator]:
    """Per route, a validator of one event's JSON: the contentSchema of the documented
    event's data."""
    out = {}
    for path in ROUTES:
        media = SPEC["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]
        event = SPEC["components"]["schemas"][media["itemSchema"]["$ref"].rsplit("/", 1)[1]]
        [json_data] = [b for b in event["properties"]["data"]["anyOf"] if "contentSchema" in b]
        out[path] = Draft202012Validator({**json_data["contentSchema"],
                                          "components": SPEC["components"]})
    return out


EVENT_VALIDATORS = _event_validators()


def _sse_datas(body: bytes) -> list[str]:
    """Each event's data, as an SSE parser joins its data lines."""
    datas = []
    for block in body.decode().replace("\r\n", "\n").split("\n\n"):
        lines = [line[5:].removeprefix(" ") for line in block.split("\n")
                 if line.startswith("data:")]
        if lines:
            datas.append("\n".join(lines))
    return datas


def check_stream(path: str, body: bytes) -> list[dict[str, Any]]:
    """A stream read independently of schemathesis: what JSON Schema cannot say of an array
    (that [DONE] comes last), and each event's data validated as JSON against the event
    schema, as schemathesis does through contentSchema. Returns the events."""
    datas = _sse_datas(body)
    assert datas and datas[-1] == "[DONE]", datas[-3:]
    assert "[DONE]" not in datas[:-1], datas
    events = [json.loads(d) for d in datas[:-1]]
    assert events, "no event before [DONE]"
    for event in events:
        EVENT_VALIDATORS[path].validate(event)
    return events


# --- the fuzz ------------------------------------------------------------------------------


@pytest.mark.timeout(900)  # 20 s and 80 s on two busy cores: room for slower machines
@pytest.mark.parametrize("path", ROUTES)
def test_generation_routes_answer_as_documented(hostile_server: HostileServer,
                                                path: str) -> None:
    seen: Counter[str] = Counter()  # status, media type (and in-band error code): a summary

    @settings(max_examples=CASES, database=None, derandomize=True, deadline=None,
              phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(case=SCHEMA[path]["POST"].as_strategy())
    def fuzz(case: schemathesis.Case) -> None:
        response = case.call(base_url=hostile_server.base, headers=AUTH, session=session,
                             timeout=60)
        case.validate_response(response, checks=CHECKS)
        media = response.headers.get("content-type", [""])[0].split(";")[0]
        key = f"{response.status_code} {media}"
        if response.status_code == 200 and media == "text/event-stream":
            assert not response.stream_cut_short
            errors = [e["error"] for e in check_stream(path, response.content) if "error" in e]
            for error in errors:  # a server error after the status line is still one
                assert error["type"] not in SERVER_ERRORS, error
                key += f" in-band {error['code']}"
        seen[key] += 1

    start = time.monotonic()
    with requests.Session() as session, watched(hostile_server):
        fuzz()
    print(f"\n{path}: {sum(seen.values())} cases in {time.monotonic() - start:.0f} s: "
          f"{dict(seen.most_common())}")
    assert sum(seen.values()) >= CASES, seen


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_echo_with_logprobs_past_the_deadline(hostile_server: HostileServer,
                                              stream: bool) -> None:
    """Found by the fuzz: a deadline that passed before the engine scored the prompt ended the
    choice without the prompt's logprobs, and echo's prompt tokens had none to pair with (a
    500). With a deadline of a nanosecond that is the usual case; either way the answer is a
    documented 200 whose logprobs arrays match."""
    case = SCHEMA["/v1/completions"]["POST"].Case(
        body={"prompt": "The quick brown fox", "echo": True, "logprobs": 1, "max_tokens": 4,
              "stream": stream}, headers={"X-Request-Timeout": "1e-9"})
    with watched(hostile_server):
        response = case.call(base_url=hostile_server.base, headers=AUTH, timeout=60)
        case.validate_response(response, checks=CHECKS)
    assert response.status_code == 200, response.content[:500]
    if stream:
        choices = [c for e in check_stream("/v1/completions", response.content)
                   for c in e["choices"]]
    else:
        choices = json.loads(response.content)["choices"]
    for choice in choices:
        lengths = {len(v) for v in choice["logprobs"].values()}
        assert len(lengths) == 1, choice["logprobs"]


# --- the stream checks themselves ------------------------------------------------------------

CHUNK = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
         "system_fingerprint": "fp_0123456789",
         "choices": [{"index": 0, "text": "hi", "logprobs": None, "finish_reason": "length",
                      "stop_reason": None}]}
ERROR = {"error": {"message": "no", "type": "BadRequestError", "param": None, "code": 400}}


def _sse(*datas: Any) -> bytes:
    return b"".join(b"data: " + (d if isinstance(d, str) else json.dumps(d)).encode() + b"\n\n"
                    for d in datas)


def _validated(body: bytes) -> None:
    """``body`` as a completions stream, through the fuzz's schemathesis checks."""
    case = SCHEMA["/v1/completions"]["POST"].Case(body={"prompt": "x", "stream": True})
    request = requests.Request("POST", "http://127.0.0.1/v1/completions",
                               json=case.body).prepare()
    response = schemathesis.Response(200, {"content-type": ["text/event-stream"]}, body,
                                     request, elapsed=0.0, verify=True)
    case.validate_response(response, checks=CHECKS)


@pytest.mark.parametrize("body", [
    _sse(CHUNK, "[DONE]"),
    _sse(CHUNK, {**CHUNK, "choices": [], "usage": {
        "prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 0}}}, "[DONE]"),
    _sse({**CHUNK, "usage": None}, ERROR, "[DONE]"),
], ids=["chunk", "usage-chunk", "in-band-error"])
def test_a_documented_stream_passes_the_checks(body: bytes) -> None:
    _validated(body)
    check_stream("/v1/completions", body)


@pytest.mark.parametrize(("body", "schemathesis_sees_it"), [
    (_sse({k: v for k, v in CHUNK.items() if k != "id"}, "[DONE]"), True),
    (_sse({**CHUNK, "choices": []}, "[DONE]"), True),  # a usage-only chunk without usage
    (_sse("{not json", "[DONE]"), True),
    (_sse(CHUNK), True),  # no [DONE]
    (_sse(CHUNK, "[DONE]", "[DONE]"), True),
    (_sse("[DONE]", CHUNK), False),  # JSON Schema cannot say that [DONE] comes last
], ids=["chunk-without-id", "usage-chunk-without-usage", "not-json", "no-done", "two-dones",
        "done-first"])
def test_a_broken_stream_fails_the_checks(body: bytes, schemathesis_sees_it: bool) -> None:
    """schemathesis parses each event, validates its data as JSON against the contentSchema
    and the whole stream against the stream's schema; our own reading catches the rest."""
    if schemathesis_sees_it:
        with pytest.raises((AssertionError, BaseExceptionGroup)):
            _validated(body)
    else:
        _validated(body)
    with pytest.raises((AssertionError, ValueError, ValidationError)):
        check_stream("/v1/completions", body)

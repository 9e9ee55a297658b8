"""Hostile bytes at the HTTP and JSON layer: each a 400 (or 401/431) in OpenAI's shape.

Bodies are written by hand where a client library would refuse or normalise them: JSON
nested ~1,000 deep, integers of thousands of digits, lone UTF-16 surrogates, NaN, invalid
UTF-8; requests and pipelines go over raw sockets where httpx would not send them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import free_port, running_server, serve_args
from tests.hostile import rawhttp
from tests.hostile.conftest import AUTH, KEY, MODEL, HostileServer, openai_error, watched

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HI = [{"role": "user", "content": "hi"}]
JSON_HEADERS = {**AUTH, "Content-Type": "application/json"}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}}}}

HOLE = "@@HOLE@@"  # a body's placeholder value, replaced by raw JSON text


def with_raw(body: dict, raw: str) -> bytes:
    """``body`` as JSON with its one ``"@@HOLE@@"`` value replaced by the raw JSON text
    ``raw`` (which json.dumps could not write: a lone surrogate escape, NaN, a 5,000-digit
    integer, a thousand brackets)."""
    text = json.dumps(body)
    assert text.count(f'"{HOLE}"') == 1, text
    return text.replace(f'"{HOLE}"', raw).encode("utf-8", "surrogatepass")


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


def post_raw(server: HostileServer, path: str, content: bytes) -> httpx.Response:
    return httpx.post(server.base + path, content=content, headers=JSON_HEADERS, timeout=60)


LONE = r'"\ud800"'
LONE_LOW = r'"x\udc00y"'
REVERSED = r'"\ude00\ud83d"'  # a low then a high: no pair
BIG_INT = "7" * 5000  # beyond Python's 4,300-digit int-to-str limit

# (route, body with a hole, the raw JSON for it, the param named, what the message says)
BAD_BODIES = [
    pytest.param(CHAT, {"messages": HI, "tools": HOLE}, nested(1000), "tools", "nested",
                 id="nesting-1000"),
    pytest.param(CHAT, {"messages": HI, "tools": HOLE}, nested(5000), "tools", "nested",
                 id="nesting-beyond-orjson"),
    pytest.param(COMPLETIONS, {"prompt": "hi", "logit_bias": HOLE},
                 '{"a":' * 900 + "1" + "}" * 900, "logit_bias", "nested", id="objects-900"),
    pytest.param(COMPLETIONS, {"prompt": "hi", "unknown_field": HOLE}, nested(128), "unknown_field",
                 "nested", id="nesting-129-even-unread"),
    pytest.param(COMPLETIONS, {"prompt": "hi", "max_tokens": HOLE}, BIG_INT, "max_tokens",
                 "too large", id="int-5000-digits"),
    pytest.param(CHAT, {"messages": HI, "seed": HOLE}, "-" + BIG_INT, "seed", "too large",
                 id="negative-int-5000-digits"),
    pytest.param(COMPLETIONS, {"prompt": "hi", "temperature": HOLE}, "1e400", "temperature",
                 "too large", id="float-overflow"),
    pytest.param(COMPLETIONS, {"prompt": HOLE}, LONE, "prompt", "surrogate", id="prompt"),
    pytest.param(COMPLETIONS, {"prompt": [HOLE, "ok"]}, LONE_LOW, "prompt", "surrogate",
                 id="prompt-batch"),
    pytest.param(CHAT, {"messages": [{"role": "user", "content": HOLE}]}, LONE, "messages",
                 "surrogate", id="message-content"),
    pytest.param(CHAT, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": HOLE}]}]}, REVERSED, "messages", "surrogate",
                 id="text-part"),
    pytest.param(CHAT, {"messages": HI, "tools": [{"type": "function", "function": {
        "name": HOLE}}]}, LONE, "tools", "surrogate", id="tool-name"),
    pytest.param(CHAT, {"messages": HI, "tools": [TIME_TOOL], "tool_choice": {
        "type": "function", "function": {"name": HOLE}}}, LONE, "tool_choice", "surrogate",
                 id="tool-choice-name"),
    pytest.param(CHAT, {"messages": HI, "stop": [HOLE]}, LONE_LOW, "stop", "surrogate",
                 id="stop-string"),
    pytest.param(COMPLETIONS, {"prompt": "hi", "stop": HOLE}, LONE, "stop", "surrogate",
                 id="stop-string-completions"),
    pytest.param(CHAT, {"messages": HI, "guided_regex": HOLE}, r'"a\ud800b"', "guided_regex",
                 "surrogate", id="regex"),
    pytest.param(CHAT, {"messages": HI, "structured_outputs": {"regex": HOLE}}, LONE,
                 "structured_outputs", "surrogate", id="structured-outputs-regex"),
    pytest.param(CHAT, {"messages": HI, "guided_choice": ["a", HOLE]}, LONE, "guided_choice",
                 "surrogate", id="choice"),
    pytest.param(CHAT, {"messages": HI, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"const": HOLE}}}},
                 LONE, "response_format", "surrogate", id="schema-const"),
    pytest.param("/tokenize", {"prompt": HOLE}, LONE, "prompt", "surrogate", id="tokenize"),
    pytest.param("/tokenize", {"messages": [{"role": "user", "content": HOLE}]}, LONE,
                 "messages", "surrogate", id="tokenize-messages"),
    pytest.param("/detokenize", {"tokens": HOLE}, f"[{BIG_INT}]", "tokens", "too large",
                 id="detokenize-int"),
    pytest.param(CHAT, {"messages": HI, HOLE: 1}, "", None, "surrogate",
                 id="surrogate-in-a-key"),
    pytest.param(COMPLETIONS, {"prompt": "hi", "temperature": HOLE}, "NaN", "temperature",
                 "NaN", id="nan"),
    pytest.param(COMPLETIONS, {"prompt": "hi", "top_p": HOLE}, "-Infinity", "top_p", "NaN",
                 id="infinity"),
]


@pytest.mark.parametrize(("path", "body", "raw", "param", "says"), BAD_BODIES)
def test_unparseable_bodies_are_400s_naming_the_problem(
        hostile_server: HostileServer, path: str, body: dict, raw: str, param: str | None,
        says: str) -> None:
    if not raw:  # the hole is a key: a lone surrogate in a member's name
        content = json.dumps(body).replace(f'"{HOLE}"', r'"k\udfff"').encode()
        param = r"k\udfff"
    else:
        content = with_raw(body, raw)
    with watched(hostile_server):
        error = openai_error(post_raw(hostile_server, path, content), 400)
    assert "not valid JSON" in error["message"] and says in error["message"], error
    assert error["param"] == param, error


@pytest.mark.parametrize(("raw", "says"), [
    (b'{"prompt": "caf\xe9"}', "UTF-8"),
    (b'\xef\xbb\xbf{"prompt": "hi"}', "byte-order mark"),
    (b'{"prompt": "\xed\xa0\x80"}', "UTF-8"),  # a surrogate encoded as if it were UTF-8
    (b'{"prompt": "hi",}', "trailing comma"),
    (b"", "empty"),
    (b'"' + b"\\ud800" * 1000 + b'"', "surrogate"),
    (nested(1000).encode(), "nested"),  # the whole body, not a field
])
def test_unparseable_bytes_are_400s(hostile_server: HostileServer, raw: bytes,
                                    says: str) -> None:
    with watched(hostile_server):
        error = openai_error(post_raw(hostile_server, COMPLETIONS, raw), 400)
    assert says in error["message"], error


def test_what_is_valid_still_passes(hostile_server: HostileServer) -> None:
    """The limits sit where no real request is: a surrogate pair is an emoji, 128 levels of
    nesting are fine, and a 30-digit integer where any number goes is a (float) number."""
    emoji = r'"\ud83d\ude00 and caf\u00e9"'
    cases = [
        (COMPLETIONS, {"prompt": HOLE, "max_tokens": 1}, emoji),
        (CHAT, {"messages": [{"role": "user", "content": HOLE}], "max_tokens": 1}, emoji),
        (CHAT, {"messages": HI, "max_tokens": 1, "stop": [HOLE]}, emoji),
        (COMPLETIONS, {"prompt": "hi", "max_tokens": 1, "unknown_field": HOLE}, nested(127)),
        (CHAT, {"messages": HI, "max_tokens": 1, "chat_template_kwargs": {"x": HOLE}},
         nested(126)),
        (CHAT, {"messages": HI, "max_tokens": 1, "metadata": HOLE}, '{"a": "b"}'),
        (COMPLETIONS, {"prompt": "hi", "max_tokens": 1, "logit_bias": {"5": HOLE}}, "1" * 30
         + "e-28"),
    ]
    with watched(hostile_server):
        for path, body, raw in cases:
            r = post_raw(hostile_server, path, with_raw(body, raw))
            assert r.status_code == 200, (path, raw[:40], r.text[:300])
        r = httpx.post(hostile_server.base + "/tokenize", headers=AUTH, timeout=30,
                       content=with_raw({"prompt": HOLE}, emoji))
        assert r.status_code == 200 and r.json()["count"] > 0, r.text


def test_json_inside_strings_is_parsed_as_strictly(hostile_server: HostileServer) -> None:
    """Tool-call arguments and a schema given as a string are JSON too, parsed the same way:
    an escaped surrogate, NaN or deep nesting inside them is a 400 naming the field."""
    def call(arguments: str) -> list[dict]:
        return [*HI, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_time", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "noon"}]

    cases = [
        ({"messages": call('{"tz": "\\ud800"}'), "tools": [TIME_TOOL]}, "messages",
         "surrogate"),
        ({"messages": call('{"tz": NaN}'), "tools": [TIME_TOOL]}, "messages", "NaN"),
        ({"messages": call('{"tz": ' + nested(1000) + "}"), "tools": [TIME_TOOL]},
         "messages", "nested"),
        ({"messages": call('{"tz": ' + BIG_INT + "}"), "tools": [TIME_TOOL]}, "messages",
         "too large"),
        ({"messages": HI, "guided_json": '{"const": "\\udc00"}'}, "guided_json", "surrogate"),
        ({"messages": HI, "guided_json": '{"const": ' + nested(2000) + "}"}, "guided_json",
         "nested"),
    ]
    with watched(hostile_server):
        for body, param, says in cases:
            r = httpx.post(hostile_server.base + CHAT, json=body, headers=AUTH, timeout=60)
            error = openai_error(r, 400)
            assert error["param"] == param and says in error["message"], error


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("route", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("options", ["x", [], 5, True, {"include_usage": "yes"},
                                     {"continuous_usage_stats": 1}, {"include_usage": []}])
def test_stream_options_of_the_wrong_type_are_400s(hostile_server: HostileServer, route: str,
                                                   options: object, stream: bool) -> None:
    body = {"messages": HI} if route == CHAT else {"prompt": "hi"}
    with watched(hostile_server):
        r = httpx.post(hostile_server.base + route, headers=AUTH, timeout=30,
                       json={**body, "stream": stream, "stream_options": options})
        assert openai_error(r, 400)["param"] == "stream_options"


# --- auth -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "body"), [("/tokenize", {"prompt": "hi"}),
                                            ("/detokenize", {"tokens": [5, 6]})])
def test_tokenize_and_detokenize_need_the_key(hostile_server: HostileServer, path: str,
                                              body: dict) -> None:
    with watched(hostile_server):
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY}):
            r = httpx.post(hostile_server.base + path, json=body, headers=headers, timeout=30)
            assert openai_error(r, 401)["code"] == "invalid_api_key"
        r = httpx.post(hostile_server.base + path, json=body, headers=AUTH, timeout=30)
        assert r.status_code == 200, r.text


def test_probes_stay_open_and_unknown_paths_are_guarded(hostile_server: HostileServer) -> None:
    with watched(hostile_server), httpx.Client(base_url=hostile_server.base,
                                               timeout=30) as client:
        for path in ("/health", "/ready", "/metrics", "/version", "/openapi.json"):
            assert client.get(path).status_code == 200, path
        # Without a key a path the server does not serve is a 401: routes are not mapped.
        openai_error(client.get("/admin"), 401)
        openai_error(client.post("/v1/nowhere", json={}), 401)
        openai_error(client.get("/admin", headers=AUTH), 404)


UNICODE_KEYS = ("ключ-🔑-clé", "ascii-then-ü")


@pytest.fixture(scope="module")
def unicode_key_server(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory
                       ) -> Iterator[str]:
    """A server whose keys are not ASCII: one from the command line, one from a keys file."""
    tmp = tmp_path_factory.mktemp("unicode-keys")
    keys_file = tmp / "keys"
    keys_file.write_text(f"# a comment\n{UNICODE_KEYS[1]}\n", encoding="utf-8")
    port = free_port()
    log = tmp / "server.log"
    args = serve_args(hf_dir, port, "--served-model-name", MODEL, "--api-key", UNICODE_KEYS[0],
                      "--api-keys-file", str(keys_file))
    with running_server(args, log, port=port) as (base, _proc):
        yield base
    assert "Traceback" not in log.read_text(errors="replace")


def bearer(key: bytes) -> dict[str, bytes]:
    return {"Authorization": b"Bearer " + key}


def test_a_non_ascii_key_authenticates(unicode_key_server: str) -> None:
    with httpx.Client(base_url=unicode_key_server, timeout=60) as client:
        for key in UNICODE_KEYS:
            utf8 = key.encode("utf-8")
            r = client.post(COMPLETIONS, headers=bearer(utf8),
                            json={"prompt": "hi", "max_tokens": 1})
            assert r.status_code == 200, r.text
            assert client.post("/tokenize", headers=bearer(utf8),
                               json={"prompt": key}).status_code == 200
            refused = [
                utf8[:-1],  # a byte short: no longer the same key, nor valid UTF-8
                utf8 + b"x",
                key.encode("utf-8").decode("latin-1").encode("utf-8"),  # encoded twice
                key.encode("ascii", "replace"),
            ]
            for wrong in refused:
                r = client.post(COMPLETIONS, headers=bearer(wrong), json={"prompt": "hi"})
                assert openai_error(r, 401)["code"] == "invalid_api_key", wrong
        assert client.get("/health").status_code == 200


# --- the HTTP layer ---------------------------------------------------------------------------

MALFORMED = [
    pytest.param(b"GARBAGE\r\n\r\n", 400, id="request-line"),
    pytest.param(b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n", 400,
                 id="space-in-header-name"),
    pytest.param(b"GET /health HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", 400,
                 id="nul-in-header"),
    pytest.param(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400,
                 id="content-length-not-a-number"),
    pytest.param(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
                 b"Content-Length: 2\r\n\r\nab", 400, id="two-content-lengths"),
    # Past 16 KiB with the head still unfinished; under one 64 KiB read, so that the server
    # has read everything when it answers and closes (unread bytes would make its close a
    # reset, which may destroy the answer before the client reads it).
    pytest.param(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 30_000, 431,
                 id="head-too-large"),
    pytest.param(b"GET /" + b"a" * 30_000, 431, id="request-line-too-long"),
]


@pytest.mark.timing
@pytest.mark.parametrize(("raw", "status"), MALFORMED)
def test_requests_hypercorn_refuses_get_openai_errors(hostile_server: HostileServer,
                                                      raw: bytes, status: int) -> None:
    with watched(hostile_server):
        (response,), closed = rawhttp.exchange(hostile_server.base, raw, 1)
    openai_error(response.as_httpx(), status)
    assert response.headers["content-type"] == "application/json"
    assert response.closes and closed


def test_a_pipeline_goes_on_after_a_400(hostile_server: HostileServer) -> None:
    """Errors to requests whose bodies were read leave the connection open: everything
    pipelined behind them is answered, in order."""
    good = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    pipeline = [
        (rawhttp.request("POST", COMPLETIONS, b'{"prompt": ', AUTH), 400),
        (rawhttp.request("POST", COMPLETIONS, good, AUTH), 200),
        (rawhttp.request("POST", COMPLETIONS, with_raw({"prompt": HOLE}, LONE), AUTH), 400),
        (rawhttp.request("POST", CHAT, json.dumps(
            {"messages": HI, "stream_options": "x"}).encode(), AUTH), 400),
        (rawhttp.request("POST", "/tokenize", json.dumps({"prompt": "hi"}).encode(), AUTH),
         200),
        (rawhttp.request("GET", "/v1/models", headers=AUTH), 200),
        (rawhttp.request("GET", "/nowhere", headers=AUTH), 404),
        (rawhttp.request("POST", COMPLETIONS, good, AUTH), 200),
    ]
    with watched(hostile_server):
        responses, closed = rawhttp.exchange(
            hostile_server.base, b"".join(data for data, _ in pipeline), len(pipeline))
    assert [r.status for r in responses] == [status for _, status in pipeline]
    for response in responses:
        assert not response.closes, response
        if response.status >= 400:
            openai_error(response.as_httpx(), response.status)
    assert not closed, "the connection was closed after the pipeline"


def test_an_error_before_the_body_closes_the_connection(hostile_server: HostileServer) -> None:
    """A request refused before its body came in (no key, while the client still sends):
    hypercorn closes such a connection rather than read the rest, and the answer says so."""
    body = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    head = rawhttp.request("POST", COMPLETIONS, body)[:-len(body)]  # no Authorization
    with watched(hostile_server), rawhttp.connect(hostile_server.base) as sock:
        sock.sendall(head)  # the body never comes before the answer
        reader = sock.makefile("rb")
        response = rawhttp.read_response(reader)
        openai_error(response.as_httpx(), 401)
        assert response.closes
        assert reader.read(1) == b""  # closed by the server, not left waiting


# --- fuzz: hostile values at random places of valid bodies ------------------------------------

def _text() -> st.SearchStrategy[str]:
    return st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


def _lone_surrogate() -> st.SearchStrategy[str]:
    escape = st.integers(0xD800, 0xDFFF).map(lambda c: f"\\u{c:04x}")
    return st.tuples(_text(), escape, _text()).map(
        lambda t: json.dumps(t[0])[:-1] + t[1] + json.dumps(t[2])[1:])


#: Raw JSON texts no parser may let through (each makes the whole body a 400).
INVALID = st.one_of(
    _lone_surrogate(),
    st.integers(4301, 8000).map(lambda n: "9" * n),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e999"]),
    st.integers(129, 3000).map(lambda d: nested(d)),
    st.integers(129, 1500).map(lambda d: '{"a":' * d + "null" + "}" * d),
)
#: Raw JSON texts that are valid but extreme: each may be accepted or refused by its field.
EXTREME = st.one_of(
    st.integers(20, 300).map(lambda n: "8" * n),
    st.integers(1, 126).map(lambda d: nested(d, '"x"')),
    st.just(r'"\ud83d\ude00"'),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
                                                                       allow_infinity=False)
                 | _text(), lambda inner: st.lists(inner, max_size=3)
                 | st.dictionaries(_text(), inner, max_size=3), max_leaves=8).map(json.dumps),
)


def _chat_body() -> dict:
    return {"model": MODEL, "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "tools": [TIME_TOOL], "stop": ["\n\n"], "logit_bias": {"5": 1},
            "stream_options": {"include_usage": True}, "metadata": {"k": "v"}}


def _completions_body() -> dict:
    return {"model": MODEL, "prompt": ["hi", [5, 6]], "max_tokens": 1, "temperature": 0,
            "stop": "\n\n", "logit_bias": {"5": 1}, "suffix": "", "user": "u",
            "stream_options": {"include_usage": True}}


#: Where a value goes: (route, body factory, the path of keys and indexes to the value).
PLACES = [
    (CHAT, _chat_body, path) for path in (
        ("messages",), ("messages", 0), ("messages", 0, "content"), ("messages", 0, "role"),
        ("messages", 1, "content"), ("messages", 1, "content", 0, "text"),
        ("messages", 1, "content", 0, "type"), ("tools",), ("tools", 0, "function", "name"),
        ("tools", 0, "function", "parameters"), ("tools", 0, "function", "parameters",
                                                 "properties", "tz", "type"),
        ("stop",), ("stop", 0), ("logit_bias", "5"), ("stream_options",),
        ("stream_options", "include_usage"), ("metadata", "k"), ("temperature",),
        ("max_tokens",), ("n",), ("seed",), ("tool_choice",), ("response_format",),
        ("chat_template_kwargs",), ("guided_regex",), ("guided_choice",), ("user",),
        ("extra_field",))
] + [
    (COMPLETIONS, _completions_body, path) for path in (
        ("prompt",), ("prompt", 0), ("prompt", 1), ("prompt", 1, 0), ("stop",),
        ("logit_bias", "5"), ("suffix",), ("user",), ("echo",), ("logprobs",), ("n",),
        ("max_tokens",), ("top_p",), ("stream_options",), ("extra_field",))
]


def _place(body: dict, path: tuple) -> dict:
    """A copy of ``body`` with the hole at ``path`` (the last key is created if missing)."""
    body = copy.deepcopy(body)
    node: dict | list = body
    for step in path[:-1]:
        node = node[step]  # type: ignore[index]
    node[path[-1]] = HOLE  # type: ignore[index]
    return body


def test_fuzz_hostile_values_anywhere_are_400_or_200(hostile_server: HostileServer) -> None:
    """A hostile raw value at a random place of a valid chat or completions body: a 400 in
    OpenAI's shape when the value is not JSON a server may accept (always, for surrogates,
    huge numbers, NaN and deep nesting), else a 200 or a 400; never a 5xx, never a
    traceback, and /health answers throughout (``watched``)."""
    with watched(hostile_server), httpx.Client(base_url=hostile_server.base, timeout=60,
                                               headers=JSON_HEADERS) as client:

        @settings(max_examples=400, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(place=st.sampled_from(PLACES), invalid=st.booleans(), data=st.data())
        def one(place: tuple, invalid: bool, data: st.DataObject) -> None:
            route, body, path = place
            raw = data.draw(INVALID if invalid else EXTREME, label="raw")
            wrap = data.draw(st.sampled_from(["{}", "[{}]", '{{"k": {}}}', "[1, {}]"]),
                             label="wrap")
            r = client.post(route, content=with_raw(_place(body(), path), wrap.format(raw)))
            if invalid:
                error = openai_error(r, 400)
                assert "not valid JSON" in error["message"], error
            elif r.status_code != 200:
                openai_error(r, 400)

        one()

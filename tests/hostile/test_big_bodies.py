"""Bodies of megabytes are parsed by a worker process, as strictly as small ones."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.hostile.conftest import AUTH, MODEL, HostileServer, openai_error, watched

PAD = "x" * (3 << 20)  # over the 1 MiB from which a worker parses


def _post(server: HostileServer, content: bytes) -> httpx.Response:
    return httpx.post(server.base + "/v1/completions", content=content, timeout=120,
                      headers={**AUTH, "Content-Type": "application/json"})


def test_a_big_valid_body_is_answered(hostile_server: HostileServer) -> None:
    with watched(hostile_server):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "user": PAD,
                "metadata": {"k": "v"}, "stop": ["\u00e9t\u00e9 \U0001f642"]}
        r = _post(hostile_server, json.dumps(body).encode())
        assert r.status_code == 200, r.text[:300]
        assert r.json()["usage"]["completion_tokens"] <= 3


@pytest.mark.parametrize(("tail", "problem"), [
    (b'"x": NaN}', "NaN"),
    (b'"x": "\\ud800"}', "surrogate"),
    (b'"x": ' + b"[" * 200 + b"]" * 200 + b"}", "nested"),
    (b'"x": "\xff"}', "UTF-8"),
    (b'"x": }', "line 1"),
])
def test_a_big_bad_body_is_a_400_naming_the_problem(hostile_server: HostileServer,
                                                    tail: bytes, problem: str) -> None:
    with watched(hostile_server):
        head = json.dumps({"model": MODEL, "prompt": "hi", "user": PAD}).encode()[:-1]
        error = openai_error(_post(hostile_server, head + b", " + tail), 400)
        assert problem in error["message"], error

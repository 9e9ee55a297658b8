"""Hostile classes that are already refused properly, kept so they stay that way."""

from __future__ import annotations

import httpx
import pytest

from tests.hostile.conftest import AUTH, MODEL, HostileServer, openai_error, watched

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("body", "param"), [
    ({"model": MODEL, "messages": HI, "max_tokens": "5"}, "max_tokens"),
    ({"model": MODEL, "messages": HI, "max_tokens": True}, "max_tokens"),
    ({"model": MODEL, "messages": HI, "temperature": float("nan")}, None),
    ({"model": MODEL, "messages": HI, "temperature": 1e308}, "temperature"),
    ({"model": MODEL, "messages": HI, "max_tokens": 2**64}, "max_tokens"),
    ({"model": MODEL, "messages": HI, "n": -1}, "n"),
    ({"model": MODEL, "messages": "hi"}, "messages"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages"),
])
def test_wrong_types_and_ranges_are_400s(hostile_server: HostileServer, body: dict,
                                         param: str | None) -> None:
    with watched(hostile_server):
        content = httpx.Request("POST", "/", json=body).content if "nan" not in str(body) \
            else b'{"model": "qwen3-test", "messages": [{"role": "user", "content": "hi"}], ' \
                 b'"temperature": NaN}'
        r = httpx.post(hostile_server.base + CHAT, content=content,
                       headers={**AUTH, "Content-Type": "application/json"}, timeout=30)
        error = openai_error(r, 400)
        if param is not None:
            assert error["param"] == param, error


def test_no_key_or_a_wrong_key_is_a_401(hostile_server: HostileServer) -> None:
    with watched(hostile_server):
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"}):
            r = httpx.post(hostile_server.base + CHAT, json={"messages": HI},
                           headers=headers, timeout=30)
            openai_error(r, 401)

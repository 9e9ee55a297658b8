"""Stored responses with the official ``openai`` SDK against the real server: retrieve, delete,
input items paged as OpenAI pages them, conversations continued by ``previous_response_id``
(a tool loop, 32 turns whose prompts reuse the previous turn's KV), an unreachable store (503
for ``store: true`` only), and the SQLite store across a restart and past its TTL."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response

from tests.e2e.conftest import PACED, free_port, running_server, scrape, serve_args
from tests.e2e.test_responses import GET_TIME, MODEL, SAME, post

BLOCK_SIZE = 16  # the server's default KV block: the prefix cache reuses whole blocks


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def responses_total(base: str, status: str) -> float:
    return scrape(base).get(f'izh:responses_total{{status="{status}"}}', 0.0)


def test_a_stored_response_is_retrieved_listed_and_deleted(server: str,
                                                           client: openai.OpenAI) -> None:
    before = responses_total(server, "incomplete")
    items = [{"role": "user", "content": f"line {i}"} for i in range(5)]
    created = client.responses.create(model=MODEL, input=items, **SAME)
    assert created.store is True and created.status == "incomplete"
    assert responses_total(server, "incomplete") == before + 1
    got = client.responses.retrieve(created.id)
    assert got.model_dump() == created.model_dump()
    # OpenAI's list: newest first by default, cursors by item id, has_more.
    page = client.responses.input_items.list(created.id, limit=2, order="asc")
    assert [i.content[0].text for i in page.data] == ["line 0", "line 1"]
    assert page.has_more and page.first_id == page.data[0].id
    every = [i.content[0].text for i in client.responses.input_items.list(created.id, limit=2)]
    assert every == [f"line {i}" for i in reversed(range(5))]  # the SDK followed the cursors
    raw = httpx.get(f"{server}/v1/responses/{created.id}/input_items",
                    params={"order": "asc", "after": page.last_id, "before": page.data[0].id})
    assert raw.json()["data"] == [] and raw.json()["has_more"] is False
    for params, param in (({"limit": 0}, "limit"), ({"order": "up"}, "order"),
                          ({"after": "msg_nope"}, "after"), ({"limit": "x"}, "limit")):
        bad = httpx.get(f"{server}/v1/responses/{created.id}/input_items", params=params)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, params
    deleted = httpx.delete(f"{server}/v1/responses/{created.id}")
    assert deleted.json() == {"id": created.id, "object": "response", "deleted": True}
    for call in (lambda: client.responses.retrieve(created.id),
                 lambda: client.responses.delete(created.id),
                 lambda: client.responses.input_items.list(created.id),
                 lambda: client.responses.create(model=MODEL, input="on",
                                                 previous_response_id=created.id)):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.body["code"] == "not_found" and created.id in err.value.message


def test_store_false_is_not_kept(client: openai.OpenAI) -> None:
    out = client.responses.create(model=MODEL, input="hi", store=False, **SAME)
    assert out.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(out.id)


def _turn(client: openai.OpenAI, **body: Any) -> Response:
    return client.responses.create(model=MODEL, **{**SAME, **body})


def test_a_tool_loop_by_previous_response_id_is_the_loop_resent(client: openai.OpenAI) -> None:
    """The chained prompt is the previous turns' items then the new input, with this
    request's instructions only: the same tokens as the whole loop resent by the client."""
    first = _turn(client, input="What time is it in UTC?", instructions="Use tools.",
                  tools=[GET_TIME], tool_choice="required", max_output_tokens=200,
                  temperature=1.0, extra_body={"seed": 3})
    answers = [{"type": "function_call_output", "call_id": item.call_id, "output": "12:00"}
               for item in first.output if item.type == "function_call"]
    assert answers
    tools = {"tools": [GET_TIME], "instructions": "Use tools."}
    chained = _turn(client, input=answers, previous_response_id=first.id, **tools)
    assert chained.previous_response_id == first.id
    resent = _turn(client, input=[{"role": "user", "content": "What time is it in UTC?"},
                                  *[i.model_dump(exclude_none=True) for i in first.output],
                                  *answers], store=False, **tools)
    assert chained.usage.input_tokens == resent.usage.input_tokens
    assert chained.output_text == resent.output_text  # greedy: the very same prompt
    # The chained turn reused the first turn's prompt: its blocks were in the prefix cache.
    assert chained.usage.input_tokens_details.cached_tokens >= \
        first.usage.input_tokens // BLOCK_SIZE * BLOCK_SIZE - BLOCK_SIZE
    # Instructions are not carried over: without them, the prompt is shorter by theirs.
    bare = _turn(client, input=answers, previous_response_id=first.id, tools=[GET_TIME])
    assert bare.instructions is None and bare.usage.input_tokens < chained.usage.input_tokens
    # Its input items are its own input; the conversation is reached through the chain.
    assert [i.type for i in client.responses.input_items.list(chained.id)] == \
        ["function_call_output"] * len(answers)


def test_32_chained_turns_reuse_the_conversation_kv(client: openai.OpenAI) -> None:
    previous: Response | None = None
    cached = []
    for turn in range(32):
        out = _turn(client, input=f"Turn {turn}.", max_output_tokens=4,
                    previous_response_id=previous.id if previous else None)
        if previous is not None:
            # Turn N's prompt extends turn N-1's: all of its full blocks are hits.
            reused = previous.usage.input_tokens // BLOCK_SIZE * BLOCK_SIZE
            assert out.usage.input_tokens_details.cached_tokens >= reused - BLOCK_SIZE, turn
            assert out.usage.input_tokens > previous.usage.input_tokens
        cached.append(out.usage.input_tokens_details.cached_tokens)
        previous = out
    assert cached == sorted(cached) and cached[-1] >= cached[1] + 15 * BLOCK_SIZE


def test_an_unreachable_store_fails_stored_requests_only(hf_dir: Path, tmp_path: Path) -> None:
    port, closed = free_port(), free_port()  # nothing listens on ``closed``
    args = serve_args(hf_dir, port, "--response-store", f"redis://127.0.0.1:{closed}/0")
    with running_server(args, tmp_path / "server.log", port=port) as (base, _proc):
        body = {"input": "hi", "max_output_tokens": 2}
        refused = post(base, body)
        assert refused.status_code == 503, refused.text
        assert "response store is unavailable" in refused.json()["error"]["message"]
        assert post(base, {**body, "background": True}).status_code == 503
        assert post(base, {**body, "stream": True}).status_code == 503
        assert post(base, {**body, "store": False}).status_code == 200
        assert httpx.get(f"{base}/v1/responses/resp_1").status_code == 503


def test_a_default_store_that_cannot_open_refuses_stored_requests_only(
        hf_dir: Path, tmp_path: Path) -> None:
    """The default store lives in the cache directory; where that cannot be written, the
    server still starts and serves everything but stored responses."""
    (tmp_path / "file").write_text("not a directory")
    port = free_port()
    env = {"IZH_CACHE_DIR": str(tmp_path / "file" / "cache")}
    with running_server(serve_args(hf_dir, port), tmp_path / "server.log", port=port,
                        env=env) as (base, _proc):
        body = {"input": "hi", "max_output_tokens": 2}
        refused = post(base, body)
        assert refused.status_code == 503, refused.text
        assert "response store is unavailable" in refused.json()["error"]["message"]
        assert post(base, {**body, "store": False}).status_code == 200
        chat = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert chat.status_code == 200, chat.text
    assert "the default response store cannot be opened" in (tmp_path / "server.log").read_text()


def test_a_bad_store_url_is_a_one_line_error(hf_dir: Path, tmp_path: Path) -> None:
    out = subprocess.run(serve_args(hf_dir, free_port(), "--response-store", "mysql://db"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1] == ("izh-trio serve: error: --response-store "
                                           "'mysql://db': expected sqlite:///PATH or "
                                           "redis://HOST:PORT/DB")


@pytest.mark.timing
def test_sqlite_keeps_responses_across_a_restart_and_fails_drained_ones(
        hf_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "responses.sqlite3"
    port = free_port()
    args = serve_args(hf_dir, port, "--response-store", f"sqlite:///{store}",
                      "--drain-timeout", "0.2")
    with running_server(args, tmp_path / "a.log", port=port, env=PACED) as (base, proc):
        kept = post(base, {"input": "remember me", **{k: v for k, v in SAME.items()
                                                      if k != "extra_body"}}).json()
        running = post(base, {"input": "long", "background": True, "max_output_tokens": 2000,
                              "ignore_eos": True}).json()
        _wait_status(base, running["id"], "in_progress")
        proc.send_signal(signal.SIGTERM)  # drained: 0.2 s, then it fails, stored so
        assert proc.wait(timeout=60) == 0
    with running_server(args, tmp_path / "b.log", port=port) as (base, _proc):
        again = httpx.get(f"{base}/v1/responses/{kept['id']}").json()
        assert again == kept
        failed = httpx.get(f"{base}/v1/responses/{running['id']}").json()
        assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
        chained = post(base, {"input": "and now?", "previous_response_id": kept["id"],
                              "max_output_tokens": 2})
        assert chained.status_code == 200, chained.text


@pytest.mark.timing
def test_responses_past_their_ttl_are_deleted(hf_dir: Path, tmp_path: Path) -> None:
    store = tmp_path / "responses.sqlite3"
    port = free_port()
    args = serve_args(hf_dir, port, "--response-store", f"sqlite:///{store}",
                      "--response-store-ttl", "6")
    with running_server(args, tmp_path / "server.log", port=port) as (base, _proc):
        out = post(base, {"input": "brief", "max_output_tokens": 1}).json()
        with sqlite3.connect(store) as db:  # written with its expiry, the TTL after creation
            [(expires, created)] = db.execute(
                "SELECT expires_at, created_at FROM responses WHERE id = ?", (out["id"],))
        assert expires == created + 6
        deadline = time.monotonic() + 60
        while True:  # the periodic sweep deletes the row (reads hide it from its expiry on)
            with sqlite3.connect(store) as db:
                rows = db.execute("SELECT count(*) FROM responses WHERE id = ?",
                                  (out["id"],)).fetchone()[0]
            if rows == 0:
                break
            assert time.monotonic() < deadline, "the expired response was not deleted"
            time.sleep(0.1)
        assert httpx.get(f"{base}/v1/responses/{out['id']}").status_code == 404


def _wait_status(base: str, response_id: str, status: str, within: float = 60) -> dict:
    deadline = time.monotonic() + within
    while True:
        got = httpx.get(f"{base}/v1/responses/{response_id}", timeout=10).json()
        if got["status"] == status:
            return got
        assert time.monotonic() < deadline, got["status"]
        time.sleep(0.02)

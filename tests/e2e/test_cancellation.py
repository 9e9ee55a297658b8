"""Cancellation is structural: whatever ends a request's scope frees its KV blocks.

Against a real hypercorn server and the real engine subprocess: the client goes away (closes
the connection, or its own cancel scope fires) and the engine must report nothing running and
no KV block held within a bounded time.
"""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.e2e.conftest import scrape

LONG = {"prompt": "Tell me a long story.", "max_tokens": 500, "temperature": 0,
        "ignore_eos": True, "stream": True}
#: For the timed cancels: far more than the engine can make before the cancel lands.
LONGER = {**LONG, "max_tokens": 1800}
GENERATED = "izh:generation_tokens_total"  # counted by the engine, aborted requests included


async def _idle_within(base: str, seconds: float) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        with trio.move_on_after(seconds):
            while True:
                m = _parse((await client.get(base + "/metrics")).text)
                if m["izh:num_requests_running"] == 0 and m["izh:kv_cache_usage_perc"] == 0 \
                        and m["izh:num_requests_in_flight"] == 0:  # admission tickets too
                    return m
                await trio.sleep(0.02)
    raise AssertionError(f"engine still busy after {seconds}s: {m}")


def _parse(text: str) -> dict[str, float]:
    return {line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
            for line in text.splitlines() if line and not line.startswith("#")}


async def test_disconnect_after_first_chunk_frees_kv(server: str) -> None:
    before = scrape(server)
    async with httpx.AsyncClient(timeout=30) as client, \
            client.stream("POST", server + "/v1/completions", json=LONG) as r:
        assert r.status_code == 200
        # A named iterator: a dropped one is finalised by trio at once, and closing it closes
        # the response, i.e. disconnects before this test means to.
        lines = r.aiter_lines()
        async for line in lines:
            if line.startswith("data: {"):
                break
        busy = _parse((await client.get(server + "/metrics")).text)
        assert busy["izh:num_requests_running"] == 1, (line, busy)
        assert busy["izh:kv_cache_usage_perc"] > 0
    # leaving the block closed the connection mid-stream
    after = await _idle_within(server, 2.0)
    assert after[GENERATED] - before[GENERATED] < 500, "the engine finished instead of aborting"


async def test_client_cancel_scope_frees_kv(server: str) -> None:
    before = scrape(server)
    async with httpx.AsyncClient(timeout=30) as client:
        with trio.move_on_after(0.3) as scope:
            async with client.stream("POST", server + "/v1/completions", json=LONGER) as r:
                async for _ in r.aiter_lines():
                    pass
        assert scope.cancelled_caught
    after = await _idle_within(server, 2.0)
    assert after[GENERATED] - before[GENERATED] < LONGER["max_tokens"]


async def test_disconnect_of_a_non_streaming_request_frees_kv(server: str) -> None:
    before = scrape(server)
    async with httpx.AsyncClient(timeout=30) as client:
        with trio.move_on_after(0.3) as scope:
            await client.post(server + "/v1/completions", json={**LONGER, "stream": False})
        assert scope.cancelled_caught
    after = await _idle_within(server, 2.0)
    assert after[GENERATED] - before[GENERATED] < LONGER["max_tokens"]


async def test_many_disconnects_at_random_points_leave_nothing(server: str) -> None:
    import random

    rng = random.Random(7)

    async def one(client: httpx.AsyncClient, delay: float) -> None:
        with trio.move_on_after(delay):
            async with client.stream("POST", server + "/v1/completions", json=LONG) as r:
                async for _ in r.aiter_lines():
                    pass

    before = scrape(server)
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(timeout=30, limits=limits) as c, trio.open_nursery() as nursery:
        for _ in range(32):
            nursery.start_soon(one, c, rng.uniform(0.05, 1.0))
    after = await _idle_within(server, 3.0)
    assert after[GENERATED] - before[GENERATED] < 32 * LONG["max_tokens"]
    async with httpx.AsyncClient() as client:
        assert (await client.get(server + "/health")).status_code == 200


@pytest.mark.parametrize("linger", [0.0, 0.05])
async def test_clients_gone_before_the_response_starts_leave_nothing(server: str, linger: float
                                                                     ) -> None:
    """A streamed request reaches the engine from its route, before quart sends the status
    line; a client that sends its request and leaves at once is then gone before the body
    ever runs. The request's scope must still abort it: a burst of such requests leaves the
    engine idle, far from the tokens they asked for."""
    import json
    import socket

    host, port = server.removeprefix("http://").split(":")
    body = json.dumps({**LONGER, "max_tokens": 2000}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json"
            f"\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    before = scrape(server)

    async def hit_and_run() -> None:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with sock:
            await sock.connect((host, int(port)))
            await sock.send(head + body)
            await trio.sleep(linger)  # leave at once, or once it is routed; never read

    async with trio.open_nursery() as nursery:
        for _ in range(16):
            nursery.start_soon(hit_and_run)
    after = await _idle_within(server, 3.0)
    assert after[GENERATED] - before[GENERATED] < 16 * 2000 // 4
    async with httpx.AsyncClient() as client:
        assert (await client.get(server + "/health")).status_code == 200

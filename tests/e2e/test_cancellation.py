"""Cancellation is structural: whatever ends a request's scope frees its KV blocks.

Against a real hypercorn server and the real engine subprocess: the client goes away (closes
the connection, or its own cancel scope fires) and the engine must then report nothing running
and no KV block held, having generated fewer tokens than were asked for.

The server is paced (``paced_server``: a request of N tokens runs N x 10 ms or more), so a
request is still running when its client leaves however fast the machine is, and the token
count proves it was aborted rather than finished; the tests wait for states, not for times.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import pytest
import trio

from tests.e2e.conftest import RUNNING, idle, parse_metrics, scrape

pytestmark = pytest.mark.timing

LONG = {"prompt": "Tell me a long story.", "max_tokens": 500, "temperature": 0,
        "ignore_eos": True, "stream": True}
LONGER = {**LONG, "max_tokens": 1800}
GENERATED = "izh:generation_tokens_total"  # counted by the engine, aborted requests included
#: A bound against a leak, not a measure: the engine is idle within a step or two here.
IDLE_WITHIN = 30.0


async def _metrics_until(base: str, ready: Callable[[dict[str, float]], bool],
                         within: float = IDLE_WITHIN) -> dict[str, float]:
    """Scrape /metrics (without blocking the event loop) until ``ready`` holds."""
    async with httpx.AsyncClient() as client:
        with trio.move_on_after(within):
            while True:
                m = _parse((await client.get(base + "/metrics")).text)
                if ready(m):
                    return m
                await trio.sleep(0.01)
    raise AssertionError(f"not reached within {within}s: {m}")


async def _idle(base: str) -> dict[str, float]:
    return await _metrics_until(base, idle)


_parse = parse_metrics


async def test_disconnect_after_first_chunk_frees_kv(paced_server: str) -> None:
    server = paced_server
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
    after = await _idle(server)
    assert after[GENERATED] - before[GENERATED] < 500, "the engine finished instead of aborting"


async def _cancel_while_running(
        server: str, request: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    """Run ``request`` in a cancel scope of the client's and cancel it once the engine is
    running it (a state, where a fixed delay might come before the request reached the
    engine on a slow machine, or after it finished on a fast one)."""
    finished = []
    async with httpx.AsyncClient(timeout=60) as client:

        async def run(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await request(client)
                finished.append(True)

        async with trio.open_nursery() as nursery:
            scope = await nursery.start(run)
            await _metrics_until(server, lambda m: m[RUNNING] == 1)
            scope.cancel()
    assert not finished, "the request ended before its scope was cancelled"


async def test_client_cancel_scope_frees_kv(paced_server: str) -> None:
    server = paced_server
    before = scrape(server)

    async def stream(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", server + "/v1/completions", json=LONGER) as r:
            async for _ in r.aiter_lines():
                pass

    await _cancel_while_running(server, stream)
    after = await _idle(server)
    assert after[GENERATED] - before[GENERATED] < LONGER["max_tokens"]


async def test_disconnect_of_a_non_streaming_request_frees_kv(paced_server: str) -> None:
    server = paced_server
    before = scrape(server)

    async def post(client: httpx.AsyncClient) -> None:
        await client.post(server + "/v1/completions", json={**LONGER, "stream": False})

    await _cancel_while_running(server, post)
    after = await _idle(server)
    assert after[GENERATED] - before[GENERATED] < LONGER["max_tokens"]


async def test_many_disconnects_at_random_points_leave_nothing(paced_server: str) -> None:
    """32 streams cut at random times; paced, none of them can finish first (5 s or more)."""
    import random

    server = paced_server

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
    after = await _idle(server)
    assert after[GENERATED] - before[GENERATED] < 32 * LONG["max_tokens"]
    async with httpx.AsyncClient() as client:
        assert (await client.get(server + "/health")).status_code == 200


@pytest.mark.parametrize("linger", [0.0, 0.05])
async def test_clients_gone_before_the_response_starts_leave_nothing(
        paced_server: str, linger: float) -> None:
    """A streamed request reaches the engine from its route, before quart sends the status
    line; a client that sends its request and leaves at once is then gone before the body
    ever runs. The request's scope must still abort it: a burst of such requests leaves the
    engine idle, far from the tokens they asked for (paced, 2,000 tokens take 20 s)."""
    import json
    import socket

    server = paced_server
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
    after = await _idle(server)
    assert after[GENERATED] - before[GENERATED] < 16 * 2000 // 4
    async with httpx.AsyncClient() as client:
        assert (await client.get(server + "/health")).status_code == 200

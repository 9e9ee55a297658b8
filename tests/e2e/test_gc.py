"""The HTTP process's garbage collector stays out of the way of a burst of streams."""

from __future__ import annotations

import httpx
import trio

from tests.e2e.conftest import scrape

_GEN = 'python_gc_collections_total{generation="%d"}'


async def test_a_burst_of_streams_barely_runs_the_collector(server: str) -> None:
    """A step's outputs and chunks are made in bursts and freed milliseconds later: with
    CPython's default threshold (700) this burst ran ~50 first-generation collections; the
    server raises it (``GC_FIRST_THRESHOLD``), so almost none run."""
    before = scrape(server)
    body = {"model": "qwen3-test", "prompt": [5, 6, 7, 8], "max_tokens": 64, "stream": True,
            "ignore_eos": True, "temperature": 0}
    chunks: list[int] = []

    async def one(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            chunks.append(sum([1 async for line in r.aiter_lines() if line.startswith("data:")]))

    limits = httpx.Limits(max_connections=64)
    with trio.fail_after(120):
        async with (httpx.AsyncClient(base_url=server, limits=limits, timeout=60) as client,
                    trio.open_nursery() as nursery):
            for _ in range(64):
                nursery.start_soon(one, client)
    assert len(chunks) == 64 and min(chunks) >= 2
    after = scrape(server)
    assert after[_GEN % 0] - before[_GEN % 0] <= 5
    assert after["process_cpu_seconds_total"] > before["process_cpu_seconds_total"]

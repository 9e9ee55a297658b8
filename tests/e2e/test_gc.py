"""The HTTP process's garbage collector stays out of the way: a burst of streams barely runs
it, and no request leaves a reference cycle for it. It runs its first generation only every
50,000 containers (``server.GC_FIRST_THRESHOLD``), so whatever cycles requests leave are freed
all at once, on the event loop; hypercorn's per-connection cycle is
``tests/frontend/test_connection_cycles.py``'s."""

from __future__ import annotations

import collections
import gc
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from izh_trio.frontend.app import create_app
from izh_trio.frontend.settings import Settings
from tests.e2e.conftest import scrape
from tests.refcycles import cyclic_collector_off

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


MODEL = "qwen3-test"
HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
TOOL_USE = {"role": "assistant", "content": [
    {"type": "tool_use", "id": "a", "name": "f", "input": {}}]}
#: werkzeug's URL matcher makes a recursive closure for every request (a function, its
#: cells, a set, a tuple: 8 objects). The cycles found in our own code took 28-109.
ALLOWED = 16
ROUNDS = 5

CASES: list[tuple[str, str, dict[str, Any], int]] = [
    ("POST", "/v1/chat/completions", {"messages": HI, "max_tokens": 2}, 200),
    ("POST", "/v1/chat/completions", {"messages": HI, "max_tokens": 2, "stream": True}, 200),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400),
    ("POST", "/v1/chat/completions", {"messages": HI, "stop_token_ids": [1, "x"]}, 400),
    ("POST", "/v1/chat/completions", {"messages": HI, "max_tokens": 100_000}, 400),
    # refused by the engine (the forced call's grammar needs more tokens): a failed stream
    ("POST", "/v1/chat/completions", {"messages": HI, "tools": [TOOL],
                                      "tool_choice": "required", "max_tokens": 2}, 400),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}, 200),
    ("POST", "/v1/completions", {"prompt": [1, 2, 10**9]}, 400),
    ("POST", "/v1/messages", {"max_tokens": 2, "messages": HI}, 200),
    ("POST", "/v1/messages", {"max_tokens": 1, "messages": [*HI, TOOL_USE, {
        "role": "user", "content": [{"type": "tool_result", "tool_use_id": "b",
                                     "content": "ok"}]}]}, 400),
    ("POST", "/v1/messages/count_tokens", {"messages": HI}, 200),
    ("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 2}, 200),
    ("POST", "/v1/responses", {"input": [{"type": "zz"}]}, 400),
    ("POST", "/tokenize", {"prompt": "hi"}, 200),
    ("POST", "/detokenize", {"tokens": [1, "x"]}, 400),
    ("POST", "/v1/nope", {}, 404),
    ("GET", "/v1/chat/completions", {}, 405),
]


@pytest.fixture
async def client(hf_dir: Path) -> Any:
    """The app in this process, serving; the collector's settings, which its start-up
    changes (a frozen heap, a higher threshold), restored after."""
    threshold = gc.get_threshold()
    app = create_app(Settings(model_dir=hf_dir, served_model_name=MODEL))
    try:
        async with app.test_app() as test_app:
            yield test_app.test_client()
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


async def test_no_request_leaves_a_reference_cycle(client: Any) -> None:
    async def ask(method: str, path: str, body: dict[str, Any]) -> int:
        if method == "GET":
            response = await client.get(path)
        else:
            response = await client.post(path, json={"model": MODEL, **body})
        await response.get_data()
        return int(response.status_code)

    for method, path, body, status in CASES:  # once first: caches filled on first use
        assert await ask(method, path, body) == status, (method, path, body)
    left: dict[str, float] = {}
    with cyclic_collector_off():
        for method, path, body, _ in CASES:
            for _ in range(ROUNDS):
                await ask(method, path, body)
            await trio.testing.wait_all_tasks_blocked()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                found = gc.collect() / ROUNDS
                kinds = collections.Counter(type(o).__name__ for o in gc.garbage)
            finally:
                gc.garbage.clear()
                gc.set_debug(0)
                gc.collect()
            if found > ALLOWED:
                left[f"{method} {path} {body}"] = found
                print(path, kinds.most_common(8))
    assert not left, f"objects in reference cycles a request: {left}"


def test_the_connection_churn_tool_reports_the_collector(server: str) -> None:
    """``tools/bench/connection_churn.py``, as a user runs it, against a real server."""
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-m", "tools.bench.connection_churn", "--base",
                          server, "--requests", "8", "--model", MODEL], cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert re.fullmatch(r"8 requests, a connection each, in [\d.]+ s", lines[0]), lines
    assert re.fullmatch(r"first-generation collections: \d+, objects freed \d+, pauses \d+ "
                        r"ms in all, the longest (-|<= [\d.]+ ms)", lines[1]), lines
    assert re.fullmatch(r"worst event-loop lag since start \d+ ms, stalls of the server's "
                        r"own \d+", lines[2]), lines

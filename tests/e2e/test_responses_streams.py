"""A Responses stream's two ways to end early: its client leaves (the generation is aborted
and its KV freed, as for chat), or the engine dies under it (the stream ends in one
``response.failed`` event carrying the error, never a bare cut).

Paced engines (``PACED``: a request of N tokens runs N x 10 ms or more), so that a request is
still running when the test acts, however fast the machine; every wait is for a state.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest
import trio
from openai.types.responses import Response, ResponseStreamEvent

from tests.e2e.conftest import (
    PACED,
    RUNNING,
    engine_pid,
    free_port,
    idle,
    parse_metrics,
    running_server,
    scrape,
    serve_args,
    wait_for_metrics,
)

pytestmark = pytest.mark.timing

FAILED = 'izh:responses_total{status="failed"}'
HEALTHY = "izh:engine_healthy"
GENERATED = "izh:generation_tokens_total"  # counted by the engine, aborted requests included
LONG = {"input": "Tell me a long story.", "max_output_tokens": 1800, "temperature": 0,
        "ignore_eos": True, "stream": True}
STREAM_EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)


_parse = parse_metrics


async def _metrics_until(client: httpx.AsyncClient, base: str, ready: Any) -> dict[str, float]:
    with trio.fail_after(30):  # a bound against a leak: the engine is idle within steps
        while not ready(m := _parse((await client.get(base + "/metrics")).text)):
            await trio.sleep(0.01)
    return m


async def test_a_client_leaving_mid_stream_frees_the_kv(paced_server: str) -> None:
    base = paced_server
    before = scrape(base)
    async with httpx.AsyncClient(timeout=30) as client:
        async with client.stream("POST", base + "/v1/responses", json=LONG) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()  # named: a dropped iterator would close the response
            async for line in lines:
                if line.startswith("data: ") and "response.output_text.delta" in line:
                    break
            busy = _parse((await client.get(base + "/metrics")).text)
            assert busy[RUNNING] == 1 and busy["izh:kv_cache_usage_perc"] > 0
        # leaving the block closed the connection mid-stream
        after = await _metrics_until(client, base, idle)
    assert after[GENERATED] - before[GENERATED] < LONG["max_output_tokens"]


async def test_an_engine_failure_mid_stream_ends_in_response_failed(hf_dir: Path,
                                                                    tmp_path: Path) -> None:
    port = free_port()
    with running_server(serve_args(hf_dir, port), tmp_path / "log", port=port,
                        env=PACED) as (base, proc):
        child = engine_pid(proc.pid)
        events: list[dict[str, Any]] = []
        killed = False
        async with httpx.AsyncClient(timeout=30) as client:
            with trio.fail_after(30):  # against a hang: the failure itself comes at once
                async with client.stream("POST", base + "/v1/responses", json=LONG) as r:
                    async for line in r.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        events.append(json.loads(line.removeprefix("data: ")))
                        if events[-1]["type"] == "response.output_text.delta" \
                                and not killed:
                            killed = True
                            os.kill(child, signal.SIGKILL)
        for event in events:
            STREAM_EVENTS.validate_python(event)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        kinds = [e["type"] for e in events]
        assert kinds[-1] == "response.failed"
        assert not {"response.completed", "response.incomplete"} & set(kinds)
        failed = Response.model_validate(events[-1]["response"])
        assert failed.status == "failed" and failed.error.code == "server_error"
        assert "engine" in failed.error.message
        [message] = failed.output  # what was said before the failure, left incomplete
        assert message.status == "incomplete" and message.content[0].text
        assert scrape(base)[FAILED] == 1

        # A plain request whose engine dies under it is an error status, and counted too.
        wait_for_metrics(base, lambda m: m[HEALTHY] == 1 and m[RUNNING] == 0,
                         what="the engine respawned")
        dead, child = child, engine_pid(proc.pid)
        assert child != dead
        async with httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as nursery:
            answers: list[httpx.Response] = []

            async def post() -> None:
                answers.append(await client.post(base + "/v1/responses",
                                                 json={**LONG, "stream": False}))

            nursery.start_soon(post)
            with trio.fail_after(30):
                while scrape(base)[RUNNING] != 1:
                    await trio.sleep(0.01)
            os.kill(child, signal.SIGKILL)
        [answer] = answers
        assert answer.status_code == 500, answer.text
        assert "engine" in answer.json()["error"]["message"]
        assert scrape(base)[FAILED] == 2

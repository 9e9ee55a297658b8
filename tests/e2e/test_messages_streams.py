"""A Messages stream's two ways to end early: its client leaves (the generation is aborted and
its KV freed, as for chat), or the engine dies under it (the stream ends in Anthropic's
``error`` event, which the SDK raises, never a bare cut).

Paced engines (``PACED``: a request of N tokens runs N x 10 ms or more), so that a request is
still running when the test acts, however fast the machine; every wait is for a state.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
import trio

from tests.e2e.conftest import (
    PACED,
    RUNNING,
    engine_pid,
    free_port,
    idle,
    running_server,
    scrape,
    serve_args,
    wait_for_metrics,
)

pytestmark = pytest.mark.timing

GENERATED_TOTAL = "izh:generation_tokens_total"  # counted by the engine, aborts included

LONG = {"model": "qwen3-test", "max_tokens": 1800, "temperature": 0, "ignore_eos": True,
        "stream": True, "messages": [{"role": "user", "content": "Tell me a long story."}]}


async def test_a_client_leaving_mid_stream_frees_the_kv(paced_server: str) -> None:
    base = paced_server
    before = scrape(base)
    async with httpx.AsyncClient(timeout=30) as client:
        async with client.stream("POST", base + "/v1/messages", json=LONG) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()  # named: a dropped iterator would close the response
            async for line in lines:
                if line.startswith("data: ") and '"content_block_delta"' in line:
                    break
            busy = scrape(base)
            assert busy[RUNNING] == 1 and busy["izh:kv_cache_usage_perc"] > 0
        # leaving the block closed the connection mid-stream
        with trio.fail_after(30):  # a bound against a leak: the engine is idle within steps
            while not idle(scrape(base)):
                await trio.sleep(0.01)
    assert scrape(base)[GENERATED_TOTAL] - before[GENERATED_TOTAL] < LONG["max_tokens"]


def test_an_engine_failure_mid_stream_is_an_error_event(hf_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    with running_server(serve_args(hf_dir, port, "--served-model-name", "qwen3-test"),
                        tmp_path / "log", port=port, env=PACED) as (base, proc):
        child = engine_pid(proc.pid)
        events: list[tuple[str, dict[str, Any]]] = []
        kind = ""
        with httpx.stream("POST", base + "/v1/messages", json=LONG, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    events.append((kind, json.loads(line.removeprefix("data: "))))
                    if kind == "content_block_delta" and child:
                        os.kill(child, signal.SIGKILL)
                        child = 0
        kinds = [k for k, _ in events]
        assert kinds[0] == "message_start" and kinds[-1] == "error", kinds[-5:]
        assert "message_stop" not in kinds
        error = events[-1][1]
        assert error["type"] == "error" and error["error"]["type"] == "api_error"
        assert "engine" in error["error"]["message"]

        # The SDK raises it, as it raises Anthropic's own in-stream errors.
        wait_for_metrics(base, lambda m: m["izh:engine_healthy"] == 1 and m[RUNNING] == 0,
                         what="the engine respawned")
        child = engine_pid(proc.pid)
        client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
        body = {k: v for k, v in LONG.items() if k not in ("stream", "temperature",
                                                            "ignore_eos")}
        with pytest.raises(anthropic.APIStatusError) as caught, \
                client.messages.stream(**body, extra_body={"ignore_eos": True}) as stream:
            for event in stream:
                if event.type == "content_block_delta" and child:
                    os.kill(child, signal.SIGKILL)
                    child = 0
        assert "engine" in str(caught.value)

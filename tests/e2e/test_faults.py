"""Faults: the engine dies, the server dies, keys are wrong, the server is full.

Servers whose requests must still be running when the test acts run a paced engine
(``PACED``, tests/e2e/conftest.py), and every wait is for a state.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

from tests.e2e.conftest import (
    PACED,
    engine_pid,
    free_port,
    running_server,
    scrape,
    serve_args,
)

LONG = {"prompt": "Go on.", "max_tokens": 1800, "temperature": 0, "ignore_eos": True,
        "stream": True}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _parent_thread(server_pid: int, child: int) -> int | None:
    """The thread of the server whose child ``child`` is (its ``/proc/PID/task/TID/children``):
    the one that forked it while that one lives, then the one the kernel hands it to."""
    for task in Path(f"/proc/{server_pid}/task").iterdir():
        try:
            if str(child) in (task / "children").read_text().split():
                return int(task.name)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return None


@pytest.mark.timing
async def test_engine_death_fails_streams_and_health_then_recovers(hf_dir: Path, tmp_path: Path
                                                                   ) -> None:
    """The stream fails at once (in-band 500), health and new requests say 503 while the core
    is down, the server stays up, and a fresh core is respawned that serves again. Paced, the
    stream's 1,800 tokens take 18 s or more: it is running when the core is killed."""
    port = free_port()
    with running_server(serve_args(hf_dir, port), tmp_path / "log", port=port,
                        env=PACED) as (base, proc):
        child = engine_pid(proc.pid)
        events: list[str] = []
        async with httpx.AsyncClient(timeout=30) as client:
            with trio.fail_after(30):  # against a hang: the failure itself comes at once
                async with client.stream("POST", base + "/v1/completions", json=LONG) as r:
                    async for line in r.aiter_lines():
                        if not line:
                            continue
                        events.append(line)
                        if len(events) == 1:
                            crashed_at = trio.current_time()
                            os.kill(child, signal.SIGKILL)
            # at once: from the closed pipe, not from a time-out (the 18 s it would have run)
            assert trio.current_time() - crashed_at < 5.0
            assert events[-1] == "data: [DONE]"
            error = json.loads(events[-2].removeprefix("data: "))["error"]
            assert error["code"] == 500 and "engine" in error["message"]
            health = await client.get(base + "/health")
            assert health.status_code == 503 and "error" in health.json()
            r = await client.post(base + "/v1/completions", json={"prompt": "x"})
            assert r.status_code == 503 and r.json()["error"]["code"] == 503
            assert proc.poll() is None, "the server itself must stay up"
            with trio.fail_after(30):  # respawned by itself
                while (await client.get(base + "/health")).status_code != 200:
                    await trio.sleep(0.1)
            r = await client.post(base + "/v1/completions", json={"prompt": "x",
                                                                  "max_tokens": 3})
            assert r.status_code == 200
        assert engine_pid(proc.pid) != child
        m = scrape(base)
        assert m["izh:engine_restarts_total"] == 1 and m["izh:engine_healthy"] == 1
        # the engine's death failed the stream: a failure, not an abort of the frontend's
        assert not any(v for k, v in m.items() if k.startswith("izh:request_aborts_total"))
        assert m['izh:request_refusals_total{cause="pending"}'] == 0  # 503s, not at capacity
        assert m['izh:http_responses_total{status="5xx"}'] >= 2  # /health and the request


def test_engine_exits_when_the_server_is_killed(hf_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    with running_server(serve_args(hf_dir, port), tmp_path / "log", port=port) as (_, proc):
        child = engine_pid(proc.pid)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)


@pytest.mark.timing
def test_api_keys_and_admission_cap(hf_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    args = serve_args(hf_dir, port, "--api-key", "k1", "--api-key", "k2", "--max-pending", "2")
    # Paced: the two held streams run 18 s or more, so they hold both slots for the third.
    with running_server(args, tmp_path / "log", port=port, env=PACED) as (base, proc):
        child = engine_pid(proc.pid)
        url = base + "/v1/completions"
        body = {"prompt": "x", "max_tokens": 2}
        assert httpx.post(url, json=body).status_code == 401
        bad = httpx.post(url, json=body, headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
        assert httpx.post(url, json=body, headers={"Authorization": "Bearer k2"}).status_code \
            == 200
        assert httpx.get(base + "/health").status_code == 200  # probes need no key

        auth = {"Authorization": "Bearer k1"}
        with httpx.Client(timeout=30, headers=auth) as client:
            with client.stream("POST", url, json=LONG) as s1, \
                    client.stream("POST", url, json=LONG) as s2:
                assert s1.status_code == s2.status_code == 200
                third = client.post(url, json=LONG)
                assert third.status_code == 503
                assert third.headers["Retry-After"] == "1"
                assert third.json()["error"]["code"] == "server_overloaded"
            # both streams were closed: their tickets are back
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                r = client.post(url, json=body)
                if r.status_code == 200:
                    break
                time.sleep(0.05)
            assert r.status_code == 200
        # The engine outlives the trio worker thread that spawned it (retired after ~10 s idle;
        # PDEATHSIG would have killed the engine with it): wait for that thread to be gone,
        # i.e. for the kernel to have handed the engine to the main thread.
        deadline = time.monotonic() + 60
        while _parent_thread(proc.pid, child) != proc.pid:
            assert time.monotonic() < deadline, "the spawning thread never retired"
            time.sleep(0.1)
        assert _alive(child) and engine_pid(proc.pid) == child
        assert httpx.get(base + "/health").status_code == 200


@pytest.mark.parametrize("payload", [b"\x00\x00\x00\x05garba", b"\xff\xff\xff\xff"])
def test_engine_reports_a_malformed_frame_and_exits(hf_dir: Path, payload: bytes) -> None:
    """A malformed frame is a protocol error: the core says Fatal and stops, never guesses."""
    from izh_trio.wire import EngineConfig, Fatal, FrameDecoder, Ready
    from izh_trio.wire.codec import converter

    child_in, parent_out = os.pipe()
    parent_in, child_out = os.pipe()
    config = json.dumps(converter.unstructure(EngineConfig(model_dir=str(hf_dir),
                                                           num_kv_blocks=16)))
    proc = subprocess.Popen([sys.executable, "-m", "izh_trio.engine", "--in-fd", str(child_in),
                             "--out-fd", str(child_out), "--config", config],
                            pass_fds=(child_in, child_out))
    os.close(child_in)
    os.close(child_out)
    decoder, seen = FrameDecoder(), []
    with os.fdopen(parent_in, "rb", buffering=0) as rx, os.fdopen(parent_out, "wb") as tx:
        while not seen:
            seen += decoder.feed(rx.read(65536))
        assert isinstance(seen[0], Ready)
        tx.write(payload)
        tx.flush()
        while not any(isinstance(m, Fatal) for m in seen):
            data = rx.read(65536)
            assert data, "the core closed its pipe without saying why"
            seen += decoder.feed(data)
    assert proc.wait(timeout=10) == 2


def test_engine_exits_on_eof(hf_dir: Path) -> None:
    from izh_trio.wire import EngineConfig
    from izh_trio.wire.codec import converter

    child_in, parent_out = os.pipe()
    config = json.dumps(converter.unstructure(EngineConfig(model_dir=str(hf_dir),
                                                           num_kv_blocks=16)))
    proc = subprocess.Popen([sys.executable, "-m", "izh_trio.engine", "--in-fd", str(child_in),
                             "--out-fd", "1", "--config", config], pass_fds=(child_in,),
                            stdout=subprocess.DEVNULL)
    os.close(child_in)
    os.close(parent_out)
    assert proc.wait(timeout=30) == 0

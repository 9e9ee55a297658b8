"""tools/studies/bench_http_floor.py: its stand-ins stream what our server streams, and stop."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = [sys.executable, "-m", "tools.studies.bench_http_floor"]  # run from ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("app", ["asgi", "quart"])
def test_stand_in_streams_one_token_per_tick_and_stops_on_sigint(app: str) -> None:
    port = _free_port()
    proc = subprocess.Popen([*TOOL, "--serve", app, "--port", str(port),
                             "--step-ms", "2"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(base + "/v1/models", timeout=1).raise_for_status()
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        chunks = list(client.completions.create(
            model="floor", prompt=[1, 2, 3], max_tokens=5, stream=True,
            stream_options={"include_usage": True}, timeout=10))
        texts = [c.choices[0].text for c in chunks if c.choices]
        assert texts == [" tok"] * 5
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
        assert httpx.post(base + "/tokenize", json={}, timeout=5).status_code == 404
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

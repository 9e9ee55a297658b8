"""Priority scheduling and request-size limits, over real HTTP."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.e2e.conftest import free_port, running_server, serve_args


def test_priority_preempts_over_http(hf_dir: Path, tmp_path: Path) -> None:
    """With one sequence slot, a later request with a lower priority value runs first."""
    port = free_port()
    args = serve_args(hf_dir, port, "--max-num-seqs", "1")
    with running_server(args, tmp_path / "log", port=port) as (base, _):
        url = base + "/v1/completions"

        def call(priority: int, max_tokens: int) -> float:
            r = httpx.post(url, timeout=60, json={
                "prompt": "x", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "priority": priority})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == max_tokens
            return time.monotonic()

        with ThreadPoolExecutor(2) as pool:
            low = pool.submit(call, 10, 800)
            time.sleep(0.3)  # the low-priority request is running by now
            high = pool.submit(call, 0, 5)
            assert high.result() < low.result()
        metrics = httpx.get(base + "/metrics").text
        assert "izh:num_preemptions_total 1.0" in metrics


def test_body_over_the_limit_is_413(server: str) -> None:
    r = httpx.post(server + "/v1/completions", content=b"{" + b" " * (33 << 20) + b"}",
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == 413
    assert httpx.get(server + "/health").status_code == 200

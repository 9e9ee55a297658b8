"""Priority scheduling and request-size limits, over real HTTP."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import (
    PACED,
    RUNNING,
    free_port,
    running_server,
    scrape,
    serve_args,
    wait_for_metrics,
)


@pytest.mark.timing
def test_priority_preempts_over_http(hf_dir: Path, tmp_path: Path) -> None:
    """With one sequence slot, a later request with a lower priority value preempts the one
    running and finishes first."""
    port = free_port()
    args = serve_args(hf_dir, port, "--max-num-seqs", "1")
    # Paced: the low-priority request's 300 tokens take 3 s or more on any machine, so it is
    # still running when the high-priority one arrives (unpaced, a fast machine finished 800
    # before the second request came).
    with running_server(args, tmp_path / "log", port=port, env=PACED) as (base, _):
        url = base + "/v1/completions"

        def call(priority: int, max_tokens: int) -> float:
            r = httpx.post(url, timeout=60, json={
                "prompt": "x", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "priority": priority})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == max_tokens
            return time.monotonic()

        with ThreadPoolExecutor(2) as pool:
            low = pool.submit(call, 10, 300)
            wait_for_metrics(base, lambda m: m[RUNNING] == 1, what="the low one running")
            high = pool.submit(call, 0, 5)
            assert high.result() < low.result()
        assert scrape(base)["izh:num_preemptions_total"] == 1


def test_body_over_the_limit_is_413(server: str) -> None:
    r = httpx.post(server + "/v1/completions", content=b"{" + b" " * (33 << 20) + b"}",
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == 413
    assert httpx.get(server + "/health").status_code == 200

"""tools/bench_serve.py against a real ``izh-trio serve``: the CLI as a user runs it."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import free_port, running_server, serve_args

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "bench_serve.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LATENCIES = ("ttft", "tpot", "itl", "e2el")
N, INPUT, OUTPUT = 12, 16, 8


def bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), "--no-progress", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_MAGIC


@pytest.fixture(scope="module")
def base_url(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("bench-logs") / "server.log"
    with running_server(serve_args(tiny_dir, port), log, port=port) as (base, _proc):
        yield base


@pytest.fixture(scope="module")
def sweep(base_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """One completions sweep shared by the tests that read its outputs."""
    out = tmp_path_factory.mktemp("bench")
    res = bench("--base-url", base_url, "--num-prompts", str(N), "--concurrency", "1,4",
                "--input-len", str(INPUT), "--output-len", str(OUTPUT), "--warmup", "1",
                "--label", "izh", "--result-json", str(out / "r.json"),
                "--plot", str(out / "r.png"))
    assert res.returncode == 0, res.stdout + res.stderr
    return out / "r.json", out / "r.png", res.stdout


def check_point(p: dict[str, Any], *, n: int, output_len: int | None) -> None:
    assert p["completed"] == n and p["failed"] == 0 and p["errors"] == []
    if output_len is not None:  # ignore_eos: every request runs to max_tokens
        assert p["total_output_tokens"] == n * output_len
    assert p["total_input_tokens"] > 0 and p["duration"] > 0
    d = p["duration"]
    assert p["request_throughput"] == pytest.approx(n / d)
    assert p["output_throughput"] == pytest.approx(p["total_output_tokens"] / d)
    assert p["total_token_throughput"] == pytest.approx(
        (p["total_input_tokens"] + p["total_output_tokens"]) / d)
    for m in LATENCIES:
        mean, med, p99 = p[f"mean_{m}_ms"], p[f"median_{m}_ms"], p[f"p99_{m}_ms"]
        assert mean > 0 and 0 < med <= p99, (m, mean, med, p99)
    # a request's wait for its first token is part of its end-to-end latency
    assert p["median_ttft_ms"] <= p["p99_e2el_ms"]
    assert p["mean_e2el_ms"] < d * 1000
    assert 1 <= p["max_concurrent_requests"] <= (p["max_concurrency"] or n)
    assert p["max_output_tokens_per_s"] > 0


def test_sweep_json_table_and_png(sweep: tuple[Path, Path, str], base_url: str) -> None:
    json_path, png_path, stdout = sweep
    doc = json.loads(json_path.read_text())
    assert doc["label"] == "izh" and doc["base_url"] == base_url
    assert doc["endpoint"] == "completions" and doc["model"]
    assert doc["started_at"] <= doc["finished_at"]
    assert doc["config"]["num_prompts"] == N and doc["config"]["concurrency"] == [1, 4]
    assert [p["max_concurrency"] for p in doc["points"]] == [1, 4]
    for p in doc["points"]:
        check_point(p, n=N, output_len=OUTPUT)
        if doc["server"]["prompt_source"] != "words":  # token-id prompts have exact lengths
            assert p["total_input_tokens"] == N * INPUT
    assert doc["points"][0]["max_concurrent_requests"] == 1
    assert is_png(png_path)
    for row in ("output throughput (tok/s)", "median TTFT (ms)", "p99 ITL (ms)", "c=4"):
        assert row in stdout


def test_plot_mode_draws_two_results(sweep: tuple[Path, Path, str], tmp_path: Path) -> None:
    json_path, _, _ = sweep
    other = json.loads(json_path.read_text()) | {"label": "other"}
    (tmp_path / "b.json").write_text(json.dumps(other))
    res = subprocess.run([sys.executable, str(TOOL), "plot", str(json_path),
                          str(tmp_path / "b.json"), "--out", str(tmp_path / "cmp.png")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert is_png(tmp_path / "cmp.png")


def test_dead_url_counts_failures(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    res = bench("--base-url", dead, "--model", "m", "--num-prompts", "3", "--concurrency",
                "2", "--input-len", "4", "--output-len", "2", "--timeout", "10",
                "--result-json", str(tmp_path / "dead.json"))
    assert res.returncode == 3, res.stdout + res.stderr  # documented: some requests failed
    assert "Traceback" not in res.stderr
    (p,) = json.loads((tmp_path / "dead.json").read_text())["points"]
    assert p["completed"] == 0 and p["failed"] == 3
    assert p["errors"] and all("Connect" in e for e in p["errors"])
    assert p["median_ttft_ms"] is None and p["output_throughput"] == 0
    assert "3 failed" in res.stdout


def test_chat_endpoint(base_url: str, tmp_path: Path) -> None:
    probe = httpx.post(base_url + "/v1/chat/completions", timeout=30, json={
        "model": httpx.get(base_url + "/v1/models").json()["data"][0]["id"],
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    if probe.status_code != 200:
        pytest.skip(f"/v1/chat/completions answered {probe.status_code}: not served yet")
    res = bench("--base-url", base_url, "--endpoint", "chat", "--num-prompts", "6",
                "--concurrency", "3", "--input-len", "24", "--output-len", "6",
                "--result-json", str(tmp_path / "chat.json"))
    assert res.returncode == 0, res.stdout + res.stderr
    (p,) = json.loads((tmp_path / "chat.json").read_text())["points"]
    check_point(p, n=6, output_len=6)
    assert p["total_input_tokens"] >= 6 * 10  # the server's count, chat template included


def test_summary_arithmetic() -> None:
    """TPOT, ITL and peaks from hand-made outcomes, without a server."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        client = importlib.import_module("bench.client")
        metrics = importlib.import_module("bench.metrics")
    finally:
        sys.path.remove(str(ROOT / "tools"))
    ok = client.Outcome(ok=True, start=0.0, end=1.0, ttft=0.2, chunk_times=[0.2, 0.6, 1.0],
                        prompt_tokens=10, output_tokens=5)
    bad = client.Outcome(error="HTTP 500: boom")
    p = metrics.summarize([ok, bad], duration=2.0)
    assert (p["completed"], p["failed"], p["errors"]) == (1, 1, ["HTTP 500: boom"])
    assert p["mean_tpot_ms"] == pytest.approx(200.0)  # (1.0 - 0.2) / (5 - 1)
    assert p["median_itl_ms"] == pytest.approx(400.0)
    assert p["median_e2el_ms"] == pytest.approx(1000.0)
    assert p["output_throughput"] == pytest.approx(2.5)
    assert p["total_token_throughput"] == pytest.approx(7.5)
    assert p["max_output_tokens_per_s"] == pytest.approx(5.0)  # all 5 tokens within 1 s
    assert p["max_concurrent_requests"] == 1

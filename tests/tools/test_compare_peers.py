"""tools/bench/compare_peers.py in paired mode, against our real server alone (vLLM is not a test
dependency): every round is measured, the summary keeps them but the warm-up rounds', and the
server is stopped."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_paired_rounds_are_measured_and_summarised(tiny_dir: Path, tmp_path: Path) -> None:
    port = _free_port()
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.compare_peers", "--model-dir", str(tiny_dir),
         "--servers", "izh", "--workloads", "smoke", "--rounds", "2", "--warm-rounds", "1",
         "--settle-timeout", "0",
         "--port", str(port), "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    runs = summary["runs"]["smoke"]["izh"]
    assert len(runs) == 2  # the warm-up round ran (its point is on disk) but is not reported
    assert json.loads((tmp_path / "izh-smoke--1.json").read_text())["points"][0]["completed"] == 8
    for point in runs:
        assert point["completed"] == 8 and point["failed"] == 0
        assert point["total_output_tokens"] == 8 * 4
        assert point["server_cpu_us_per_token"] > 0
    throughput = summary["smoke"]["output_throughput"]
    assert throughput["izh"] > 0 and throughput["ratio"] is None
    with socket.socket() as s:  # the server is gone: its port can be bound again
        s.bind(("127.0.0.1", port))

"""tools/bench/bench_tracing.py against two real servers, tracing off and on: both are
measured, the traced one's spans reach the tool's collector, and both servers are stopped."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _free_port_pair() -> int:
    """A port whose successor is free too (the tool takes both)."""
    while True:
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


def test_both_servers_are_measured_and_the_traced_one_exports(tiny_dir: Path,
                                                              tmp_path: Path) -> None:
    port = _free_port_pair()
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.bench_tracing", "--model-dir", str(tiny_dir),
         "--workloads", "smoke", "--rounds", "1", "--settle-timeout", "0",
         "--port", str(port), "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads((tmp_path / "summary.json").read_text())["runs"]["smoke"]
    for kind in ("traced", "off"):
        (point,) = runs[kind]
        assert point["completed"] == 8 and point["failed"] == 0
    exports = re.search(r"the collector took (\d+) exports", done.stdout)
    assert exports is not None and int(exports[1]) >= 1, done.stdout[-2000:]
    for p in (port, port + 1):  # both servers are gone: their ports can be bound again
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))

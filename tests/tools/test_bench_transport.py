"""tools/studies/bench_transport.py: both transports run end to end; the step check catches loss."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = "tools.studies.bench_transport"  # a module, run from ROOT
N = 16


def load_tool():
    """A fresh copy of the module, so a test's patches stay in that test."""
    spec = importlib.util.find_spec(TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("transport", ["pipe", "zmq"])
def test_cli_every_step_arrives_whole(transport: str, tmp_path: Path) -> None:
    if transport == "zmq":
        pytest.importorskip("zmq")
    out = tmp_path / "r.json"
    res = subprocess.run(
        [sys.executable, "-m", TOOL, "--transport", transport, "--streams", str(N), "--steps",
         "30", "--paced-steps", "10", "--interval-ms", "5", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    results = json.loads(out.read_text())["results"]
    assert [(r["transport"], r["mode"]) for r in results] == [
        (transport, "saturated"), (transport, "paced")]
    for r in results:
        assert r["status"] == "ok" and r["streams"] == N
        # Each step once, in order, with N one-token outputs: no mismatch of any kind.
        assert r["mismatch_total"] == 0, r["mismatches"]
        assert r["mismatches"]["missing_steps"] == 0
        assert r["steps_per_s"] > 0 and r["frame_bytes"] > 0
        assert r["child_cpu_us_per_step"] > 0 and r["parent_cpu_us_per_step"] > 0
        assert 0 < r["latency_us"]["p50"] <= r["latency_us"]["p99"] <= r["latency_us"]["max"]
    assert results[1]["steps_per_s"] < 1000 / 5 * 2  # paced: about one step per 5 ms
    assert "saturated" in res.stdout and "paced" in res.stdout


def args(**kw: object) -> argparse.Namespace:
    base = dict(transport="pipe", mode="saturated", streams=N, steps=12, paced_steps=5,
                interval_ms=1.0, repeat=1)
    return argparse.Namespace(**{**base, **kw})


async def test_short_steps_are_counted(tmp_path: Path) -> None:
    """A core that runs one stream too few: every step must be flagged, nothing else."""
    bt = load_tool()
    wrapper = ("import json, runpy, sys; c = json.loads(sys.argv[2]); c['streams'] -= 1; "
               "sys.exit(runpy.run_module(sys.argv[1])['child'](c))")
    bt.CHILD = [sys.executable, "-c", wrapper, TOOL]
    r = await bt.measure("pipe", "saturated", args(), tmp_path)
    assert r["mismatches"]["wrong_output_count"] == 12
    assert r["mismatch_total"] == 12


async def test_zmq_skipped_without_pyzmq(tmp_path: Path) -> None:
    bt = load_tool()
    bt._zmq = lambda: None
    results = await bt.run_all(args(transport="zmq", mode="both"))
    assert [(r["mode"], r["status"]) for r in results] == [("saturated", "skipped"),
                                                           ("paced", "skipped")]
    assert "pip install pyzmq" in results[0]["reason"]


def test_loopback_floor_is_measured() -> None:
    """tools/studies/bench_loopback.py times real writes to a reading peer process, three ways."""
    done = subprocess.run([sys.executable, "-m", "tools.studies.bench_loopback", "--sends",
                           "200", "--streams", "4", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    figures = json.loads(done.stdout)
    assert figures["sends"] == 200
    for name in ("plain", "yield", "trio"):
        assert 0 < figures[f"{name}_cpu_us"] <= figures[f"{name}_wall_us"] * 1.5 < 100_000

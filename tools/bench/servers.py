"""Servers under test as child processes: start in their own session, wait, measure, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]  # the checkout


def tool(module: str) -> list[str]:
    """The command that runs one of these tools, ``module`` as ``tools.bench.bench_serve``;
    run it with ``cwd=ROOT``, where ``tools`` is importable."""
    return [sys.executable, "-m", module]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    """In a new session, so that stopping it reaches every process it started; in the
    checkout, so that ``tool`` commands find their modules."""
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=ROOT)


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError("server did not start")


def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of ``root`` and all its live descendants (Linux /proc)."""
    tick, total, todo = os.sysconf("SC_CLK_TCK"), 0.0, [root]
    while todo:
        pid = todo.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            # Children hang off the thread that spawned them, not always the main one.
            children = {int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                        for c in (task / "children").read_text().split()}
        except OSError:  # gone meanwhile
            continue
        todo += children
    return total


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def machine_busy(interval: float = 0.5) -> float:
    """The share of all CPUs busy over the next ``interval`` seconds (Linux /proc/stat)."""

    def snap() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields[:8]), fields[3] + fields[4]  # all but guest time; idle + iowait

    total0, idle0 = snap()
    time.sleep(interval)
    total1, idle1 = snap()
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def settle(below: float = 0.1, timeout: float = 20.0) -> float:
    """Wait until the machine is quiet (busy share under ``below``), at most ``timeout``
    seconds; the last share seen. A server that spins for a while after its last request
    would otherwise take CPU from the next run."""
    deadline = time.monotonic() + timeout
    while True:
        busy = machine_busy()
        if busy < below or time.monotonic() >= deadline:
            return busy

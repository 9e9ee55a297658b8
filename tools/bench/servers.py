"""Servers under test as child processes: start in their own session, wait, measure, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    """In a new session, so that stopping it reaches every process it started."""
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


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

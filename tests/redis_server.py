"""A real ``redis-server`` for tests (Debian's package; ``.ci/run`` installs it), on a free
loopback port in a temporary directory, with persistence off."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

#: Generous: only a broken install takes this long, and the wait ends as soon as it answers.
START_TIMEOUT_S = 60.0


def redis_server_binary() -> str:
    """Its path, or a skip where the package is not installed."""
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if found is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def running_redis(workdir: Path) -> Iterator[str]:
    """Start one, wait until it answers PING, yield its URL (``redis://127.0.0.1:PORT/0``),
    then stop it."""
    binary = redis_server_binary()
    port = _free_port()
    log = (workdir / f"redis-{port}.log").open("wb")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
         "--save", "", "--appendonly", "no"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers_ping(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise RuntimeError(f"redis-server did not start: see {log.name}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

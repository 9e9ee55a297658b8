"""A real server for hostile requests, watched from outside while they land.

Every hostile test runs its requests inside :func:`watched`: a thread polls ``/health`` the
whole time (the event loop must never stall), and afterwards the server must be the same
process with the same engine core, idle (nothing running, waiting, held in the KV cache or
in flight) and with no traceback in its log.
"""

from __future__ import annotations

import array
import fcntl
import os
import signal
import termios
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import httpx
import pytest

from tests.e2e.conftest import engine_pid, free_port, running_server, scrape, serve_args

MODEL = "qwen3-test"
#: /health must answer within this while hostile requests are served (the issue's bound).
HEALTH_BOUND = 0.1
#: How long the server may take to be idle again after the last hostile request ended.
IDLE_WITHIN = 30.0
IDLE_METRICS = ("izh:num_requests_running", "izh:num_requests_waiting",
                "izh:kv_cache_usage_perc", "izh:num_requests_in_flight")


@attrs.define
class HostileServer:
    base: str
    pid: int
    engine: int
    log: Path
    log_offset: int = 0  # where the current test's part of the log begins

    def new_log(self) -> str:
        text = self.log.read_text(errors="replace")
        return text[self.log_offset:]


@pytest.fixture(scope="package")
def hostile_server(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[HostileServer]:
    """``izh-trio serve`` on a transformers-made checkpoint, with an API key (the auth paths
    are hostile ground too), shared by the hostile tests."""
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "hostile-server.log"
    args = serve_args(hf_dir, port, "--served-model-name", MODEL, "--api-key", KEY)
    with running_server(args, log, port=port) as (base, proc):
        yield HostileServer(base, proc.pid, engine_pid(proc.pid), log)


KEY = "hostile-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@attrs.define
class HealthWatch:
    """Polls /health from a thread; every answer's latency (or the failure) is kept."""

    base: str
    latencies: list[float] = attrs.Factory(list)
    failures: list[str] = attrs.Factory(list)
    _stop: threading.Event = attrs.Factory(threading.Event)

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    r = client.get(self.base + "/health")
                    if r.status_code != 200:
                        self.failures.append(f"/health answered {r.status_code}")
                except httpx.HTTPError as exc:
                    self.failures.append(f"/health failed: {exc!r}")
                self.latencies.append(time.monotonic() - start)
                self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()

    def wait_for_answers(self, count: int, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while len(self.latencies) < count and time.monotonic() < deadline:
            time.sleep(0.005)


def wait_idle(base: str, within: float = IDLE_WITHIN) -> dict[str, float]:
    deadline = time.monotonic() + within
    while True:
        m = scrape(base)
        if all(m.get(name) == 0 for name in IDLE_METRICS):
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"not idle {within}s after the requests: "
                                 f"{ {name: m.get(name) for name in IDLE_METRICS} }")
        time.sleep(0.02)


@contextmanager
def watched(server: HostileServer) -> Iterator[HealthWatch]:
    """Run hostile requests under a /health watch; then check the server came through."""
    server.log_offset = len(server.log.read_text(errors="replace"))
    watch = HealthWatch(server.base)
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    watch.wait_for_answers(1)
    try:
        yield watch
    finally:
        watch.wait_for_answers(len(watch.latencies) + 1)  # one more, after the last request
        watch.stop()
        thread.join(15)
    assert not watch.failures, watch.failures[:5]
    assert watch.latencies, "/health was never asked"
    worst = max(watch.latencies)
    assert worst < HEALTH_BOUND, f"/health took {worst * 1000:.0f} ms (bound {HEALTH_BOUND}s)"
    assert engine_pid(server.pid) == server.engine, "the engine core was replaced"
    wait_idle(server.base)
    log = server.new_log()
    assert "Traceback" not in log, log[-3000:]


def openai_error(r: httpx.Response, status: int) -> dict:
    """The body of an OpenAI-shaped error with this status."""
    assert r.status_code == status, (r.status_code, r.text[:500])
    body = r.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"], error
    for leak in ("Traceback", "panicked at", "/rustc/", ".rs:", "stack backtrace"):
        assert leak not in error["message"], error["message"]
    return error


def stop_process(pid: int, within: float = 30.0) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped: the signal is taken asynchronously, and a
    process that has not stopped yet may still read what is sent to it meanwhile."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + within
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.005)


def queued_bytes(fd: int) -> int:
    """Bytes waiting in the pipe ``fd`` is an end of (FIONREAD; on Linux either end says)."""
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


def job_pipe_bytes(worker: int) -> int:
    """Bytes waiting in a grammar worker's job pipe (its ``--in-fd``), counted through the
    pipe opened via /proc: none are taken."""
    args = Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")
    fd = int(args[args.index(b"--in-fd") + 1])
    pipe = os.open(f"/proc/{worker}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)
    try:
        return queued_bytes(pipe)
    finally:
        os.close(pipe)

"""Real servers for end-to-end tests: separate processes on 127.0.0.1, torn down after.

No test here may assume how fast the machine generates. A test that acts on a request while
it runs (cancels it, drains it, preempts it, fills a slot with it) runs a *paced* engine
(``PACED``: the engine pauses ``STEP_DELAY`` after each step, a test-only setting), so that a
request of N tokens runs for at least N x ``STEP_DELAY`` however fast the machine is, and it
waits for states (``wait_for_metrics``, a line in a log, an event), never for a fixed time;
a slower machine only makes it wait longer. Deadlines on those waits are generous bounds
against a hang, not measurements.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(
    args: list[str], log_path: Path, *, env: dict[str, str] | None = None, port: int,
    timeout: float = 120.0, new_session: bool = False,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start a server process, wait for /health, yield (base URL, process), stop it.
    ``new_session``: in a process group of its own (which a test may signal as a whole)."""
    full_env = {**os.environ, **(env or {})}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                stdin=subprocess.DEVNULL, start_new_session=new_session)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited {proc.returncode}:\n"
                                       + log_path.read_text()[-3000:])
                try:
                    if httpx.get(base + "/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not become healthy:\n"
                                       + log_path.read_text()[-3000:])
                time.sleep(0.1)
            yield base, proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


#: The paced engine's pause after each step (``IZH_TEST_STEP_DELAY``, engine/process.py): a
#: sequence makes at most 100 tokens a second, so 1,800 tokens take 18 s or more anywhere.
STEP_DELAY = 0.01
PACED = {"IZH_TEST_STEP_DELAY": str(STEP_DELAY)}

RUNNING = "izh:num_requests_running"
WAITING = "izh:num_requests_waiting"
IN_FLIGHT = "izh:num_requests_in_flight"
KV_USAGE = "izh:kv_cache_usage_perc"


def serve_args(model_dir: Path | None, port: int, *extra: str) -> list[str]:
    args = [sys.executable, "-m", "izh_trio", "serve", "--port", str(port)]
    if model_dir is not None:
        args += ["--model-dir", str(model_dir)]
    return [*args, *extra]


@pytest.fixture(scope="session")
def server(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``izh-trio serve`` on a transformers-made checkpoint, shared by the e2e tests."""
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "server.log"
    args = serve_args(hf_dir, port, "--served-model-name", "qwen3-test",
                      "--response-store", f"sqlite:///{log.parent}/responses.sqlite3")
    with running_server(args, log, port=port) as (base, _proc):
        yield base


@pytest.fixture(scope="session")
def paced_server(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Like ``server``, with a paced engine: for tests that act on a request while it runs.
    (A small KV cache: it lives as long as the session, beside ``server``.)"""
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "paced-server.log"
    args = serve_args(hf_dir, port, "--served-model-name", "qwen3-test", "--kv-cache-gib", "0.25",
                      "--response-store", f"sqlite:///{log.parent}/responses.sqlite3")
    with running_server(args, log, port=port, env=PACED) as (base, _proc):
        yield base


def engine_pid(server_pid: int) -> int:
    """The engine core: the server's one child running ``izh_trio.engine`` (grammar workers
    are its children too)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == server_pid and b"izh_trio.engine" in cmdline:
            children.append(int(stat.parent.name))
    assert len(children) == 1, children
    return children[0]


def parse_metrics(text: str) -> dict[str, float]:
    """Each sample of an exposition by its name and labels, less ``model_name`` (which every
    vLLM-named series carries, and the tests here serve one model)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            name = _MODEL_LABEL.sub("", name).replace(",}", "}").replace("{}", "")
            out[name] = float(value)
    return out


_MODEL_LABEL = re.compile(r'model_name="[^"]*",?')


def scrape(base: str) -> dict[str, float]:
    return parse_metrics(httpx.get(base + "/metrics", timeout=5).text)


def wait_for_metrics(base: str, ready: Callable[[dict[str, float]], bool], *,
                     within: float = 30.0, what: str = "the state") -> dict[str, float]:
    """Scrape ``/metrics`` until ``ready`` holds; the last scrape. ``within`` only bounds a
    hang: a slow machine gets there later, and this waits for it."""
    deadline = time.monotonic() + within
    while True:
        metrics = scrape(base)
        if ready(metrics):
            return metrics
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} was not reached within {within} s: "
                                 f"{ {k: v for k, v in metrics.items() if k.startswith('izh:')} }")
        time.sleep(0.01)


def idle(metrics: dict[str, float]) -> bool:
    """Nothing running, waiting, in flight (admission tickets too) or held in the KV cache."""
    return all(metrics[name] == 0 for name in (RUNNING, WAITING, IN_FLIGHT, KV_USAGE))


def assert_streamed_calls_match(client: Any, kwargs: dict[str, Any], seed: int) -> None:
    """A forced-call chat completion, streamed and not, with the same seed: the streamed
    deltas (no content; each call's first delta with its id, type and name) reassemble to the
    non-streamed calls, and both finish with ``tool_calls``."""
    whole = client.chat.completions.create(**kwargs, seed=seed).choices[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**kwargs, seed=seed, stream=True):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            assert not c.delta.content
            for tc in c.delta.tool_calls or []:
                if tc.id is not None:  # the first delta of a call: id, type and name
                    assert tc.type == "function" and tc.function.name
                    calls[tc.index] = {"name": tc.function.name, "arguments": ""}
                calls[tc.index]["arguments"] += tc.function.arguments or ""
    assert finish == whole.finish_reason == "tool_calls"
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c.function.name, "arguments": c.function.arguments}
        for c in whole.message.tool_calls]

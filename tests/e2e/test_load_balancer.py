"""Two replicas behind a real nginx using tools/deploy/nginx.conf; one drains mid-traffic.

Runs when nginx is installed (.ci/run installs it). No request may be lost: requests in flight
on the draining replica finish there, and new ones are turned away with a 503 that nginx
retries on the other replica. The replicas are paced (``PACED``: each request's 60 tokens
take 0.6 s or more) and the drain starts once both serve requests, a state, so it lands
mid-traffic on a machine of any speed.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import (
    PACED,
    RUNNING,
    free_port,
    running_server,
    serve_args,
    wait_for_metrics,
)

DEPLOY = Path(__file__).resolve().parents[2] / "tools" / "deploy"
NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/sbin/nginx") if Path(p).exists()), None)

pytestmark = [pytest.mark.timing,
              pytest.mark.skipif(NGINX is None, reason="nginx is not installed")]


def _nginx_conf(tmp: Path, front: int, a: int, b: int) -> Path:
    site = (DEPLOY / "nginx.conf").read_text()
    site = site.replace("127.0.0.1:8001", f"127.0.0.1:{a}").replace(
        "127.0.0.1:8002", f"127.0.0.1:{b}").replace("listen 127.0.0.1:8080",
                                                    f"listen 127.0.0.1:{front}")
    (tmp / "site.conf").write_text(site)
    main = tmp / "nginx.conf"
    main.write_text(f"""daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {tmp}/site.conf;
}}
""")
    return main


@contextmanager
def running_nginx(tmp: Path, front: int, a: int, b: int) -> Iterator[str]:
    """nginx on ``front`` in front of the replicas on ``a`` and ``b``, once it answers
    /health; its base URL. Stopped after."""
    with open(tmp / "nginx.out", "wb") as out:
        nginx = subprocess.Popen([NGINX, "-c", str(_nginx_conf(tmp, front, a, b)), "-p",
                                  str(tmp)], stderr=subprocess.STDOUT, stdout=out)
        try:
            base = f"http://127.0.0.1:{front}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(base + "/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, (tmp / "error.log").read_text()
                time.sleep(0.05)
            yield base
        finally:
            nginx.terminate()
            nginx.wait(10)


def test_draining_one_replica_loses_no_request(hf_dir: Path, tmp_path: Path) -> None:
    a, b, front = free_port(), free_port(), free_port()
    with ExitStack() as stack:
        ra = stack.enter_context(running_server(
            serve_args(hf_dir, a, "--drain-timeout", "30"), tmp_path / "a.log", port=a,
            env=PACED))
        stack.enter_context(running_server(serve_args(hf_dir, b), tmp_path / "b.log", port=b,
                                           env=PACED))
        base = stack.enter_context(running_nginx(tmp_path, front, a, b))

        def one(i: int) -> tuple[int, str | None, int]:
            body = {"prompt": f"request {i}", "max_tokens": 60, "temperature": 0,
                    "ignore_eos": True, "stream": i % 2 == 0}
            with httpx.Client(timeout=60) as client:
                if not body["stream"]:
                    r = client.post(base + "/v1/completions", json=body)
                    data = r.json()
                    return r.status_code, data["choices"][0]["finish_reason"], \
                        data["usage"]["completion_tokens"]
                with client.stream("POST", base + "/v1/completions", json=body) as r:
                    chunks = [json.loads(line[6:]) for line in r.iter_lines()
                              if line.startswith("data: {")]
                    assert chunks and "error" not in chunks[-1], chunks[-1:]
                    return r.status_code, chunks[-1]["choices"][0]["finish_reason"], \
                        len(chunks)

        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(one, i) for i in range(48)]
            for replica in (a, b):  # traffic is flowing through both replicas
                wait_for_metrics(f"http://127.0.0.1:{replica}", lambda m: m[RUNNING] >= 1,
                                 what=f"requests running on :{replica}")
            ra[1].send_signal(signal.SIGTERM)  # paced: 6 waves of 0.6 s or more still to go
            results = [f.result() for f in futures]
        assert all(status == 200 and reason == "length" for status, reason, _ in results)
        assert ra[1].wait(timeout=40) == 0
        # nginx writes a request's log line after its response went out: wait for the 48th
        # (one line a request: none was retried on the other replica)
        deadline = time.monotonic() + 30
        while (count := (tmp_path / "access.log").read_text().count("POST /v1/completions")) \
                < 48 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert count == 48

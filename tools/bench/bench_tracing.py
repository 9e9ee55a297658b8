"""What tracing costs: our server with tracing off against the same with
``--otlp-traces-endpoint`` set, paired as ``compare_peers`` pairs servers.

    python -m tools.bench.bench_tracing [--model-dir DIR] [--rounds 4] [--workloads 32x32]

Both servers stay up side by side; every round runs each workload on one and then the
other, the order alternating between rounds, after the machine has gone quiet. The traced
one exports to a collector in this process that accepts every export and drops it (a real
collector runs elsewhere; its cost is not the server's), so what is measured is the span
work on the request path and the SDK's export thread. The report: medians per server and
their ratios (traced / off), as ``compare_peers`` prints them.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from izh_trio.tiny import TinySpec, make_tiny_checkpoint
from tools.bench import servers
from tools.bench.compare_peers import report, run_paired

KINDS = ("traced", "off")  # the ratio: traced / off


@contextmanager
def dropping_collector() -> Iterator[tuple[str, list[int]]]:
    """An OTLP/HTTP endpoint on 127.0.0.1 that answers every export 200 and keeps nothing
    but the size of each (its URL, those sizes)."""
    sizes: list[int] = []

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            sizes.append(len(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", sizes
    finally:
        server.shutdown()
        server.server_close()


def _command(model_dir: Path, port: int, collector: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "izh_trio", "serve", "--model-dir", str(model_dir),
           "--port", str(port)]
    return cmd if collector is None else [*cmd, "--otlp-traces-endpoint", collector]


def paired(names: list[str], rounds: int, model_dir: Path, port: int, out: Path,
           settle_timeout: float, control: bool = False) -> dict:
    with dropping_collector() as (collector, sizes):
        commands = {kind: _command(model_dir, port + i,
                                   collector if kind == "traced" and not control else None)
                    for i, kind in enumerate(KINDS)}
        results = run_paired(commands, names, rounds, port, out, settle_timeout)
    print(f"the collector took {len(sizes)} exports, {sum(sizes) / 1e3:.0f} kB of spans")
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--workloads", default="32x32", help="compare_peers' names")
    p.add_argument("--port", type=int, default=8400, help="the first server's (+1: the other)")
    p.add_argument("--out", type=Path, default=servers.ROOT / "bench-results" / "tracing")
    p.add_argument("--settle-timeout", type=float, default=20.0,
                   help="at most this long waiting for a quiet machine before a run")
    p.add_argument("--control", action="store_true",
                   help="trace neither server: the pairing's own bias and noise (A/A)")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    model_dir = a.model_dir or a.out / "tiny-qwen3"
    if a.model_dir is None:  # compare_peers' reference checkpoint, made once
        make_tiny_checkpoint(model_dir, TinySpec())
    results = paired(a.workloads.split(","), a.rounds, model_dir, a.port, a.out,
                     a.settle_timeout, a.control)
    report(results, a.out, KINDS)


if __name__ == "__main__":
    main()

"""What one small write to a loopback TCP peer costs here, with no server code at all.

    python -m tools.studies.bench_loopback [--sends 3000] [--size 150] [--streams 32] [--json]

Every streamed token a server sends is at least one such write (an SSE event). The reader is
another process, as a real client is. Three figures, each as wall-clock and as the writer's
own CPU time per write:

* ``plain``: back-to-back ``sendall`` on a blocking socket (the kernel's share);
* ``yield``: the same with ``time.sleep(0)`` after each write, so the reader gets to run
  between writes, as it does between a server's events (the wall time then includes the
  context switches; the writer's CPU is what a server pays);
* ``trio``: ``SocketStream.send_all`` on ``--streams`` connections from as many trio tasks,
  a ``trio.sleep(0)`` after each write: the floor for any trio server's per-event cost,
  before its HTTP layer.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable

import trio


def _reader(listener: socket.socket, streams: int) -> None:
    """The peer: accept ``streams`` connections and read them all until each closes."""
    sel = selectors.DefaultSelector()
    for _ in range(streams):
        conn, _ = listener.accept()
        conn.setblocking(False)
        sel.register(conn, selectors.EVENT_READ)
    alive = streams
    while alive:
        for key, _ in sel.select():
            if not key.fileobj.recv(1 << 16):
                sel.unregister(key.fileobj)
                alive -= 1


def _with_peer(streams: int, write: Callable[[tuple[str, int]], tuple[float, float]]
               ) -> tuple[float, float]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(streams)
    pid = os.fork()
    if pid == 0:
        try:
            _reader(listener, streams)
        finally:
            os._exit(0)
    address = listener.getsockname()
    listener.close()
    try:
        return write(address)
    finally:
        os.kill(pid, signal.SIGKILL)  # done measuring, or failed before connecting
        os.waitpid(pid, 0)


def _plain(sends: int, size: int, yield_between: bool) -> tuple[float, float]:
    def write(address: tuple[str, int]) -> tuple[float, float]:
        with socket.create_connection(address) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            payload = b"x" * size
            for _ in range(min(100, sends)):  # warm the path up
                sock.sendall(payload)
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(sends):
                sock.sendall(payload)
                if yield_between:
                    time.sleep(0)
            return time.perf_counter() - wall, time.process_time() - cpu
    return _with_peer(1, write)


def _trio(sends: int, size: int, streams: int) -> tuple[float, float]:
    async def run(address: tuple[str, int]) -> tuple[float, float]:
        conns = [await trio.open_tcp_stream(*address) for _ in range(streams)]
        payload = b"x" * size

        async def one(stream: trio.SocketStream) -> None:
            for _ in range(sends // streams):
                await stream.send_all(payload)
                await trio.sleep(0)

        wall, cpu = time.perf_counter(), time.process_time()
        async with trio.open_nursery() as nursery:
            for conn in conns:
                nursery.start_soon(one, conn)
        result = time.perf_counter() - wall, time.process_time() - cpu
        for conn in conns:
            await conn.aclose()
        return result

    return _with_peer(streams, lambda address: trio.run(run, address))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sends", type=int, default=3000)
    p.add_argument("--size", type=int, default=150, help="bytes per write (an SSE event)")
    p.add_argument("--streams", type=int, default=32, help="connections for the trio figure")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    a = p.parse_args()
    sends = max(a.streams, a.sends // a.streams * a.streams)
    runs = {"plain": _plain(a.sends, a.size, False), "yield": _plain(a.sends, a.size, True),
            "trio": _trio(sends, a.size, a.streams)}
    result: dict[str, float | int] = {"sends": a.sends, "size": a.size}
    for name, (wall, cpu) in runs.items():
        n = sends if name == "trio" else a.sends
        result[f"{name}_wall_us"] = round(1e6 * wall / n, 2)
        result[f"{name}_cpu_us"] = round(1e6 * cpu / n, 2)
    if a.json:
        print(json.dumps(result))
        return
    for name in runs:
        print(f"{name:6s} wall {result[f'{name}_wall_us']:8.2f} µs   "
              f"writer CPU {result[f'{name}_cpu_us']:8.2f} µs per write")


if __name__ == "__main__":
    main()

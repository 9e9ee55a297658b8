"""What one small write to a loopback TCP peer costs on this machine, with no server code at all.

    python tools/bench_loopback.py [--sends 3000] [--size 150]

Every streamed token a server sends is at least one such write (an SSE event), so this is the
floor of any server's per-event cost here. The reader is another process, as a real client is:
on a small VM, waking it up is most of the cost.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import time


def measure(sends: int, size: int, nodelay: bool) -> float:
    """Mean wall-clock microseconds per ``send`` of ``size`` bytes to a reading peer."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    address = listener.getsockname()
    pid = os.fork()
    if pid == 0:  # the peer: read until the writer closes, then leave at once
        conn, _ = listener.accept()
        while conn.recv(1 << 16):
            pass
        os._exit(0)
    listener.close()
    try:
        with socket.create_connection(address) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(nodelay))
            payload = b"x" * size
            for _ in range(min(100, sends)):  # warm the path up
                sock.sendall(payload)
            start = time.perf_counter()
            for _ in range(sends):
                sock.sendall(payload)
                time.sleep(0)  # yield, as an event loop does between events
            return 1e6 * (time.perf_counter() - start) / sends
    finally:
        os.kill(pid, signal.SIGKILL)  # done measuring, or failed before connecting
        os.waitpid(pid, 0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sends", type=int, default=3000)
    p.add_argument("--size", type=int, default=150, help="bytes per write (an SSE event)")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    a = p.parse_args()
    result = {f"us_per_send_nodelay_{int(nd)}": round(measure(a.sends, a.size, nd), 2)
              for nd in (True, False)}
    if a.json:
        print(json.dumps({"sends": a.sends, "size": a.size, **result}))
    else:
        for key, value in result.items():
            print(f"{key}: {value} µs")


if __name__ == "__main__":
    main()

"""Poll a server's ``/health`` until told to stop, from a process of its own; report every
answer's latency as JSON.

Its own process, so that what the test process does meanwhile (building and sending a 30 MB
body, hypothesis's garbage collections) cannot delay a poll and be blamed on the server. The
standard library only, so that it starts in a few tens of milliseconds.

Usage: ``python health_watcher.py BASE_URL``; prints ``watching`` once /health has answered,
then polls every 20 ms until its stdin closes, polls once more (after the test's last
request), and prints ``{"latencies": [...], "failures": [...]}`` on one line.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from urllib.parse import urlsplit

PERIOD = 0.02


def main(base: str) -> None:
    url = urlsplit(base)
    latencies: list[float] = []
    failures: list[str] = []
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)

    def poll() -> None:
        nonlocal conn
        start = time.monotonic()
        try:
            conn.request("GET", "/health")
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                failures.append(f"/health answered {response.status}")
        except (OSError, http.client.HTTPException) as exc:
            failures.append(f"/health failed: {exc!r}")
            conn.close()
            conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port,
                                              timeout=10)
        latencies.append(time.monotonic() - start)

    poll()
    print("watching", flush=True)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    while not done.wait(PERIOD):
        poll()
    poll()  # one more, after the last request
    conn.close()
    print(json.dumps({"latencies": latencies, "failures": failures}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

"""Poll a server's ``/health`` from a process of its own, in windows the test opens and closes.

Its own process, so that what the test process does meanwhile (building and sending a 30 MB
body holds its GIL; a full garbage collection of a process that has run the whole suite takes
hundreds of milliseconds) cannot delay a poll and be blamed on the server. One process for
all the hostile tests, started once, so that no start-up lands in a window. The standard
library only, and at a raised scheduling priority where the system allows it, so that its
own wake-ups are not what it measures.

Protocol, one line each way: the test writes ``start``; the watcher polls once, answers
``watching``, then polls every 20 ms. The test writes ``stop``; the watcher polls once more
(after the test's last request) and answers ``{"latencies": [...], "failures": [...]}``.
End of input ends it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import sys
import threading
import time
from urllib.parse import urlsplit

PERIOD = 0.02


class Poller:
    def __init__(self, base: str) -> None:
        url = urlsplit(base)
        self._host, self._port = url.hostname or "127.0.0.1", url.port
        self._conn = self._connect()  # connects on its first request
        self.latencies: list[float] = []
        self.failures: list[str] = []

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self._host, self._port, timeout=10)

    def begin(self) -> None:
        """A new window: a fresh connection (the server closes one idle for its keep-alive
        timeout, as this one was between windows) and its first poll."""
        self._conn.close()
        self._conn = self._connect()
        self.latencies.clear()
        self.failures.clear()
        self.poll()

    def poll(self) -> None:
        start = time.monotonic()
        try:
            self._conn.request("GET", "/health")
            response = self._conn.getresponse()
            response.read()
            if response.status != 200:
                self.failures.append(f"/health answered {response.status}")
        except (OSError, http.client.HTTPException) as exc:
            self.failures.append(f"/health failed: {exc!r}")
            self._conn.close()
            self._conn = self._connect()
        self.latencies.append(time.monotonic() - start)


def _set_on_a_line(event: threading.Event) -> None:
    sys.stdin.readline()  # "stop", or the end of input
    event.set()


def main(base: str) -> None:
    with contextlib.suppress(OSError):  # not permitted: polled at the ordinary priority
        os.nice(-10)
    poller = Poller(base)
    while line := sys.stdin.readline():  # "start", or the end of input
        if line.strip() != "start":
            continue
        poller.begin()
        stop = threading.Event()
        waiter = threading.Thread(target=_set_on_a_line, args=(stop,), daemon=True)
        waiter.start()
        print("watching", flush=True)
        while not stop.wait(PERIOD):
            poller.poll()
        waiter.join()
        poller.poll()  # one more, after the last request
        print(json.dumps({"latencies": poller.latencies, "failures": poller.failures}),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

"""HTTP answers counted by status class (``2xx`` ... ``5xx``), for the 5xx-rate alert.

Counted once per response, when its status line goes out, by the access log's ASGI wrapper,
which already looks at every message the app sends (``access_log.with_access_log``): a
wrapper of its own would put one more coroutine call on every send, each SSE event of a
stream included, to act on one of them.
"""

from __future__ import annotations

from prometheus_client import Counter


class StatusCounts:
    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        # zero from the start: rates need a base; and each child looked up once
        self._classes = {status // 100: counter.labels(f"{status // 100}xx")
                         for status in (200, 400, 500)}

    def count(self, status: int) -> None:
        child = self._classes.get(status // 100)
        if child is None:  # 1xx, 3xx: rare, made (and kept) when first met
            child = self._classes[status // 100] = self._counter.labels(f"{status // 100}xx")
        child.inc()

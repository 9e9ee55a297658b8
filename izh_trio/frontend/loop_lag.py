"""How late the event loop wakes: a task that asks to sleep a short period and measures how
much longer it slept. Every request's first byte and every stream's next event wait behind
the same loop, so its lag is the server's responsiveness as a client feels it (``/health``
included), measured where it happens rather than from a client that has its own scheduling.

Lag has two causes this cannot tell apart: work on the loop that does not yield (a bug to
find: a warning names each long one), and a machine that did not give the process a core.
"""

from __future__ import annotations

import logging
import time

import trio
from prometheus_client import CollectorRegistry, Gauge, Histogram

log = logging.getLogger(__name__)

#: How often the loop is sampled: short enough to see a stall of a few tens of ms.
PERIOD = 0.01
#: A stall at least this long is logged (the hostile-input tests' bound for /health).
WARN_AFTER = 0.1
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LoopLag:
    """The event loop's lag as metrics: a histogram of every sample and the worst one."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.samples = Histogram("izh:event_loop_lag_seconds",
                                 f"How much later than asked the HTTP process's event loop "
                                 f"woke a task sleeping {PERIOD * 1000:.0f} ms.",
                                 buckets=_BUCKETS, registry=registry)
        self.worst = Gauge("izh:event_loop_lag_max_seconds",
                           "The worst event-loop lag seen since the server began serving.",
                           registry=registry)
        self._worst = 0.0

    def record(self, lag: float) -> None:
        self.samples.observe(lag)
        if lag > self._worst:
            self._worst = lag
            self.worst.set(lag)
        if lag >= WARN_AFTER:
            log.warning("the event loop was %.0f ms late", lag * 1000)

    async def watch(self) -> None:
        """Sample the loop until cancelled."""
        while True:
            asked = time.perf_counter() + PERIOD
            await trio.sleep(PERIOD)
            self.record(max(0.0, time.perf_counter() - asked))

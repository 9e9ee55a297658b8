"""How late the event loop wakes: a task that asks to sleep a short period and measures how
much longer it slept. Every request's first byte and every stream's next event wait behind
the same loop, so its lag is the server's responsiveness as a client feels it (``/health``
included), measured where it happens rather than from a client that has its own scheduling.

A late wake-up is the server's own doing only if the process ran meanwhile: work on the loop
that does not yield, a garbage collection (logged as one), another thread holding the GIL, a
burst of page faults all spend this process's CPU time. A machine that gave the process no
core (other processes, a hypervisor's steal) spends none. So a late sample during which the
process itself ran :data:`WARN_AFTER` or more is a *stall*, counted apart
(``izh:event_loop_stalls_total``): the server's own delay, which the machine's load cannot
lengthen (on a core shared four ways, 60 ms of work is 120 ms late, and not a stall).
"""

from __future__ import annotations

import gc
import logging
import resource
import time
from typing import Any

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger(__name__)

#: How often the loop is sampled: a stall of WARN_AFTER + PERIOD or more is always seen. Each
#: sample wakes the process (~0.35 ms of CPU on a 2-core VM): every 10 ms that was 3.5 % of a
#: core, idle or not, taken from under the engine's threads while it serves.
PERIOD = 0.05
#: A stall at least this long is logged (the hostile-input tests' bound for /health).
WARN_AFTER = 0.1
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LoopLag:
    """The event loop's lag as metrics: a histogram of every sample and the worst one."""

    def __init__(self, registry: CollectorRegistry, prefix: str = "izh") -> None:
        self.samples = Histogram(f"{prefix}:event_loop_lag_seconds",
                                 f"How much later than asked the HTTP process's event loop "
                                 f"woke a task sleeping {PERIOD * 1000:.0f} ms.",
                                 buckets=_BUCKETS, registry=registry)
        self.worst = Gauge(f"{prefix}:event_loop_lag_max_seconds",
                           "The worst event-loop lag seen since the server began serving.",
                           registry=registry)
        self._worst = 0.0

        self.stalls = Counter(f"{prefix}:event_loop_stalls",
                              f"Late wake-ups during which this process ran "
                              f"{WARN_AFTER * 1000:.0f} ms or more (its own work, not the "
                              "machine's load).",
                              registry=registry)
        self.gc_pauses = Histogram(f"{prefix}:gc_pause_seconds",
                                   "Garbage collections of the HTTP process, by generation.",
                                   ["generation"], buckets=_BUCKETS, registry=registry)
        self._gc_start = 0.0
        self._gc_seconds = 0.0  # all collections' pauses so far: a sample's share is a difference

    def record(self, lag: float, cpu: float = 0.0, loop_cpu: float = 0.0, gc_s: float = 0.0,
               faults: int = 0) -> None:
        """One sample: ``lag`` past the asked wake-up; ``cpu`` the process's CPU time,
        ``loop_cpu`` the loop thread's, ``gc_s`` the collections' and ``faults`` the loop
        thread's page faults over the whole sleep."""
        self.samples.observe(lag)
        if lag > self._worst:
            self._worst = lag
            self.worst.set(lag)
        if lag >= WARN_AFTER:
            stall = cpu >= WARN_AFTER
            if stall:
                self.stalls.inc()
            # What the loop did instead, where it can be told: collecting garbage, faulting
            # pages in; the rest is code that did not yield.
            log.warning("the event loop was %.0f ms late; meanwhile the process ran %.0f ms "
                        "(its loop thread %.0f ms, %.0f ms of it collecting garbage, %d page "
                        "faults): %s", lag * 1000, cpu * 1000, loop_cpu * 1000, gc_s * 1000,
                        faults, "a stall of its own" if stall else "the machine did not run it")

    async def watch(self) -> None:
        """Sample the loop (and time garbage collections) until cancelled."""
        gc.callbacks.append(self._on_gc)
        try:
            while True:
                asked = time.perf_counter() + PERIOD
                cpu, loop_cpu = time.process_time(), time.thread_time()
                gc_s, faults = self._gc_seconds, _faults()
                await trio.sleep(PERIOD)
                self.record(max(0.0, time.perf_counter() - asked),
                            time.process_time() - cpu, time.thread_time() - loop_cpu,
                            self._gc_seconds - gc_s, _faults() - faults)
        finally:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
            return
        pause = time.perf_counter() - self._gc_start
        self._gc_seconds += pause
        self.gc_pauses.labels(str(info["generation"])).observe(pause)
        if pause >= WARN_AFTER / 2:
            log.warning("a garbage collection of generation %d took %.0f ms (%d objects "
                        "freed, %d tracked)", info["generation"], pause * 1000,
                        info["collected"], len(gc.get_objects()))


def _faults() -> int:
    """The calling thread's page faults so far, minor and major."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_minflt + usage.ru_majflt

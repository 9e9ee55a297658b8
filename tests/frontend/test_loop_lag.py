"""The event-loop lag watch: a late wake-up is counted as the server's own stall only when its
process ran meanwhile, so that the hostile tests' bound does not depend on the machine."""

from __future__ import annotations

import gc
import logging
import re
import time

import pytest
import trio
from prometheus_client import CollectorRegistry

from izh_trio.frontend.loop_lag import PERIOD, WARN_AFTER, LoopLag

#: Long enough to be late by WARN_AFTER wherever in a period it falls.
BLOCK = WARN_AFTER + 1.5 * PERIOD


def _value(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    assert value is not None, name
    return value


async def _blocked_for(block: object) -> CollectorRegistry:
    registry = CollectorRegistry()
    lag = LoopLag(registry)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lag.watch)
        while _value(registry, "izh:event_loop_lag_seconds_count") < 2:
            await trio.sleep(0.001)
        block()  # type: ignore[operator]
        while _value(registry, "izh:event_loop_lag_seconds_count") < 4:
            await trio.sleep(0.001)  # the late sample is recorded
        nursery.cancel_scope.cancel()
    return registry


def _spin() -> None:
    """Work on the loop: CPU time, however long the machine takes to give it."""
    start = time.thread_time()
    while time.thread_time() - start < BLOCK:
        pass


async def test_work_on_the_loop_is_a_stall() -> None:
    registry = await _blocked_for(_spin)
    assert _value(registry, "izh:event_loop_stalls_total") == 1
    assert _value(registry, "izh:event_loop_lag_max_seconds") >= WARN_AFTER  # (less a period)


async def test_a_process_that_did_not_run_is_late_but_not_stalled() -> None:
    registry = await _blocked_for(lambda: time.sleep(BLOCK))  # no CPU, as if
    assert _value(registry, "izh:event_loop_stalls_total") == 0          # descheduled
    assert _value(registry, "izh:event_loop_lag_max_seconds") >= WARN_AFTER  # (less a period)


def _collect() -> None:
    """A stall spent collecting garbage (a collector's pause is timed from its callbacks)."""
    start = time.thread_time()
    while time.thread_time() - start < BLOCK:
        gc.collect()


async def test_a_stall_says_how_much_of_it_was_collecting_garbage(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="izh_trio.frontend.loop_lag"):
        registry = await _blocked_for(_collect)
    assert _value(registry, "izh:event_loop_stalls_total") == 1
    said = [r.getMessage() for r in caplog.records if "event loop was" in r.getMessage()]
    assert said, caplog.text
    found = re.search(r"its loop thread (\d+) ms, (\d+) ms of it collecting garbage, (\d+) "
                      r"page faults\): a stall of its own", said[-1])
    assert found, said
    loop_ms, gc_ms = int(found[1]), int(found[2])
    assert gc_ms >= 0.5 * loop_ms > 0, said  # most of the loop's time was the collector's


def test_stalls_are_judged_by_the_process_cpu_time() -> None:
    lag = LoopLag(registry := CollectorRegistry())
    lag.record(0.3, cpu=0.2)  # its own: a stall
    lag.record(0.3, cpu=0.06)  # 60 ms of work stretched by a busy machine: late, not stalled
    lag.record(0.05, cpu=0.05)  # not late enough to judge
    assert _value(registry, "izh:event_loop_stalls_total") == 1
    assert _value(registry, "izh:event_loop_lag_seconds_count") == 3

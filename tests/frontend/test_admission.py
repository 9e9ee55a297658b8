"""Admission's cap, the event the drain waits on, and /metrics fed from ``statistics()``."""

from __future__ import annotations

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from trio.abc import Clock
from trio.testing import wait_all_tasks_blocked

from izh_trio.frontend.admission import Admission, AdmissionStatistics
from izh_trio.frontend.engine_client import ClientState, ClientStatistics
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.metrics import Metrics
from izh_trio.wire import Stats


async def test_wait_empty_returns_when_the_last_ticket_goes(autojump_clock: Clock) -> None:
    admission = Admission(max_pending=2)
    with trio.fail_after(1):
        await admission.wait_empty()  # nothing in flight: at once
    first, second = admission.admit(), admission.admit()
    with pytest.raises(APIError, match="at capacity"):
        admission.admit()
    emptied_at: list[float] = []

    async def drain() -> None:
        await admission.wait_empty()
        emptied_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        await wait_all_tasks_blocked()  # the drain is waiting
        first.release()
        first.release()  # a ticket is returned once, however often released
        await wait_all_tasks_blocked()
        assert emptied_at == [] and admission.statistics() == AdmissionStatistics(1)
        with second:
            pass
    assert len(emptied_at) == 1
    assert admission.statistics() == AdmissionStatistics(0)
    third = admission.admit()  # a new generation: the next drain waits for it
    with trio.move_on_after(1):
        await admission.wait_empty()
        pytest.fail("wait_empty returned with a ticket out")
    third.release()


def _scrape(metrics: Metrics) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(metrics.render().decode())
            for s in f.samples if s.name.startswith("izh:")}


def test_metrics_read_the_statistics_of_the_engine_client_and_admission() -> None:
    engine: list[ClientStatistics | None] = [None]
    admission = Admission(0)
    metrics = Metrics(lambda: engine[0], admission.statistics)
    before = _scrape(metrics)
    assert before["izh:engine_healthy"] == 0.0 and before["izh:num_requests_running"] == 0
    ticket = admission.admit()
    engine[0] = ClientStatistics(ClientState.READY, Stats(
        num_running=3, num_waiting=2, kv_cache_usage=0.25, num_preemptions=1, num_steps=9,
        prompt_tokens_total=40, generation_tokens_total=7, prefix_cache_queries=40,
        prefix_cache_hits=10))
    now = _scrape(metrics)
    assert now["izh:engine_healthy"] == 1.0 and now["izh:num_requests_in_flight"] == 1
    assert (now["izh:num_requests_running"], now["izh:num_requests_waiting"]) == (3, 2)
    assert now["izh:kv_cache_usage_perc"] == 0.25 and now["izh:prefix_cache_hit_rate"] == 0.25
    assert now["izh:generation_tokens_total"] == 7
    ticket.release()
    engine[0] = ClientStatistics(ClientState.FAILED, engine[0].stats)
    after = _scrape(metrics)
    assert after["izh:engine_healthy"] == 0.0 and after["izh:num_requests_in_flight"] == 0

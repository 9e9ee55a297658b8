"""Prometheus metrics with vLLM's names under an ``izh:`` prefix, one registry per app."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    GC_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from izh_trio.frontend.admission import AdmissionStatistics
from izh_trio.frontend.engine_client import ClientState, ClientStatistics
from izh_trio.frontend.loop_lag import LoopLag

disable_created_metrics()  # the *_created series only add noise to every scrape

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0)


#: The engine client's statistics (None before the first client), and admission's.
EngineStatistics = Callable[[], ClientStatistics | None]
AdmissionStatisticsSource = Callable[[], AdmissionStatistics]


class _EngineCollector(Collector):
    """Gauges read from the ``statistics()`` of the engine client (the core's latest Stats)
    and of admission at scrape time: no per-step bookkeeping."""

    def __init__(self, engine: EngineStatistics, admission: AdmissionStatisticsSource):
        self._engine = engine
        self._admission = admission

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        engine = self._engine()
        s = engine.stats if engine is not None else None
        healthy = engine is not None and engine.state is ClientState.READY
        yield GaugeMetricFamily("izh:num_requests_running", "Requests in the running batch.",
                                value=s.num_running if s else 0)
        yield GaugeMetricFamily("izh:num_requests_waiting", "Requests waiting to run.",
                                value=s.num_waiting if s else 0)
        yield GaugeMetricFamily("izh:kv_cache_usage_perc",
                                "Fraction of KV-cache blocks held by live requests (0-1).",
                                value=s.kv_cache_usage if s else 0.0)
        yield CounterMetricFamily("izh:num_preemptions", "Preemptions by recompute.",
                                  value=s.num_preemptions if s else 0)
        yield CounterMetricFamily("izh:prompt_tokens", "Prompt tokens of started requests.",
                                  value=s.prompt_tokens_total if s else 0)
        yield CounterMetricFamily("izh:generation_tokens", "Tokens sampled by the engine.",
                                  value=s.generation_tokens_total if s else 0)
        queries = s.prefix_cache_queries if s else 0
        hits = s.prefix_cache_hits if s else 0
        yield CounterMetricFamily("izh:prefix_cache_queries",
                                  "Prompt tokens looked up in the prefix cache.", value=queries)
        yield CounterMetricFamily("izh:prefix_cache_hits",
                                  "Prompt tokens found in the prefix cache.", value=hits)
        yield GaugeMetricFamily("izh:prefix_cache_hit_rate",
                                "Cumulative prefix-cache hit rate (hits / queries).",
                                value=hits / queries if queries else 0.0)
        yield CounterMetricFamily("izh:engine_step_seconds",
                                  "Seconds the engine core spent in steps (model and sampler).",
                                  value=s.step_seconds_total if s else 0.0)
        yield GaugeMetricFamily("izh:engine_step_threads",
                                "Torch threads of the engine's last step (CPU: 0 before one).",
                                value=s.step_threads if s else 0)
        yield GaugeMetricFamily("izh:num_requests_in_flight",
                                "HTTP generations admitted and not yet finished.",
                                value=self._admission().in_flight)
        yield GaugeMetricFamily("izh:engine_healthy", "1 while the engine core serves.",
                                value=1.0 if healthy else 0.0)


class Metrics:
    def __init__(self, engine: EngineStatistics, admission: AdmissionStatisticsSource):
        self.registry = r = CollectorRegistry()
        r.register(_EngineCollector(engine, admission))
        # The HTTP process's own CPU, memory and garbage collections, as vLLM's /metrics has.
        for shared in (PROCESS_COLLECTOR, GC_COLLECTOR):
            r.register(shared)
        self.request_success = Counter("izh:request_success", "Finished requests.",
                                       ["finished_reason"], registry=r)
        self.responses = Counter("izh:responses", "Responses API responses by final status.",
                                 ["status"], registry=r)
        self.ttft = Histogram("izh:time_to_first_token_seconds",
                              "Arrival to first token, as the client sees it.",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("izh:inter_token_latency_seconds",
                             "Time between successive token deliveries.",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("izh:e2e_request_latency_seconds", "Arrival to last token.",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.loop_lag = LoopLag(r)

    def render(self) -> bytes:
        return generate_latest(self.registry)

"""The series read at scrape time: the engine core's latest ``Stats``, admission's count and
what the server knows of itself. No per-step bookkeeping on the frontend's side."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import attrs
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from izh_trio.frontend.admission import AdmissionStatistics
from izh_trio.frontend.engine_client import ClientState, ClientStatistics
from izh_trio.wire import ITERATION_TOKENS_BUCKETS, Stats

#: The engine client's statistics (None before the first client), and admission's.
EngineStatistics = Callable[[], ClientStatistics | None]
AdmissionStatisticsSource = Callable[[], AdmissionStatistics]


@attrs.define
class ServerFacts:
    """What the server tells the metrics once it knows: set at start, read at each scrape."""

    model_name: str = ""
    #: The engine core's cache, as vLLM's ``cache_config_info`` labels it; empty before start.
    cache_config: dict[str, str] = attrs.Factory(dict)
    #: Adapters resident at once; 0: LoRA is off (no ``lora_requests_info``).
    max_lora: int = 0
    restarts: Callable[[], int] = lambda: 0


class EngineCollector(Collector):
    def __init__(self, prefix: str, engine: EngineStatistics,
                 admission: AdmissionStatisticsSource, facts: ServerFacts) -> None:
        self._p = f"{prefix}:"
        self._engine = engine
        self._admission = admission
        self._facts = facts

    def collect(self) -> Iterator[Metric]:
        engine = self._engine()
        s = engine.stats if engine is not None else None
        healthy = engine is not None and engine.state is ClientState.READY
        model = [self._facts.model_name]
        p = self._p

        def gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(p + name, text, labels=["model_name"])
            family.add_metric(model, value)
            return family

        def counter(name: str, text: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(p + name, text, labels=["model_name"])
            family.add_metric(model, value)
            return family

        yield gauge("num_requests_running", "Requests in the running batch.",
                    s.num_running if s else 0)
        yield gauge("num_requests_waiting", "Requests waiting to run.",
                    s.num_waiting if s else 0)
        usage = s.kv_cache_usage if s else 0.0
        yield gauge("kv_cache_usage_perc",
                    "Fraction of KV-cache blocks held by live requests (0-1).", usage)
        yield gauge("gpu_cache_usage_perc", "kv_cache_usage_perc under vLLM's older name.",
                    usage)
        yield counter("num_preemptions", "Preemptions by recompute.",
                      s.num_preemptions if s else 0)
        yield counter("prompt_tokens", "Prompt tokens of started requests.",
                      s.prompt_tokens_total if s else 0)
        yield counter("generation_tokens", "Tokens sampled by the engine.",
                      s.generation_tokens_total if s else 0)
        yield counter("prompt_tokens_cached",
                      "Prompt tokens of started requests found in the prefix cache.",
                      s.prompt_tokens_cached_total if s else 0)
        queries = s.prefix_cache_queries if s else 0
        hits = s.prefix_cache_hits if s else 0
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      queries)
        yield counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.", hits)
        yield gauge("prefix_cache_hit_rate",
                    "Cumulative prefix-cache hit rate (hits / queries).",
                    hits / queries if queries else 0.0)
        yield self._iteration_tokens(s, model)
        yield counter("engine_step_seconds",
                      "Seconds the engine core spent in steps (model and sampler).",
                      s.step_seconds_total if s else 0.0)
        yield gauge("engine_step_threads",
                    "Torch threads of the engine's last step (CPU: 0 before one).",
                    s.step_threads if s else 0)
        yield gauge("num_requests_in_flight", "HTTP generations admitted and not yet finished.",
                    self._admission().in_flight)
        yield gauge("engine_healthy", "1 while the engine core serves.",
                    1.0 if healthy else 0.0)
        yield counter("engine_restarts", "Times the engine core was respawned after it died.",
                      self._facts.restarts())
        yield from self._infos(s)

    def _iteration_tokens(self, s: Stats | None, model: list[str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self._p + "iteration_tokens_total",
                                       "Tokens computed per engine step.",
                                       labels=["model_name"])
        counts = s.iteration_tokens if s and s.iteration_tokens else (0,) * (
            len(ITERATION_TOKENS_BUCKETS) + 1)
        bounds = [*(str(float(b)) for b in ITERATION_TOKENS_BUCKETS), "+Inf"]
        cumulative, buckets = 0, []
        for bound, count in zip(bounds, counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        family.add_metric(model, buckets, s.iteration_tokens_sum if s else 0)
        return family

    def _infos(self, s: Stats | None) -> Iterator[Metric]:
        facts = self._facts
        if facts.cache_config:
            info = GaugeMetricFamily(self._p + "cache_config_info",
                                     "The KV cache's configuration, in its labels.",
                                     labels=list(facts.cache_config))
            info.add_metric(list(facts.cache_config.values()), 1.0)
            yield info
        if facts.max_lora:
            lora = GaugeMetricFamily(
                self._p + "lora_requests_info",
                "LoRA adapters of running and waiting requests, in the labels (value: when).",
                labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"])
            lora.add_metric([str(facts.max_lora), ",".join(s.waiting_loras if s else ()),
                             ",".join(s.running_loras if s else ())], time.time())
            yield lora

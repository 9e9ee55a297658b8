"""Prometheus metrics with vLLM's names, types, labels and buckets under a prefix (``izh`` by
default, ``--metrics-prefix vllm`` for vLLM's own names), one registry per app.

What a request's life records is observed here (:class:`RequestMetrics`, bound to the served
model's name); what the engine counts is read at scrape time (``metrics_engine``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

from prometheus_client import (
    GC_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from izh_trio.frontend.http_metrics import StatusCounts
from izh_trio.frontend.loop_lag import LoopLag
from izh_trio.frontend.metrics_engine import (
    AdmissionStatisticsSource,
    EngineCollector,
    EngineStatistics,
    ServerFacts,
)
from izh_trio.frontend.metrics_histogram import LabelledHistogram

disable_created_metrics()  # the *_created series only add noise to every scrape

# vLLM's buckets, so that its dashboards' quantiles read the same.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
#: 1, 2, 5, 10, 20, 50... as vLLM's token-count buckets (it stops at max_model_len).
TOKEN_BUCKETS = tuple(float(m * 10 ** e) for e in range(7) for m in (1, 2, 5))
N_BUCKETS = (1, 2, 5, 10, 20)


#: The generation end causes (``generation.EndCause``) that are the frontend cutting a
#: request short, counted as aborts with the client's going away; failures are not aborts.
CLIENT_DISCONNECT = "client_disconnect"
ABORT_CAUSES = frozenset({"stop_string", "deadline", "drain", "slow_client"})
FAILURES = frozenset({"engine_error", "rejected"})


class RefusalCause(enum.Enum):
    """Why a request was turned away before it reached the engine."""

    PENDING = "pending"  # 503: --max-pending requests already in flight
    RATE_LIMIT = "rate_limit"  # 429: the key's token budget
    TOO_LARGE = "too_large"  # 413: the body exceeds --max-body-bytes


#: The labelled counters' values, each made at zero for the served model.
_ZEROED = {
    "request_success": ("stop", "length", "abort"),
    "aborts": (CLIENT_DISCONNECT, *sorted(ABORT_CAUSES)),
    "refusals": tuple(c.value for c in RefusalCause),
}


def refusal_of(status: int, code: str | None) -> RefusalCause | None:
    """The refusal an error answer is, if it is one (a 503 is one only at capacity)."""
    if status == 503:
        return RefusalCause.PENDING if code == "server_overloaded" else None
    return {429: RefusalCause.RATE_LIMIT, 413: RefusalCause.TOO_LARGE}.get(status)


class _Renamed(Collector):
    """``source``'s samples under another metric name (an alias kept for old dashboards)."""

    def __init__(self, source: Collector, name: str, documentation: str) -> None:
        self._source, self._name, self._documentation = source, name, documentation

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            alias = Metric(self._name, self._documentation, family.type)
            for sample in family.samples:
                alias.add_sample(self._name + sample.name[len(family.name):], sample.labels,
                                 sample.value, sample.timestamp, sample.exemplar)
            yield alias


class RequestMetrics:
    """The per-request series of one served model: children of :class:`Metrics`' families,
    each looked up once here (``labels()`` builds a key and takes a lock) rather than per
    token or per request."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self.ttft = metrics.ttft.labels(model)
        #: Observed once per token delivery; served under vLLM's older name too (_Renamed).
        self.itl = metrics.itl.labels(model)
        self._e2e = metrics.e2e.labels(model)
        self._phases = tuple(h.labels(model) for h in (
            metrics.queue_time, metrics.prefill_time, metrics.decode_time,
            metrics.inference_time))
        self._request_tpot = metrics.request_tpot.labels(model)
        self._prompt = metrics.prompt_tokens.labels(model)
        self._generation = metrics.generation_tokens.labels(model)
        self._max_generation = metrics.max_generation_tokens.labels(model)
        self._n = metrics.params_n.labels(model)
        self._max_tokens = metrics.params_max_tokens.labels(model)
        # Every cause and reason from zero, so that rates and alerts have a series at once.
        def zeroed(family: str) -> dict[str, Counter]:
            return {value: getattr(metrics, family).labels(model, value)
                    for value in _ZEROED[family]}

        self._success = zeroed("request_success")
        self._aborts = zeroed("aborts")
        self._refusals = zeroed("refusals")
        self._metrics, self._model = metrics, model

    def ended(self, reason: str, elapsed: float, counts: tuple[int, int, int],
              timing: tuple[float, float] | None, decode: float | None) -> None:
        """A choice finished (``reason``: the API's finish reason) ``elapsed`` after arrival,
        with (prompt, generated, cached) tokens; ``timing``: the core's queue and prefill
        seconds, ``decode``: first token to now, both None if no token came."""
        self._e2e.observe(elapsed)
        self._finished(reason, counts)
        if timing is None or decode is None:
            return
        queue, prefill = timing
        queue_time, prefill_time, decode_time, inference_time = self._phases
        queue_time.observe(queue)
        prefill_time.observe(prefill)
        decode_time.observe(decode)
        inference_time.observe(prefill + decode)
        if counts[1] > 1:  # the mean time per output token after the first
            self._request_tpot.observe(decode / (counts[1] - 1))

    def _finished(self, reason: str, counts: tuple[int, int, int]) -> None:
        success = self._success.get(reason)
        if success is None:  # not one of vLLM's three: counted all the same
            success = self._metrics.request_success.labels(self._model, reason)
        success.inc()
        self._prompt.observe(counts[0])
        self._generation.observe(counts[1])

    def settled(self, cause: str | None, choices: list[tuple[int, int, int, bool]], n: int,
                max_tokens: int) -> None:
        """A request's generation closed, its choices' (prompt, generated, cached, done):
        its parameters, its longest choice, and once what cut it short. ``cause``: the
        generation's ``EndCause`` value; None with choices not done: it was left while they
        ran, so the client went away."""
        self._n.observe(n)
        self._max_tokens.observe(max_tokens)
        self._max_generation.observe(max(c[1] for c in choices))
        unfinished = [c[:3] for c in choices if not c[3]]
        if cause in ABORT_CAUSES or (cause is None and unfinished):
            self._aborts[cause or CLIENT_DISCONNECT].inc()
        if cause not in FAILURES:  # choices cut short end as vLLM's "abort"
            for counts in unfinished:
                self._finished("abort", counts)

    def refused(self, cause: RefusalCause) -> None:
        self._refusals[cause.value].inc()


class Metrics:
    def __init__(self, engine: EngineStatistics, admission: AdmissionStatisticsSource,
                 facts: ServerFacts | None = None, *, prefix: str = "izh") -> None:
        self.prefix = prefix
        self.registry = r = CollectorRegistry()
        self.facts = facts or ServerFacts()
        r.register(EngineCollector(prefix, engine, admission, self.facts))
        # The HTTP process's own CPU, memory and garbage collections, as vLLM's /metrics has.
        for shared in (PROCESS_COLLECTOR, GC_COLLECTOR):
            r.register(shared)
        p = f"{prefix}:"
        model = ["model_name"]

        def histogram(name: str, text: str, buckets: tuple[float, ...]) -> LabelledHistogram:
            return LabelledHistogram(p + name, text, "model_name", buckets, r)

        self.request_success = Counter(p + "request_success", "Finished requests.",
                                       [*model, "finished_reason"], registry=r)
        self.responses = Counter(p + "responses", "Responses API responses by final status.",
                                 ["status"], registry=r)
        self.ttft = histogram("time_to_first_token_seconds",
                              "Arrival to first token, as the client sees it.", TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds",
                             "Time between successive token deliveries.", ITL_BUCKETS)
        # vLLM serves both names (old dashboards read the second): one histogram, observed
        # once per token, shown twice at scrape time
        r.register(_Renamed(self.itl, p + "time_per_output_token_seconds",
                            "Time between successive token deliveries (vLLM's older name)."))
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to last token.",
                             REQUEST_BUCKETS)
        self.queue_time = histogram("request_queue_time_seconds",
                                    "Time in the engine's waiting queue.", REQUEST_BUCKETS)
        self.prefill_time = histogram("request_prefill_time_seconds",
                                      "First scheduled to first token.", REQUEST_BUCKETS)
        self.decode_time = histogram("request_decode_time_seconds",
                                     "First token to last token.", REQUEST_BUCKETS)
        self.inference_time = histogram("request_inference_time_seconds",
                                        "First scheduled to last token (prefill + decode).",
                                        REQUEST_BUCKETS)
        self.request_tpot = histogram("request_time_per_output_token_seconds",
                                      "A request's mean time per output token after the first.",
                                      ITL_BUCKETS)
        self.prompt_tokens = histogram("request_prompt_tokens",
                                       "Prompt tokens of finished requests.", TOKEN_BUCKETS)
        self.generation_tokens = histogram("request_generation_tokens",
                                           "Generated tokens of finished requests.",
                                           TOKEN_BUCKETS)
        self.max_generation_tokens = histogram(
            "request_max_num_generation_tokens",
            "The most tokens any of a request's n choices generated.", TOKEN_BUCKETS)
        self.params_n = histogram("request_params_n", "The n a request asked for.", N_BUCKETS)
        self.params_max_tokens = histogram("request_params_max_tokens",
                                           "The max_tokens a request asked for.", TOKEN_BUCKETS)
        self.aborts = Counter(p + "request_aborts",
                              "Requests the frontend ended while the engine ran them, by cause.",
                              [*model, "cause"], registry=r)
        self.refusals = Counter(p + "request_refusals",
                                "Requests turned away before the engine, by cause.",
                                [*model, "cause"], registry=r)
        self.http_responses = Counter(p + "http_responses", "HTTP answers by status class.",
                                      ["status"], registry=r)
        self.statuses = StatusCounts(self.http_responses)
        self.loop_lag = LoopLag(r, prefix)
        self.requests = RequestMetrics(self, "")
        self._bound = ""

    def bind(self, model_name: str) -> None:
        """Label every per-request series with the served model's name (known at start);
        the children of a name bound before are dropped, so no empty series lingers."""
        old, self._bound = self._bound, model_name
        self.requests = RequestMetrics(self, model_name)
        if old == model_name:
            return
        for family in (self.ttft, self.itl, self.e2e, self.queue_time,
                       self.prefill_time, self.decode_time, self.inference_time,
                       self.request_tpot, self.prompt_tokens, self.generation_tokens,
                       self.max_generation_tokens, self.params_n, self.params_max_tokens):
            family.remove(old)
        for name, values in _ZEROED.items():
            for value in values:
                getattr(self, name).remove(old, value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


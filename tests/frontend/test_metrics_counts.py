"""What the per-request series count for the ends a live server cannot easily be driven to
(a drain, a slow client, an engine failure), and the model label's binding; the rest is
checked end to end (tests/e2e/test_metrics.py)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from izh_trio.frontend.admission import Admission
from izh_trio.frontend.metrics import Metrics, RefusalCause, refusal_of


def _metrics() -> Metrics:
    metrics = Metrics(lambda: None, Admission(0).statistics)
    metrics.bind("m")
    return metrics


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"model_name": "m", **labels})


def test_an_end_the_frontend_caused_is_one_abort_and_its_choices_abort() -> None:
    for cause in ("drain", "slow_client", "deadline", "stop_string"):
        metrics = _metrics()
        metrics.requests.settled(cause, [(5, 3, 0, False), (5, 9, 0, False), (5, 2, 0, True)],
                                 3, 16)
        assert _value(metrics, "izh:request_aborts_total", cause=cause) == 1
        assert _value(metrics, "izh:request_success_total", finished_reason="abort") == 2
        assert _value(metrics, "izh:request_max_num_generation_tokens_sum") == 9
        assert _value(metrics, "izh:request_params_n_sum") == 3
        assert _value(metrics, "izh:request_params_max_tokens_sum") == 16


def test_left_while_running_is_a_disconnect_and_failures_are_not_aborts() -> None:
    metrics = _metrics()
    metrics.requests.settled(None, [(5, 3, 0, False)], 1, 16)
    assert _value(metrics, "izh:request_aborts_total", cause="client_disconnect") == 1
    metrics = _metrics()
    metrics.requests.settled(None, [(5, 3, 0, True)], 1, 16)  # finished: nothing cut short
    metrics.requests.settled("engine_error", [(5, 3, 0, False)], 1, 16)
    metrics.requests.settled("rejected", [(5, 0, 0, False)], 1, 16)
    text = metrics.render().decode()
    aborts = [s for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "izh:request_aborts_total"]
    assert len(aborts) == 5 and not any(s.value for s in aborts)  # every cause, at zero
    assert _value(metrics, "izh:request_success_total", finished_reason="abort") == 0


def test_refusals_are_the_capacity_503_the_429_and_the_413() -> None:
    assert refusal_of(503, "server_overloaded") is RefusalCause.PENDING
    assert refusal_of(503, None) is None  # the engine unavailable is no refusal
    assert refusal_of(429, "rate_limit_exceeded") is RefusalCause.RATE_LIMIT
    assert refusal_of(413, None) is RefusalCause.TOO_LARGE
    assert refusal_of(400, None) is None and refusal_of(500, None) is None


def test_binding_the_model_name_drops_the_series_of_the_one_before() -> None:
    metrics = Metrics(lambda: None, Admission(0).statistics, prefix="vllm")
    metrics.bind("first")
    metrics.bind("m")
    text = metrics.render().decode()
    assert 'model_name="first"' not in text
    assert 'vllm:request_queue_time_seconds_count{model_name="m"} 0.0' in text
    assert "izh:" not in text


def test_the_request_histograms_expose_what_prometheus_clients_histogram_does() -> None:
    # metrics_histogram keeps plain counts for speed; its exposition must be the library's
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from izh_trio.frontend.metrics import ITL_BUCKETS, TOKEN_BUCKETS
    from izh_trio.frontend.metrics_histogram import LabelledHistogram

    for buckets in (ITL_BUCKETS, TOKEN_BUCKETS):
        ours, theirs = CollectorRegistry(), CollectorRegistry()
        fast = LabelledHistogram("izh:h", "Doc.", "model_name", buckets, ours)
        slow = Histogram("izh:h", "Doc.", ["model_name"], buckets=buckets, registry=theirs)
        fast.labels("gone"), slow.labels("gone")
        fast.remove("gone"), slow.remove("gone")
        for value in (-1.0, 0.0, buckets[0], buckets[3], buckets[3] + 1e-9, buckets[-1],
                      1e12, float("inf"), 0.02):
            fast.labels("m").observe(value)
            slow.labels("m").observe(value)
        fast.labels("idle"), slow.labels("idle")  # a zero series
        assert generate_latest(ours) == generate_latest(theirs)


def test_statuses_are_counted_by_class_from_zero() -> None:
    metrics = _metrics()
    for status in (200, 201, 404, 503, 101):
        metrics.statuses.count(status)

    def count(status: str) -> float | None:
        return metrics.registry.get_sample_value("izh:http_responses_total",
                                                 {"status": status})

    assert (count("1xx"), count("2xx"), count("3xx"), count("4xx"), count("5xx")) == (
        1, 2, None, 1, 1)

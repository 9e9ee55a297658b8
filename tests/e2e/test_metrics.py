"""``/metrics`` after a scripted mix of requests: every series' value, checked against what the
clients saw (their usage, their finish reasons, the statuses they got), and the exposition as
a whole read by ``prometheus_client``'s own parser. With ``--metrics-prefix vllm`` every name
vLLM's published Grafana dashboard queries is served.

The mix runs on a paced engine (a request of N tokens takes N x ``STEP_DELAY`` or more), so the
long requests are still running when the test acts on them, however fast the machine is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import (
    IN_FLIGHT,
    PACED,
    free_port,
    parse_metrics,
    running_server,
    scrape,
    serve_args,
    wait_for_metrics,
)

MODEL = "qwen3-test"
BUDGET = 1500  # --rate-limit-tokens-per-minute: the mix below costs less, one request more
LONG_PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 5)

#: Every metric name vLLM's published Grafana dashboard queries
#: (examples/online_serving/prometheus_grafana/grafana.json in the vLLM repository).
VLLM_DASHBOARD_NAMES = (
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total", "vllm:time_per_output_token_seconds_bucket",
    "vllm:time_per_output_token_seconds_sum", "vllm:time_per_output_token_seconds_count",
    "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count", "vllm:gpu_cache_usage_perc",
    "vllm:request_prompt_tokens_bucket", "vllm:request_generation_tokens_bucket",
    "vllm:request_success_total", "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
)
#: The rest of vLLM's series this server has too (its metrics documentation).
VLLM_OTHER_NAMES = (
    "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_cached_total",
    "vllm:inter_token_latency_seconds_bucket", "vllm:request_inference_time_seconds_bucket",
    "vllm:request_time_per_output_token_seconds_bucket", "vllm:request_params_n_bucket",
    "vllm:request_params_max_tokens_bucket", "vllm:iteration_tokens_total_bucket",
    "vllm:request_queue_time_seconds_bucket", "vllm:cache_config_info",
)
HISTOGRAMS = (
    "time_to_first_token_seconds", "inter_token_latency_seconds", "time_per_output_token_seconds",
    "e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
    "request_decode_time_seconds", "request_inference_time_seconds",
    "request_time_per_output_token_seconds", "request_prompt_tokens",
    "request_generation_tokens", "request_max_num_generation_tokens", "request_params_n",
    "request_params_max_tokens", "iteration_tokens_total", "event_loop_lag_seconds",
)


@pytest.fixture(scope="module")
def mix_server(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "metrics-server.log"
    args = serve_args(hf_dir, port, "--served-model-name", MODEL, "--max-pending", "1",
                      "--rate-limit-tokens-per-minute", str(BUDGET), "--max-body-bytes", "1024",
                      "--response-store", f"sqlite:///{log.parent}/responses.sqlite3")
    with running_server(args, log, port=port, env=PACED) as (base, _proc):
        yield base


@pytest.fixture(scope="module")
def vllm_server(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "vllm-prefix-server.log"
    args = serve_args(hf_dir, port, "--served-model-name", MODEL, "--metrics-prefix", "vllm",
                      "--response-store", f"sqlite:///{log.parent}/responses.sqlite3")
    with running_server(args, log, port=port) as (base, _proc):
        yield base


def _complete(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.completions.create(model=MODEL, temperature=0, **kwargs)


def _stream_usage(client: openai.OpenAI, prompt: str, max_tokens: int) -> Any:
    usage = None
    for chunk in client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
        usage = chunk.usage or usage
    assert usage is not None
    return usage


@pytest.mark.timing  # acts on requests while they run (a disconnect, a full slot)
def test_series_after_a_scripted_mix(mix_server: str) -> None:
    base = mix_server
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    usages: list[Any] = []  # one per finished choice's prompt, and its own tokens

    # a: a greedy answer, whose text gives the stop string of b (same long prompt: cached)
    a = _complete(client, prompt=LONG_PROMPT, max_tokens=24, extra_body={"ignore_eos": True})
    text = a.choices[0].text
    stop = next(text[i:i + 3] for i in range(len(text) // 4, len(text) - 3)
                if text[i:i + 3].strip())
    b = _complete(client, prompt=LONG_PROMPT, max_tokens=64, stop=[stop],
                  extra_body={"ignore_eos": True})
    assert b.choices[0].finish_reason == "stop"
    assert b.usage.prompt_tokens_details.cached_tokens > 0  # the prefix cache held a's prompt
    usages += [a.usage, b.usage]
    # c: two streams; d: one request with n=2 (usage counts its prompt once)
    usages += [_stream_usage(client, "Once upon a time", 8) for _ in range(2)]
    d = _complete(client, prompt="Hello there", max_tokens=4, n=2,
                  extra_body={"ignore_eos": True})
    assert [c.finish_reason for c in d.choices] == ["length", "length"]
    d_prompt = d.usage.prompt_tokens
    # e: a deadline long before its 500 tokens can come (5 s or more, paced)
    e = httpx.post(base + "/v1/completions", headers={"X-Request-Timeout": "2"}, timeout=60,
                   json={"model": MODEL, "prompt": "Tell me a story", "max_tokens": 500,
                         "ignore_eos": True}).json()
    assert e["choices"][0]["finish_reason"] == "length"
    e_tokens = e["usage"]["completion_tokens"]
    assert e_tokens < 500
    # f: a stream the client leaves after its first chunk; meanwhile the one slot is taken: 503
    with httpx.Client(timeout=60) as http, http.stream(
            "POST", base + "/v1/completions",
            json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 500,
                  "ignore_eos": True, "stream": True}) as f:
        lines = f.iter_lines()
        assert any(line.startswith("data: {") for line in lines)
        refused = http.post(base + "/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert refused.status_code == 503
    wait_for_metrics(base, lambda m: m[IN_FLIGHT] == 0 and m["izh:num_requests_running"] == 0,
                     what="the stream left by its client ending")
    # g: a request costing more than the key's budget (429), and a body too large (413)
    over = httpx.post(base + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "x", "max_tokens": BUDGET + 1})
    assert over.status_code == 429, over.text
    big = httpx.post(base + "/v1/completions", timeout=60,
                     content=b'{"prompt": "' + b"x" * 2000 + b'"}',
                     headers={"content-type": "application/json"})
    assert big.status_code == 413, big.text

    m = scrape(base)
    text_m = httpx.get(base + "/metrics").text
    # finish reasons, per choice: a, c, c, d, d, e by length; b by its stop string; f aborted
    assert m['izh:request_success_total{finished_reason="length"}'] == 6
    assert m['izh:request_success_total{finished_reason="stop"}'] == 1
    assert m['izh:request_success_total{finished_reason="abort"}'] == 1
    for cause, count in (("stop_string", 1), ("deadline", 1), ("client_disconnect", 1)):
        assert m[f'izh:request_aborts_total{{cause="{cause}"}}'] == count, cause
    for cause in ("drain", "slow_client"):  # served at zero from the start
        assert m[f'izh:request_aborts_total{{cause="{cause}"}}'] == 0, cause
    for cause in ("pending", "rate_limit", "too_large"):
        assert m[f'izh:request_refusals_total{{cause="{cause}"}}'] == 1, cause
    assert m['izh:http_responses_total{status="5xx"}'] == 1  # the 503
    assert m['izh:http_responses_total{status="4xx"}'] == 2  # the 429 and the 413
    assert m['izh:http_responses_total{status="2xx"}'] >= 7  # a to f, and /health, /metrics

    # per-request histograms: 7 finished choices (e2e); those with a token have phases
    with_tokens = 6 + (e_tokens > 0)
    assert m["izh:e2e_request_latency_seconds_count"] == 7
    assert m["izh:time_to_first_token_seconds_count"] == with_tokens + 1  # f's first chunk
    for phase in ("queue", "prefill", "decode", "inference"):
        assert m[f"izh:request_{phase}_time_seconds_count"] == with_tokens, phase
    tokens = [u.completion_tokens for u in usages] + [4, 4] + [e_tokens]
    assert m["izh:request_time_per_output_token_seconds_count"] == sum(t > 1 for t in tokens)
    # prompt and generation sizes: every choice that ended, f included
    prompts = [u.prompt_tokens for u in usages] + [d_prompt] * 2 + [e["usage"]["prompt_tokens"]]
    f_prompt = usages[2].prompt_tokens  # f's prompt is c's
    assert m["izh:request_prompt_tokens_count"] == 8
    assert m["izh:request_prompt_tokens_sum"] == sum(prompts) + f_prompt
    assert m["izh:request_generation_tokens_count"] == 8
    assert m["izh:request_generation_tokens_sum"] > sum(tokens)  # f's few tokens on top
    # the request parameters, once per request (a, b, c, c, d, e, f)
    assert m["izh:request_params_n_count"] == 7 and m["izh:request_params_n_sum"] == 8
    assert m["izh:request_params_max_tokens_sum"] == 24 + 64 + 8 + 8 + 4 + 500 + 500
    assert m["izh:request_max_num_generation_tokens_count"] == 7
    # engine counters: what the engine computed, the prefix cache's share, its steps
    assert m["izh:generation_tokens_total"] >= sum(tokens) + 1
    cached = sum(u.prompt_tokens_details.cached_tokens for u in (a.usage, b.usage))
    assert m["izh:prompt_tokens_cached_total"] == cached
    assert m["izh:num_preemptions_total"] == 0
    # each step computes a request's uncached prompt, then one token per token after its
    # first: the steps' tokens add up (e's first token, had the engine sampled it as its
    # deadline aborted it, never reached the client: then one more request started)
    started = m["izh:time_to_first_token_seconds_count"]
    computed = (m["izh:prompt_tokens_total"] - m["izh:prompt_tokens_cached_total"]
                + m["izh:generation_tokens_total"])
    assert computed - m["izh:iteration_tokens_total_sum"] in (
        (started,) if e_tokens else (started, started + 1))
    assert m["izh:iteration_tokens_total_count"] >= 1
    assert m["izh:engine_restarts_total"] == 0 and m["izh:engine_healthy"] == 1
    assert m["izh:kv_cache_usage_perc"] == m["izh:gpu_cache_usage_perc"] == 0
    assert m["izh:event_loop_lag_seconds_count"] > 0
    assert 'block_size="16"' in text_m and "izh:cache_config_info{" in text_m

    _check_exposition(text_m, "izh")


def _check_exposition(text: str, prefix: str) -> None:
    """The whole exposition parses; every family of ours is labelled with the model, and
    every histogram has its buckets, sum and count."""
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in HISTOGRAMS:
        family = families[f"{prefix}:{name}"]
        assert family.type == "histogram", name
        kinds = {s.name.removeprefix(family.name) for s in family.samples}
        assert kinds == {"_bucket", "_sum", "_count"}, (name, kinds)
    labelled = [f for f in families.values() if f.name.startswith(prefix + ":")
                and not f.name.startswith((f"{prefix}:event_loop", f"{prefix}:gc_pause",
                                           f"{prefix}:responses", f"{prefix}:cache_config",
                                           f"{prefix}:http_responses"))]
    for family in labelled:
        for sample in family.samples:
            assert sample.labels.get("model_name") == MODEL, (family.name, sample)


def test_vllm_prefix_serves_every_name_of_vllms_dashboard(vllm_server: str) -> None:
    httpx.post(vllm_server + "/v1/completions", timeout=60,
               json={"prompt": "A", "max_tokens": 3}).raise_for_status()
    text = httpx.get(vllm_server + "/metrics").text
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    missing = [n for n in (*VLLM_DASHBOARD_NAMES, *VLLM_OTHER_NAMES) if n not in names]
    assert not missing
    assert not any(n.startswith("izh:") for n in names)
    m = parse_metrics(text)
    assert m['vllm:request_success_total{finished_reason="length"}'] == 1
    _check_exposition(text, "vllm")

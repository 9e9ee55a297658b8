"""Requests each on a connection of its own, as a proxy without upstream keep-alive sends
them, against a running server; then what the HTTP process's cyclic collector did meanwhile.

    python -m tools.bench.connection_churn [--base http://127.0.0.1:8000] [--requests 4000]
        [--model NAME] [--api-key KEY]

The requests take turns: a chat answer (2 tokens), a 400, a 404 and a Responses answer. Prints,
from ``/metrics`` before and after: first-generation collections, the objects they freed, their
total and longest pause (``izh:gc_pause_seconds``: the bucket the longest fell in), the worst
event-loop lag and the server's own stalls. What a request or connection leaves in reference
cycles is freed by these collections, all at once, on the event loop.
"""

from __future__ import annotations

import argparse
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

HI = [{"role": "user", "content": "hi"}]


def scrape(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def longest_bucket(m: dict[str, float], before: dict[str, float]) -> str:
    """The smallest bucket holding every pause of this run (a histogram keeps no maximum)."""
    prefix = "izh:gc_pause_seconds_bucket{generation=0,le="
    total = m.get("izh:gc_pause_seconds_count{generation=0}", 0.0) - before.get(
        "izh:gc_pause_seconds_count{generation=0}", 0.0)
    if total == 0:
        return "-"
    bounds = sorted((float(k[len(prefix):-1]), k) for k in m if k.startswith(prefix))
    for bound, key in bounds:
        if m[key] - before.get(key, 0.0) >= total:
            return f"<= {bound * 1000:g} ms"
    return "?"


def one(base: str, i: int, model: str | None, headers: dict[str, str]) -> None:
    with httpx.Client(base_url=base, timeout=60, headers=headers) as client:
        named = {"model": model} if model else {}
        if i % 4 == 0:
            client.post("/v1/chat/completions", json={**named, "messages": HI, "max_tokens": 2})
        elif i % 4 == 1:
            client.post("/v1/chat/completions", json={**named, "messages": "not a list"})
        elif i % 4 == 2:
            client.get("/no/such/route")
        else:
            client.post("/v1/responses", json={**named, "input": "hi", "max_output_tokens": 2})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--model", default=None)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    before = scrape(args.base)
    start = time.monotonic()
    for i in range(args.requests):
        one(args.base, i, args.model, headers)
    took = time.monotonic() - start
    after = scrape(args.base)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    print(f"{args.requests} requests, a connection each, in {took:.1f} s")
    print(f"first-generation collections: {delta('izh:gc_pause_seconds_count{generation=0}'):.0f}"
          f", objects freed {delta('python_gc_objects_collected_total{generation=0}'):.0f}, "
          f"pauses {delta('izh:gc_pause_seconds_sum{generation=0}') * 1000:.0f} ms in all, "
          f"the longest {longest_bucket(after, before)}")
    print(f"worst event-loop lag since start "
          f"{after.get('izh:event_loop_lag_max_seconds', 0.0) * 1000:.0f} ms, "
          f"stalls of the server's own {delta('izh:event_loop_stalls_total'):.0f}")


if __name__ == "__main__":
    main()

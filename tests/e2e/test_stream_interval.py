"""``--stream-interval N``: a stream's first token at once, then events of at least N tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import PACED, free_port, running_server, serve_args

pytestmark = pytest.mark.timing

INTERVAL = 4


@pytest.fixture(scope="module")
def interval_server(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "interval.log"
    # Paced (1,900 tokens take 19 s or more): the deadline below always cuts the stream.
    with running_server(serve_args(hf_dir, port, "--stream-interval", str(INTERVAL)), log,
                        port=port, env=PACED) as (base, _proc):
        yield base


def _chunks(base: str, body: dict, headers: dict | None = None) -> list[dict]:
    with httpx.stream("POST", base + "/v1/completions", json=body, headers=headers,
                      timeout=60) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_events_after_the_first_carry_at_least_the_interval(interval_server: str) -> None:
    chunks = _chunks(interval_server, {
        "prompt": [5, 6, 7], "max_tokens": 17, "stream": True, "ignore_eos": True,
        "temperature": 0, "logprobs": 0,  # one logprob entry per token: counts every token
        "stream_options": {"include_usage": True}})
    per_event = [len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks if c["choices"]]
    # The first event goes as soon as the route wakes (a token or a few); then the interval.
    assert sum(per_event) == 17 and len(per_event) <= 1 + -(-16 // INTERVAL)
    assert all(n >= INTERVAL for n in per_event[1:-1]), per_event
    assert chunks[-1]["usage"]["completion_tokens"] == 17


def test_a_deadline_shows_the_tokens_the_interval_held(interval_server: str) -> None:
    chunks = _chunks(interval_server, {
        "prompt": [5, 6, 7], "max_tokens": 1900, "stream": True, "ignore_eos": True,
        "temperature": 0, "logprobs": 0, "stream_options": {"include_usage": True}},
        {"X-Request-Timeout": "1"})
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[-1]["finish_reason"] == "length"
    shown = sum(len(c["logprobs"]["tokens"]) for c in choices)
    assert 0 < shown == chunks[-1]["usage"]["completion_tokens"] < 1900

"""Background responses against the real, paced server (``paced_server``: a request of N
tokens runs for N x STEP_DELAY or more): created queued, their progress retrieved, their
events replayed from any point and followed live, cancelled (the engine request aborted, its
KV freed), and left running when the client that follows them goes away."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response

from tests.e2e.conftest import KV_USAGE, RUNNING, idle, scrape, wait_for_metrics
from tests.e2e.test_responses import MODEL, STREAM_EVENTS, TERMINAL, post

pytestmark = pytest.mark.timing

LONG = {"model": MODEL, "input": "Go on.", "background": True, "max_output_tokens": 1500,
        "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def client(paced_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=paced_server + "/v1", api_key="unused", max_retries=0)


def wait_for(base: str, response_id: str, ready: Any, within: float = 60) -> dict[str, Any]:
    """GET the response until ``ready(response)``; the last one."""
    deadline = time.monotonic() + within
    while True:
        got = httpx.get(f"{base}/v1/responses/{response_id}", timeout=10).json()
        if ready(got):
            return got
        assert time.monotonic() < deadline, got.get("status")
        time.sleep(0.02)


def text_of(response: dict[str, Any]) -> str:
    return "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"])


def followed(base: str, response_id: str, starting_after: int | None = None,
             until: int | None = None) -> list[dict[str, Any]]:
    """The events of ``GET ?stream=true``, each validated by the SDK; stops reading (and
    leaves) after ``until`` events."""
    params: dict[str, Any] = {"stream": "true"}
    if starting_after is not None:
        params["starting_after"] = starting_after
    events: list[dict[str, Any]] = []
    with httpx.stream("GET", f"{base}/v1/responses/{response_id}", params=params,
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                STREAM_EVENTS.validate_python(events[-1])
                if until is not None and len(events) >= until:
                    break
    return events


def count(base: str, status: str) -> float:
    return scrape(base).get(f'izh:responses_total{{status="{status}"}}', 0.0)


def test_a_background_response_is_followed_replayed_and_cancelled(
        paced_server: str, client: openai.OpenAI) -> None:
    base = paced_server
    cancelled_before = count(base, "cancelled")
    created = client.responses.create(**{k: v for k, v in LONG.items() if k != "ignore_eos"},
                                      extra_body={"ignore_eos": True})
    assert created.status == "queued" and created.background is True and created.usage is None
    # Its progress: in progress, with some of its text already stored.
    progress = wait_for(base, created.id, lambda r: r["status"] == "in_progress"
                        and len(text_of(r)) > 0)
    Response.model_validate(progress)
    live = followed(base, created.id, starting_after=2, until=20)
    numbers = [e["sequence_number"] for e in live]
    assert numbers == list(range(3, 23))  # from N + 1 on, none missed, none repeated
    assert wait_for_metrics(base, lambda m: m[RUNNING] == 1)[KV_USAGE] > 0
    out = client.responses.cancel(created.id)
    assert out.status == "cancelled"
    wait_for_metrics(base, idle, what="the cancelled response's KV freed")
    assert count(base, "cancelled") == cancelled_before + 1
    # Cancelled is final: cancelling again answers it unchanged; its events end untermed.
    assert client.responses.cancel(created.id).model_dump() == out.model_dump()
    replay = followed(base, created.id)
    assert [e["sequence_number"] for e in replay] == list(range(len(replay)))
    assert replay[0]["type"] == "response.created"
    assert replay[0]["response"]["status"] == "queued"
    assert replay[1]["type"] == "response.in_progress"
    assert not [e for e in replay if e["type"] in TERMINAL]
    assert replay[:23] == [*replay[:3], *live]


def test_a_finished_background_response_replays_to_what_is_stored(
        paced_server: str, client: openai.OpenAI) -> None:
    body = {**LONG, "max_output_tokens": 40}
    created = post(paced_server, body).json()
    events = followed(paced_server, created["id"])  # live from the start, to its end
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events if e["type"] in TERMINAL] == ["response.incomplete"]
    assert events[-1]["type"] == "response.incomplete"
    stored = client.responses.retrieve(created["id"])
    assert events[-1]["response"] == stored.model_dump(mode="json", exclude_unset=True)
    assert stored.usage.output_tokens == 40
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == stored.output_text
    tail = followed(paced_server, created["id"], starting_after=len(events) - 3)
    assert tail == events[-2:]
    with client.responses.retrieve(created["id"], stream=True,
                                   starting_after=len(events) - 3) as sdk:
        assert [e.model_dump(mode="json", exclude_unset=True) for e in sdk] == tail
    assert client.responses.cancel(created["id"]).status == "incomplete"  # unchanged


def test_a_background_response_outlives_its_clients(paced_server: str) -> None:
    created = post(paced_server, {**LONG, "max_output_tokens": 150}).json()
    first = followed(paced_server, created["id"], until=8)  # then this client leaves
    assert first[-1]["sequence_number"] == 7
    # Created streamed: the client that created it reads some events, then leaves too.
    with httpx.stream("POST", f"{paced_server}/v1/responses", timeout=60,
                      json={**LONG, "max_output_tokens": 150, "stream": True}) as r:
        lines = r.iter_lines()
        created_event = json.loads(next(line for line in lines
                                        if line.startswith("data: "))[len("data: "):])
    assert created_event["type"] == "response.created"
    streamed_id = created_event["response"]["id"]
    for response_id in (created["id"], streamed_id):
        done = wait_for(paced_server, response_id, lambda r: r["status"] not in (
            "queued", "in_progress"))
        assert done["status"] == "incomplete" and done["usage"]["output_tokens"] == 150


def test_deleting_a_running_background_response_stops_it(paced_server: str) -> None:
    created = post(paced_server, LONG).json()
    wait_for(paced_server, created["id"], lambda r: r["status"] == "in_progress")
    deleted = httpx.delete(f"{paced_server}/v1/responses/{created['id']}", timeout=30)
    assert deleted.json()["deleted"] is True
    wait_for_metrics(paced_server, idle, what="the deleted response's KV freed")
    # Stopped before it was deleted: its last write did not store it again.
    assert httpx.get(f"{paced_server}/v1/responses/{created['id']}").status_code == 404


def test_only_background_responses_are_cancelled_or_streamed_again(
        paced_server: str, client: openai.OpenAI) -> None:
    plain = client.responses.create(model=MODEL, input="hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(plain.id)
    again = httpx.get(f"{paced_server}/v1/responses/{plain.id}", params={"stream": "true"})
    assert again.status_code == 400 and again.json()["error"]["param"] == "stream"
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_unknown")

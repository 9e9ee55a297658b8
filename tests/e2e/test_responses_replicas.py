"""Two replicas sharing a real ``redis-server`` (``--response-store redis://...``) behind the
nginx configuration of tools/deploy: each continues, retrieves, follows and cancels the
other's responses. Skipped where nginx or redis-server is not installed (.ci/run installs
both)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import (
    PACED,
    RUNNING,
    free_port,
    idle,
    running_server,
    serve_args,
    wait_for_metrics,
)
from tests.e2e.test_load_balancer import NGINX, running_nginx
from tests.e2e.test_responses_background import LONG, count, followed, text_of, wait_for
from tests.redis_server import running_redis

pytestmark = [pytest.mark.timing,
              pytest.mark.skipif(NGINX is None, reason="nginx is not installed")]


@pytest.fixture(scope="module")
def replicas(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[str, str, str]]:
    """(replica A, replica B, nginx in front of both), sharing one Redis."""
    tmp = tmp_path_factory.mktemp("replicas")
    a, b, front = free_port(), free_port(), free_port()
    with ExitStack() as stack:
        url = stack.enter_context(running_redis(tmp))
        for port, name in ((a, "a"), (b, "b")):
            stack.enter_context(running_server(
                serve_args(hf_dir, port, "--served-model-name", "qwen3-test",
                           "--response-store", url), tmp / f"{name}.log", port=port, env=PACED))
        base = stack.enter_context(running_nginx(tmp, front, a, b))
        yield f"http://127.0.0.1:{a}", f"http://127.0.0.1:{b}", base


def create(base: str, **body: object) -> dict:
    r = httpx.post(base + "/v1/responses", json={"max_output_tokens": 4, "temperature": 0,
                                                 "ignore_eos": True, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_replicas_continue_each_others_conversations(replicas: tuple[str, str, str]) -> None:
    a, b, front = replicas
    counted = {base: count(base, "incomplete") for base in (a, b)}
    first = create(a, input="Hello from A.")
    second = create(b, input="And B.", previous_response_id=first["id"])
    third = create(a, input="A again.", previous_response_id=second["id"])
    # A's third prompt holds B's turn: longer than it, by at least that turn's input.
    assert third["usage"]["input_tokens"] > second["usage"]["input_tokens"] \
        > first["usage"]["input_tokens"]
    assert httpx.get(f"{a}/v1/responses/{second['id']}").json() == second
    assert httpx.get(f"{b}/v1/responses/{third['id']}").json() == third
    items = httpx.get(f"{b}/v1/responses/{first['id']}/input_items").json()
    assert [i["content"][0]["text"] for i in items["data"]] == ["Hello from A."]
    previous = third
    for turn in range(6):  # nginx takes turns between them
        previous = create(front, input=f"Turn {turn}.", previous_response_id=previous["id"])
    assert all(count(base, "incomplete") >= counted[base] + 2 for base in (a, b))
    assert httpx.delete(f"{b}/v1/responses/{first['id']}").json()["deleted"] is True
    assert httpx.get(f"{a}/v1/responses/{first['id']}").status_code == 404


def test_a_replica_follows_and_cancels_the_others_background_response(
        replicas: tuple[str, str, str]) -> None:
    a, b, _front = replicas
    created = create(a, **LONG)
    # B sees its progress and its events, read from the store, as A stores them.
    wait_for(b, created["id"], lambda r: r["status"] == "in_progress" and text_of(r))
    events = followed(b, created["id"], starting_after=4, until=10)
    assert [e["sequence_number"] for e in events] == list(range(5, 15))
    wait_for_metrics(a, lambda m: m[RUNNING] == 1)
    cancelled = httpx.post(f"{b}/v1/responses/{created['id']}/cancel", timeout=30).json()
    assert cancelled["status"] == "cancelled"
    # A finds it cancelled at its next write and stops it: its KV is freed.
    wait_for_metrics(a, idle, what="the response cancelled by B stopped on A")
    stored = wait_for(a, created["id"], lambda r: r["status"] == "cancelled")
    assert stored["background"] is True


def test_a_replica_deletes_the_others_running_response(replicas: tuple[str, str, str]) -> None:
    a, b, _front = replicas
    created = create(a, **LONG)
    wait_for(b, created["id"], lambda r: r["status"] == "in_progress")
    wait_for_metrics(a, lambda m: m[RUNNING] == 1)
    assert httpx.delete(f"{b}/v1/responses/{created['id']}").json()["deleted"] is True
    # A finds it gone at its next write, stops it, and does not store it again.
    wait_for_metrics(a, idle, what="the response deleted by B stopped on A")
    for base in (a, b):
        assert httpx.get(f"{base}/v1/responses/{created['id']}").status_code == 404

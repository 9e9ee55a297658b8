"""A running background response whose owner stopped writing it (a killed server, a replica
gone) is stored as failed by the next reader; one still written, or running here, is not."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.response_store import ResponseStatus, StoredResponse, open_store
from izh_trio.frontend.responses.runs import Runs
from izh_trio.frontend.responses.stored import STALE_S, load


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Any]:
    store = await open_store(f"sqlite:///{tmp_path / 'r.sqlite3'}")
    yield SimpleNamespace(store=store, background=Runs())
    await store.aclose()


def running(rid: str, updated_ago: float) -> StoredResponse:
    now = time.time()
    return StoredResponse(id=rid, created_at=now - updated_ago, status="in_progress",
                          response={"id": rid, "status": "in_progress", "background": True,
                                    "error": None, "output": []},
                          updated_at=now - updated_ago)


async def test_a_silent_running_response_is_failed_by_its_next_reader(server: Any) -> None:
    await server.store.put(running("resp_gone", STALE_S + 5))
    got = await load(server, "resp_gone")
    assert got.status is ResponseStatus.FAILED
    assert got.response["status"] == "failed"
    assert got.response["error"]["code"] == "server_error"
    assert (await server.store.get("resp_gone")).status is ResponseStatus.FAILED


async def test_a_response_written_lately_or_running_here_is_left_running(server: Any) -> None:
    await server.store.put(running("resp_fresh", 1.0))
    assert (await load(server, "resp_fresh")).status is ResponseStatus.IN_PROGRESS
    await server.store.put(running("resp_here", STALE_S + 5))
    server.background.start("resp_here")
    assert (await load(server, "resp_here")).status is ResponseStatus.IN_PROGRESS


async def test_an_unknown_response_is_a_404(server: Any) -> None:
    with pytest.raises(APIError) as err:
        await load(server, "resp_none")
    assert err.value.status == 404 and err.value.code == "not_found"

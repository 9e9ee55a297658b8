"""The Responses API's store: one contract, run against SQLite and a real redis-server."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis
import trio

from izh_trio.frontend.response_store import (
    InvalidTransition,
    PageError,
    ResponseStatus,
    ResponseStore,
    StoredResponse,
    StoreUnavailable,
    UnknownResponse,
    check_url,
    conversation,
    describe,
    expire_periodically,
    open_store,
)
from izh_trio.frontend.response_store.redis_store import RedisStore
from tests.redis_server import running_redis

TTL_S = 100.0


class FakeClock:
    """Starts at the real time (Redis computes key TTLs from it) and moves only when told."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


OpenStore = Callable[..., Awaitable[ResponseStore]]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'responses.sqlite3'}"
    url = request.getfixturevalue("redis_url")
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def open_backend(store_url: str, clock: FakeClock) -> AsyncIterator[OpenStore]:
    """Opens the parametrized backend (as often as a test likes); closes them all after."""
    opened: list[ResponseStore] = []

    async def _open(ttl_s: float = TTL_S, max_rows: int = 1000) -> ResponseStore:
        store = await open_store(store_url, ttl_s, max_rows, clock=clock)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        await store.aclose()


@pytest.fixture
async def store(open_backend: OpenStore) -> ResponseStore:
    return await open_backend()


def record(
    rid: str, created_at: float, status: ResponseStatus = ResponseStatus.COMPLETED, *,
    prev: str | None = None, n_items: int = 1, text: str = "hi",
) -> StoredResponse:
    items = [{"id": f"{rid}_in{i}", "type": "message", "role": "user",
              "content": [{"type": "input_text", "text": f"{text} {i}"}]}
             for i in range(n_items)]
    output = [{"id": f"{rid}_out", "type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": f"re: {text}"}]}]
    response = {"id": rid, "object": "response", "status": status.value, "output": output}
    return StoredResponse(id=rid, created_at=created_at, status=status, response=response,
                          input_items=items, previous_response_id=prev)


def events(*numbers: int) -> list[dict[str, object]]:
    return [{"type": "response.output_text.delta", "sequence_number": n, "delta": f"d{n}"}
            for n in numbers]


async def test_put_get_delete_round_trip(store: ResponseStore, clock: FakeClock) -> None:
    stored = await store.put(record("resp_a", clock.now))
    assert stored.expires_at == clock.now + TTL_S
    assert await store.get("resp_a") == stored
    assert stored.response["output"][0]["content"][0]["text"] == "re: hi"
    assert await store.delete("resp_a") is True
    assert await store.get("resp_a") is None
    assert await store.delete("resp_a") is False


async def test_unknown_id(store: ResponseStore) -> None:
    assert await store.get("resp_nope") is None
    assert await store.delete("resp_nope") is False
    assert await store.events("resp_nope") == []
    assert await store.input_items("resp_nope") is None
    with pytest.raises(UnknownResponse, match="resp_nope"):
        await store.append_events("resp_nope", events(0))
    with pytest.raises(UnknownResponse, match="resp_nope"):
        await store.chain("resp_nope")


async def test_replace_follows_the_lifecycle(store: ResponseStore, clock: FakeClock) -> None:
    queued = await store.put(record("resp_b", clock.now, ResponseStatus.QUEUED))
    await store.append_events("resp_b", events(0, 1))
    running = queued.advance(ResponseStatus.IN_PROGRESS, {"status": "in_progress"})
    await store.put(running)
    await store.put(running.advance(ResponseStatus.IN_PROGRESS, {"output": ["partial"]}))
    assert (await store.get("resp_b")).response == {"output": ["partial"]}
    cancelled = running.advance(ResponseStatus.CANCELLED, {"status": "cancelled"})
    await store.put(cancelled)
    # another replica finishing late must not overwrite the cancellation
    with pytest.raises(InvalidTransition, match="cancelled"):
        await store.put(running.advance(ResponseStatus.COMPLETED, {"status": "completed"}))
    got = await store.get("resp_b")
    assert got is not None and got.status is ResponseStatus.CANCELLED
    with pytest.raises(InvalidTransition):
        got.advance(ResponseStatus.IN_PROGRESS, {})
    # a replacement keeps the response's event log
    assert [e["sequence_number"] for e in await store.events("resp_b")] == [0, 1]


async def test_events_append_and_replay(store: ResponseStore, clock: FakeClock) -> None:
    await store.put(record("resp_c", clock.now, ResponseStatus.IN_PROGRESS))
    await store.append_events("resp_c", events(0, 1, 2))
    await store.append_events("resp_c", events(3, 4))
    assert await store.events("resp_c") == events(0, 1, 2, 3, 4)
    assert await store.events("resp_c", starting_after=2) == events(3, 4)
    assert await store.events("resp_c", starting_after=4) == []
    # the same number again replaces, never duplicates
    await store.append_events("resp_c", [{"sequence_number": 3, "type": "again"}])
    replayed = await store.events("resp_c", starting_after=2)
    assert replayed == [{"sequence_number": 3, "type": "again"}, *events(4)]
    await store.delete("resp_c")
    await store.put(record("resp_c", clock.now, ResponseStatus.IN_PROGRESS))
    assert await store.events("resp_c") == []  # deleted with its response
    with pytest.raises(ValueError, match="sequence_number"):
        await store.append_events("resp_c", [{"type": "no number"}])


async def test_input_items_pages(store: ResponseStore, clock: FakeClock) -> None:
    await store.put(record("resp_d", clock.now, n_items=5))

    async def ids(**params: object) -> tuple[list[str], bool]:
        page = await store.input_items("resp_d", **params)
        assert page is not None
        body = page.to_json()
        assert body["object"] == "list"
        data = [item["id"] for item in body["data"]]
        ends = (data[0], data[-1]) if data else (None, None)
        assert (body["first_id"], body["last_id"]) == ends
        return [d.removeprefix("resp_d_") for d in data], body["has_more"]

    assert await ids() == (["in4", "in3", "in2", "in1", "in0"], False)
    assert await ids(limit=2) == (["in4", "in3"], True)
    assert await ids(limit=2, after="resp_d_in3") == (["in2", "in1"], True)
    assert await ids(limit=2, after="resp_d_in1") == (["in0"], False)
    assert await ids(order="asc", after="resp_d_in1") == (["in2", "in3", "in4"], False)
    assert await ids(order="asc", before="resp_d_in2") == (["in0", "in1"], False)
    assert await ids(order="asc", after="resp_d_in0", before="resp_d_in4", limit=2) == (
        ["in1", "in2"], True)
    for bad, param in (({"limit": 0}, "limit"), ({"limit": 101}, "limit"),
                       ({"order": "up"}, "order"), ({"after": "msg_x"}, "after")):
        with pytest.raises(PageError) as caught:
            await store.input_items("resp_d", **bad)
        assert caught.value.param == param


async def test_a_chain_of_32_turns(store: ResponseStore, clock: FakeClock) -> None:
    prev = None
    for turn in range(32):
        await store.put(record(f"resp_t{turn}", clock.now + turn, prev=prev, text=f"t{turn}"))
        prev = f"resp_t{turn}"
    chain = await store.chain("resp_t31")
    assert [r.id for r in chain] == [f"resp_t{i}" for i in range(32)]
    items = conversation(chain)
    assert [i["id"] for i in items[:4]] == ["resp_t0_in0", "resp_t0_out", "resp_t1_in0",
                                            "resp_t1_out"]
    assert len(items) == 64
    assert [r.id for r in await store.chain("resp_t0")] == ["resp_t0"]
    await store.delete("resp_t7")
    with pytest.raises(UnknownResponse) as caught:
        await store.chain("resp_t31")
    assert caught.value.response_id == "resp_t7"


async def test_ttl_expiry_deletes(open_backend: OpenStore, clock: FakeClock) -> None:
    store = await open_backend(ttl_s=10.0)
    await store.put(record("resp_old", clock.now, ResponseStatus.IN_PROGRESS))
    await store.append_events("resp_old", events(0))
    clock.now += 5
    await store.put(record("resp_new", clock.now))
    clock.now += 6  # resp_old is past its 10 s, resp_new is not
    assert await store.get("resp_old") is None  # expired reads as absent at once
    assert await store.events("resp_old") == []
    with pytest.raises(UnknownResponse):
        await store.append_events("resp_old", events(1))
    assert await store.expire() == 1
    clock.now -= 6  # had expire() only hidden it, it would show again now
    assert await store.get("resp_old") is None
    assert await store.events("resp_old") == []
    assert await store.get("resp_new") is not None
    clock.now += 20  # a write enforces the TTL too
    await store.put(record("resp_newest", clock.now))
    clock.now -= 20
    assert await store.get("resp_new") is None


async def test_row_cap_evicts_the_oldest(open_backend: OpenStore, clock: FakeClock) -> None:
    store = await open_backend(max_rows=3)
    for i in range(5):
        await store.put(record(f"resp_{i}", clock.now + i))
    assert [await store.get(f"resp_{i}") is not None for i in range(5)] == [
        False, False, True, True, True]
    assert await store.expire() == 0


async def test_concurrent_writers(store: ResponseStore, clock: FakeClock) -> None:
    await store.put(record("resp_shared", clock.now, ResponseStatus.IN_PROGRESS))

    async def writer(w: int) -> None:
        for i in range(10):
            await store.put(record(f"resp_w{w}_{i}", clock.now))
            await store.append_events("resp_shared", events(w * 100 + i))

    async with trio.open_nursery() as nursery:
        for w in range(6):
            nursery.start_soon(writer, w)
    for w in range(6):
        for i in range(10):
            assert (await store.get(f"resp_w{w}_{i}")).id == f"resp_w{w}_{i}"
    numbers = [e["sequence_number"] for e in await store.events("resp_shared")]
    assert numbers == sorted(w * 100 + i for w in range(6) for i in range(10))


async def test_sqlite_survives_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    url = f"sqlite://{tmp_path / 'sub' / 'store.db'}"
    async with await open_store(url, TTL_S, 10, clock=clock) as first:
        stored = await first.put(record("resp_keep", clock.now, ResponseStatus.IN_PROGRESS))
        await first.append_events("resp_keep", events(0, 1))
    async with await open_store(url, TTL_S, 10, clock=clock) as again:
        assert await again.get("resp_keep") == stored
        assert await again.events("resp_keep", 0) == events(1)


async def test_sqlite_refuses_a_newer_schema_and_a_bad_path(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "store.db"
    await (await open_store(f"sqlite://{path}", TTL_S, 10)).aclose()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = version + 1")
    with pytest.raises(StoreUnavailable, match="newer"):
        await open_store(f"sqlite://{path}", TTL_S, 10)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(StoreUnavailable, match="cannot open"):
        await open_store(f"sqlite://{tmp_path / 'a_file' / 'x.db'}", TTL_S, 10)


async def test_default_store_is_sqlite_in_the_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IZH_CACHE_DIR", str(tmp_path / "cache"))
    async with await open_store(None, TTL_S, 10) as store:
        await store.put(record("resp_x", time.time()))
    assert (tmp_path / "cache" / "responses.sqlite3").is_file()
    with pytest.raises(ValueError, match="response-store"):
        await open_store("mysql://db", TTL_S, 10)
    with pytest.raises(ValueError, match="TTL"):
        await open_store(None, 0, 10)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_unreachable_redis_is_unavailable_in_bounded_time() -> None:
    store = await open_store(f"redis://127.0.0.1:{_closed_port()}/0", TTL_S, 10)
    async with store:
        with trio.fail_after(30):  # refused at once; the bound only catches a hang
            with pytest.raises(StoreUnavailable, match=r"127\.0\.0\.1"):
                await store.get("resp_a")
            with pytest.raises(StoreUnavailable):
                await store.put(record("resp_a", time.time()))


async def test_a_silent_redis_times_out() -> None:
    """A peer that accepts and never answers: the socket timeout, not a hang, ends the call."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        store = RedisStore(f"redis://127.0.0.1:{listener.getsockname()[1]}/0", timeout_s=0.3)
        async with store:
            with trio.fail_after(30), pytest.raises(StoreUnavailable, match=r"[Tt]imeout"):
                await store.get("resp_a")


def test_urls() -> None:
    check_url(None)
    check_url("sqlite:///var/lib/izh/responses.db")
    check_url("redis://cache:6379/2")
    for bad in ("sqlite://", "postgres://db/x", "/plain/path"):
        with pytest.raises(ValueError, match="expected sqlite"):
            check_url(bad)
    assert describe("redis://user:secret@cache:6379/0") == "redis://***@cache:6379/0"
    assert "secret" not in describe("rediss://:secret@cache:6380/1")


class _FlakyStore:
    """Counts expire() calls; the first finds the store unreachable."""

    def __init__(self) -> None:
        self.calls = 0
        self.third = trio.Event()

    async def expire(self) -> int:
        self.calls += 1
        if self.calls == 3:
            self.third.set()
        if self.calls == 1:
            raise StoreUnavailable("down for a moment")
        return 0


async def test_expire_periodically_outlives_an_outage(autojump_clock: trio.abc.Clock) -> None:
    store = _FlakyStore()
    async with trio.open_nursery() as nursery:
        await nursery.start(expire_periodically, store, 3600.0)
        start = trio.current_time()
        await store.third.wait()
        assert trio.current_time() - start == pytest.approx(2 * 3600.0)
        nursery.cancel_scope.cancel()

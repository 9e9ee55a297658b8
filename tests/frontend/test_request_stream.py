"""The per-request buffer between the engine reader and a route: coalescing and its bound."""

from __future__ import annotations

import weakref

import pytest
import trio

from izh_trio.frontend.request_stream import EngineError, Notifier, RequestStream, StreamState
from izh_trio.wire import FinishReason, ProtocolError, RequestOutput
from tests.refcycles import cyclic_collector_off


def _out(tokens: list[int], n_out: int, reason: FinishReason | None = None) -> RequestOutput:
    return RequestOutput("r", tokens, 3, n_out, 0, reason)


def _stream(limit: int = 100) -> tuple[RequestStream, list[int]]:
    aborts: list[int] = []
    return RequestStream("r", 3, limit, Notifier(), abort=lambda: aborts.append(1)), aborts


async def test_outputs_coalesce_while_the_route_is_busy() -> None:
    stream, aborts = _stream()
    stream.push(_out([1], 1))
    stream.push(_out([2, 3], 3))
    delta = await stream.__anext__()
    assert delta.token_ids == [1, 2, 3] and delta.num_output_tokens == 3
    stream.push(_out([4], 4, FinishReason.LENGTH))
    last = await stream.__anext__()
    assert last.token_ids == [4] and last.finish_reason is FinishReason.LENGTH
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    stream.abort()  # finished in the core: nothing to abort
    assert aborts == []


async def test_a_consumer_that_falls_behind_is_failed_and_aborted() -> None:
    stream, aborts = _stream(limit=10)
    for i in range(11):
        stream.push(_out([i], i + 1))
    with pytest.raises(EngineError, match="fell more than 10 tokens behind") as failed:
        await stream.__anext__()
    assert failed.value.slow_client and not failed.value.rejected  # its trace's end cause
    assert aborts == [1]
    stream.abort()  # idempotent: the open_stream exit will call it again
    assert aborts == [1]


async def test_one_notifier_wakes_a_waiter_for_any_stream(autojump_clock: trio.abc.Clock
                                                          ) -> None:
    notifier = Notifier()
    a = RequestStream("a", 1, 100, notifier, abort=lambda: None)
    b = RequestStream("b", 1, 100, notifier, abort=lambda: None)

    async def later() -> None:
        await trio.sleep(5)
        b.push(RequestOutput("b", [9], 1, 1))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        with trio.fail_after(10):
            await notifier.wait()
    assert a.take_nowait() is None
    assert b.take_nowait().token_ids == [9]


async def test_a_rejection_is_raised_once() -> None:
    stream, aborts = _stream()
    stream.failed_in_core("bad prompt", rejected=True)
    assert stream.state is StreamState.FINISHED
    with pytest.raises(EngineError) as err:
        await stream.__anext__()
    assert err.value.rejected
    assert stream.take_nowait() is None and stream.exhausted
    stream.abort()
    assert aborts == []  # the core never took it


def test_a_raised_error_is_not_kept() -> None:
    """Its traceback refers to the stream: kept, every failed request would be a reference
    cycle, left for the cyclic collector (a pause of the event loop)."""
    with cyclic_collector_off():
        stream, _ = _stream()
        stream.failed_in_core("bad prompt", rejected=True)
        stream.fail("the engine died")  # after the first error: ignored
        gone = weakref.ref(stream)
        try:
            stream.take_nowait()
        except EngineError as exc:
            assert str(exc) == "bad prompt" and exc.__traceback__ is not None
        else:
            raise AssertionError("the error was not raised")
        stream.fail("the engine died")  # after the consumer took the end: ignored
        assert stream.take_nowait() is None
        del stream
        assert gone() is None


async def test_a_stream_interval_wakes_for_the_first_token_every_nth_and_the_end(
        autojump_clock: trio.abc.Clock) -> None:
    notifier = Notifier()
    stream = RequestStream("r", 3, 100, notifier, abort=lambda: None, interval=3)
    woken: list[list[int]] = []

    async def route() -> None:
        async for delta in stream:
            woken.append(delta.token_ids)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(route)
        for i in range(1, 9):  # one token per engine step, the route always keeping up
            await trio.sleep(1)
            stream.push(_out([i], i, FinishReason.LENGTH if i == 8 else None))
    assert woken == [[1], [2, 3, 4], [5, 6, 7], [8]]


def test_held_tokens_are_taken_when_asked_for() -> None:
    stream = RequestStream("r", 3, 100, Notifier(), abort=lambda: None, interval=4)
    stream.push(_out([1], 1))
    assert stream.take_nowait().token_ids == [1]
    stream.push(_out([2], 2))
    stream.push(_out([3], 3))
    assert stream.take_nowait() is None  # 2 of 4: held
    assert stream.take_nowait(held=True).token_ids == [2, 3]  # a deadline passed


def test_the_core_saying_anything_of_a_request_it_ended_is_a_protocol_error() -> None:
    stream, aborts = _stream()
    stream.push(_out([1], 1, FinishReason.STOP))
    with pytest.raises(ProtocolError, match="an output after the core ended it"):
        stream.push(_out([2], 2))
    with pytest.raises(ProtocolError, match="finished after the core ended it"):
        stream.failed_in_core("late", rejected=False)
    stream.abort()
    assert aborts == [] and stream.state is StreamState.FINISHED


def test_an_aborted_stream_takes_what_the_core_sent_before_it_read_the_abort() -> None:
    stream, aborts = _stream()
    stream.push(_out([1], 1))
    stream.abort()
    stream.abort()
    assert aborts == [1] and stream.state is StreamState.ABORTED
    stream.push(_out([2], 2))  # the core had not read the abort yet
    stream.push(_out([3], 3, FinishReason.LENGTH))  # and it ended the request first
    assert stream.state is StreamState.FINISHED
    assert stream.take_nowait().token_ids == [1, 2, 3]
    with pytest.raises(ProtocolError):
        stream.push(_out([4], 4))

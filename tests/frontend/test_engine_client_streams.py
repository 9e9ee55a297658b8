"""The engine client's protocol in-process: a fake core at the far end of two memory streams.

The fake core is written here: it decodes the client's frames and answers as the real one
would (or as a broken one might). The clock is trio's autojump one, so timeouts cost nothing
and a test that waits for what never comes fails at once, at its virtual deadline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from trio.abc import Clock

from izh_trio.frontend.engine_client import ClientState, EngineClient, EngineUnavailable
from izh_trio.frontend.request_stream import EngineError
from izh_trio.wire import (
    Abort,
    AddRequest,
    Fatal,
    FinishReason,
    FrameDecoder,
    LoadLora,
    LoraUpdated,
    Message,
    ModelInfo,
    Ready,
    RequestFailed,
    RequestOutput,
    SamplingParams,
    Shutdown,
    Stats,
    StepOutputs,
    encode_frame,
)

READY = Ready(max_model_len=64, model=ModelInfo(100, "float32", (99,)))
PARAMS = SamplingParams(max_tokens=8)
#: Virtual seconds before a test that waits for what never comes fails.
DEADLINE = 3600


def _out(rid: str, n: int, reason: FinishReason | None = None) -> RequestOutput:
    return RequestOutput(rid, (n,), 3, n, 0, reason)


class FakeCore:
    def __init__(self, to_client: trio.abc.SendStream, from_client: trio.abc.ReceiveStream):
        self.to_client = to_client
        self.from_client = from_client
        self._decoder = FrameDecoder()
        self._inbox: list[Message] = []

    async def send(self, *messages: Message) -> None:
        await self.to_client.send_all(encode_frame(messages))

    async def receive(self) -> Message | None:
        """The client's next message; None once it closed its stream."""
        while not self._inbox:
            data = await self.from_client.receive_some()
            if not data:
                return None
            self._inbox += self._decoder.feed(data)
        return self._inbox.pop(0)

    async def exit(self) -> None:
        """What the real core does on Shutdown or EOF: close its end."""
        await self.to_client.aclose()


@asynccontextmanager
async def connected(**kwargs: float) -> AsyncIterator[tuple[EngineClient, FakeCore]]:
    """A started client and its core; on the way out the core must see the Shutdown."""
    to_core_send, to_core_recv = trio.testing.memory_stream_one_way_pair()
    from_core_send, from_core_recv = trio.testing.memory_stream_one_way_pair()
    core = FakeCore(from_core_send, to_core_recv)
    client = EngineClient(**kwargs)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(core.send, READY)
            await nursery.start(client.run, to_core_send, from_core_recv)
            yield client, core
            client.close()
            while (msg := await core.receive()) is not None:  # Shutdown, then EOF
                last = msg
            if client.state is ClientState.CLOSED:
                assert last == Shutdown()
            await core.exit()


async def test_cancelling_a_streams_scope_sends_its_abort(autojump_clock: Clock) -> None:
    async with connected() as (client, core):
        with trio.CancelScope() as scope:
            async with client.open_stream("r", [1, 2, 3], PARAMS):
                assert await core.receive() == AddRequest("r", (1, 2, 3), PARAMS)
                scope.cancel()
                await trio.sleep_forever()
        assert await core.receive() == Abort(("r",))


async def test_an_exception_in_the_block_sends_the_abort(autojump_clock: Clock) -> None:
    async with connected() as (client, core):
        with pytest.raises(ConnectionResetError):
            async with client.open_stream("r", [1], PARAMS) as stream:
                await core.send(StepOutputs([_out("r", 1)]))
                assert (await stream.__anext__()).token_ids == [1]
                raise ConnectionResetError  # the HTTP client went away mid-stream
        assert isinstance(await core.receive(), AddRequest)
        assert await core.receive() == Abort(("r",))


async def test_a_finished_request_is_not_aborted(autojump_clock: Clock) -> None:
    async with connected() as (client, core):
        async with client.open_stream("r", [1], PARAMS) as stream:
            await core.send(StepOutputs([_out("r", 1, FinishReason.STOP)]))
            assert [d.finish_reason async for d in stream] == [FinishReason.STOP]
        async with client.open_stream("bad", [1], PARAMS) as stream:
            await core.send(RequestFailed("bad", "the prompt is empty"))
            with pytest.raises(EngineError, match="the prompt is empty"):
                await stream.__anext__()
        assert [type(await core.receive()) for _ in range(2)] == [AddRequest, AddRequest]
    # ``connected`` checked that the next thing the core heard was the Shutdown


@pytest.mark.parametrize("how", ["fatal", "eof", "garbage"])
async def test_a_core_failure_fails_every_open_stream(how: str, autojump_clock: Clock) -> None:
    async with connected() as (client, core), \
            client.open_stream("a", [1], PARAMS) as a, client.open_stream("b", [1], PARAMS) as b:
        await core.send(StepOutputs([_out("a", 1)]))
        assert (await a.__anext__()).token_ids == [1]
        if how == "fatal":
            await core.send(Fatal("CUDA error: an illegal memory access"))
        elif how == "eof":
            await core.exit()
        else:
            await core.to_client.send_all(b"\x00\x00\x00\x03abc")
        for stream in (a, b):
            with pytest.raises(EngineError):
                await stream.__anext__()
        assert client.state is ClientState.FAILED and not client.healthy
        with pytest.raises(EngineUnavailable):
            async with client.open_stream("c", [1], PARAMS):
                pass
    expected = {"fatal": "illegal memory access", "eof": "exited unexpectedly",
                "garbage": "protocol error"}[how]
    assert expected in (client.failure or "")


async def test_a_pending_lora_update_fails_with_the_core(autojump_clock: Clock) -> None:
    async with connected() as (client, core), trio.open_nursery() as nursery:
        nursery.start_soon(core.send, Fatal("gone"))
        with pytest.raises(EngineUnavailable, match="gone"):
            await client.update_lora(LoadLora("op", "x", "/nowhere"))


async def test_a_lora_update_gets_its_answer(autojump_clock: Clock) -> None:
    async with connected() as (client, core), trio.open_nursery() as nursery:
        async def answer() -> None:
            op = await core.receive()
            assert isinstance(op, LoadLora)
            await core.send(LoraUpdated("other-op"), LoraUpdated(op.op_id, "bad adapter"))

        nursery.start_soon(answer)
        assert await client.update_lora(LoadLora("op", "x", "/nowhere")) == "bad adapter"


async def _fails_with_a_protocol_error(client: EngineClient, match: str) -> None:
    await trio.testing.wait_all_tasks_blocked()
    assert client.state is ClientState.FAILED
    assert "protocol error" in (client.failure or "") and match in (client.failure or "")


async def test_a_second_ready_is_a_protocol_error(autojump_clock: Clock) -> None:
    async with connected() as (client, core):
        await core.send(READY)
        await _fails_with_a_protocol_error(client, "unexpected Ready")


async def test_an_output_after_the_core_ended_the_request_is_a_protocol_error(
        autojump_clock: Clock) -> None:
    async with connected() as (client, core), client.open_stream("r", [1], PARAMS) as stream:
        await core.send(StepOutputs([_out("r", 1, FinishReason.LENGTH)]),
                        StepOutputs([_out("r", 2)]))
        await _fails_with_a_protocol_error(client, "after the core ended it")
        with pytest.raises(EngineError, match="protocol error"):
            await stream.__anext__()


async def test_outputs_for_a_request_left_before_the_core_read_its_abort_are_ignored(
        autojump_clock: Clock) -> None:
    async with connected() as (client, core):
        async with client.open_stream("r", [1], PARAMS):
            pass
        # In flight when the core read the Abort: a step's output, then its failure report.
        await core.send(StepOutputs([_out("r", 1)]), RequestFailed("r", "broke", False),
                        Stats(0, 0, 0.0, 0, 1))
        await trio.testing.wait_all_tasks_blocked()
        assert client.state is ClientState.READY
        assert client.statistics().stats == Stats(0, 0, 0.0, 0, 1)
        assert [type(await core.receive()) for _ in range(2)] == [AddRequest, Abort]


async def test_anything_but_ready_first_is_a_protocol_error(autojump_clock: Clock) -> None:
    to_core_send, _to_core_recv = trio.testing.memory_stream_one_way_pair()
    from_core_send, from_core_recv = trio.testing.memory_stream_one_way_pair()
    client = EngineClient()
    await from_core_send.send_all(encode_frame([Stats(0, 0, 0.0, 0, 0)]))
    with pytest.raises(EngineUnavailable, match=r"protocol error.*Stats before Ready"):
        await client.run(to_core_send, from_core_recv)
    assert client.state is ClientState.FAILED


async def test_a_core_that_never_gets_ready_times_out(autojump_clock: Clock) -> None:
    to_core_send, _to_core_recv = trio.testing.memory_stream_one_way_pair()
    _from_core_send, from_core_recv = trio.testing.memory_stream_one_way_pair()
    client = EngineClient(startup_timeout=30.0)
    start = trio.current_time()
    with pytest.raises(EngineUnavailable, match="did not start in time"):
        await client.run(to_core_send, from_core_recv)
    assert trio.current_time() - start == pytest.approx(30.0)


async def test_closing_a_starting_client_stops_its_start(autojump_clock: Clock) -> None:
    to_core_send, to_core_recv = trio.testing.memory_stream_one_way_pair()
    from_core_send, from_core_recv = trio.testing.memory_stream_one_way_pair()
    core = FakeCore(from_core_send, to_core_recv)
    client = EngineClient(startup_timeout=600.0)

    async def the_core() -> None:
        assert await core.receive() == Shutdown()
        await core.exit()

    start = trio.current_time()
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(the_core)
            client.close()
            with pytest.raises(EngineUnavailable, match="closed"):
                await client.run(to_core_send, from_core_recv)
    assert trio.current_time() - start < 1.0  # not the startup timeout
    assert client.state is ClientState.CLOSED


def test_a_closed_client_cannot_be_made_ready_again() -> None:
    client = EngineClient()
    client.close()
    with pytest.raises(RuntimeError, match="closed -> ready"):
        client._transition(ClientState.READY)

"""The frontend's side of the engine protocol, over any pair of trio byte streams.

One reader task fans the core's frames out to per-request buffers; one writer task owns the
stream towards the core. Every request lives inside ``async with client.open_stream(...)``:
leaving that block for any reason, cancellation included, queues an ``Abort`` with
``send_nowait`` (no ``await``, so a cancel can never skip it) unless the core already said the
request finished. That is the whole of the "a disconnect frees KV blocks" guarantee.

What the core may send depends on the client's state: only ``Ready`` (or ``Fatal``) while
starting, never a second ``Ready``, nothing for a request after it said the request ended.
Anything else is a protocol error, which fails the client. Outputs for a request id with no
open stream are not: the core may still be running a request whose stream was left, until it
reads the ``Abort`` (nothing tells the client when it has).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

from izh_trio.frontend.request_stream import Notifier, RequestStream
from izh_trio.wire import (
    Abort,
    AddRequest,
    Fatal,
    FrameDecoder,
    LoadLora,
    LoraUpdated,
    ProtocolError,
    Ready,
    RequestFailed,
    SamplingParams,
    Shutdown,
    Stats,
    StepOutputs,
    ToCore,
    UnloadLora,
    encode_frame,
)

log = logging.getLogger(__name__)


class ClientState(enum.Enum):
    """STARTING -> READY -> (FAILED | CLOSED); STARTING -> (FAILED | CLOSED) too."""

    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    CLOSED = "closed"


_NEXT: dict[ClientState, frozenset[ClientState]] = {
    ClientState.STARTING: frozenset({ClientState.READY, ClientState.FAILED,
                                     ClientState.CLOSED}),
    ClientState.READY: frozenset({ClientState.FAILED, ClientState.CLOSED}),
    ClientState.FAILED: frozenset(),
    ClientState.CLOSED: frozenset(),
}


class EngineUnavailable(Exception):
    """The core is not (or no longer) able to take requests."""


@attrs.frozen
class ClientStatistics:
    state: ClientState
    #: The core's latest report; None until its first.
    stats: Stats | None


class EngineClient:
    def __init__(self, *, startup_timeout: float = 600.0, max_buffered_tokens: int = 1 << 16,
                 stream_interval: int = 1) -> None:
        self.startup_timeout = startup_timeout
        self.max_buffered_tokens = max_buffered_tokens
        self.stream_interval = stream_interval
        self.state = ClientState.STARTING
        self.ready: Ready | None = None
        self.stats: Stats | None = None
        self.failure: str | None = None
        self._streams: dict[str, RequestStream] = {}
        #: LoRA updates awaiting the core's answer: op id -> (done, [its error, or None]).
        self._lora_ops: dict[str, tuple[trio.Event, list[str | EngineUnavailable | None]]] = {}
        self._to_core_send, self._to_core_recv = trio.open_memory_channel[ToCore](math.inf)
        self._started = trio.Event()  # set on leaving STARTING
        self._scope: trio.CancelScope | None = None

    # ------------------------------------------------------------------ lifecycle
    async def run(self, to_core: trio.abc.SendStream, from_core: trio.abc.ReceiveStream, *,
                  task_status: trio.TaskStatus[EngineClient] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Wait for Ready, then serve until closed or the core fails; closes both streams.
        Started (with this client) once ready; raises :class:`EngineUnavailable` if never."""
        started = False
        try:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                nursery.start_soon(self._write_loop, to_core)
                nursery.start_soon(self._read_loop, from_core)
                with trio.move_on_after(self.startup_timeout):
                    await self._started.wait()
                if self.state is ClientState.READY:
                    started = True
                    task_status.started(self)
                else:
                    self._fail("the engine core did not start in time")
        except Exception as exc:  # a bug in a stream task: nothing this client says is trusted
            log.exception("engine client task failed")
            self._fail(f"engine client error: {exc!r}")
        if not started:
            raise EngineUnavailable(self.failure or f"the engine is {self.state.value}")

    def close(self) -> None:
        """Ask the core to stop; ``run`` returns once it has closed its stream."""
        if self.state in (ClientState.STARTING, ClientState.READY):
            self._transition(ClientState.CLOSED)
            self._queue(Shutdown())
            self._to_core_send.close()
            self._fail_streams("the server is shutting down")

    def _transition(self, new: ClientState) -> None:
        if new not in _NEXT[self.state]:
            raise RuntimeError(f"engine client: no transition {self.state.value} -> {new.value}")
        self.state = new
        self._started.set()

    def _fail(self, message: str) -> None:
        if self.state in (ClientState.FAILED, ClientState.CLOSED):
            return
        log.error("engine core failed: %s", message)
        self._transition(ClientState.FAILED)
        self.failure = message
        self._to_core_send.close()
        self._fail_streams(message)
        if self._scope is not None:  # stop the stream tasks: closing the pipe ends the core
            self._scope.cancel()

    def _fail_streams(self, message: str) -> None:
        for stream in self._streams.values():
            stream.fail(message)
        for done, result in self._lora_ops.values():
            result.append(EngineUnavailable(message))
            done.set()

    @property
    def healthy(self) -> bool:
        return self.state is ClientState.READY

    def statistics(self) -> ClientStatistics:
        return ClientStatistics(self.state, self.stats)

    # ------------------------------------------------------------------ stream tasks
    def _queue(self, msg: ToCore) -> None:
        # A closed channel means the core is gone: there is nothing left to tell it.
        with contextlib.suppress(trio.ClosedResourceError):
            self._to_core_send.send_nowait(msg)

    async def _write_loop(self, stream: trio.abc.SendStream) -> None:
        async with stream, self._to_core_recv:
            async for first in self._to_core_recv:
                batch = [first]
                while True:  # one frame for everything queued since the last write
                    try:
                        batch.append(self._to_core_recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                try:
                    frame = encode_frame(batch)
                except Exception as exc:  # checked per request already: this is a bug
                    self._fail(f"could not encode a frame for the engine core: {exc!r}")
                    return
                try:
                    await stream.send_all(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._fail("the engine core's pipe closed")
                    return

    async def _read_loop(self, stream: trio.abc.ReceiveStream) -> None:
        decoder = FrameDecoder()
        async with stream:
            while True:
                try:
                    data = await stream.receive_some(1 << 16)
                except trio.BrokenResourceError:
                    data = b""
                if not data:
                    self._fail("the engine core exited unexpectedly")
                    return
                try:
                    for msg in decoder.feed(data):
                        self._dispatch(msg)
                except ProtocolError as exc:
                    self._fail(f"protocol error from the engine core: {exc}")
                    return

    def _dispatch(self, msg: object) -> None:
        if self.state is ClientState.STARTING:
            if isinstance(msg, Ready):
                self.ready = msg
                self._transition(ClientState.READY)
            elif isinstance(msg, Fatal):
                self._fail(msg.message)
            else:
                raise ProtocolError(f"{type(msg).__name__} before Ready")
        elif self.state is not ClientState.READY:
            return  # failed, or closed: the core's last words find no listener
        elif isinstance(msg, StepOutputs):
            for out in msg.outputs:
                stream = self._streams.get(out.request_id)
                if stream is not None:  # else left already (see the module's docstring)
                    stream.push(out)
        elif isinstance(msg, Stats):
            self.stats = msg
        elif isinstance(msg, RequestFailed):
            stream = self._streams.get(msg.request_id)
            if stream is not None:
                stream.failed_in_core(msg.message, rejected=msg.rejected)
        elif isinstance(msg, LoraUpdated):
            op = self._lora_ops.get(msg.op_id)
            if op is not None:  # else its waiter was cancelled
                op[1].append(msg.error)
                op[0].set()
        elif isinstance(msg, Fatal):
            self._fail(msg.message)
        else:
            raise ProtocolError(f"unexpected {type(msg).__name__} from a ready engine core")

    # ------------------------------------------------------------------ requests
    @asynccontextmanager
    async def open_stream(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        notifier: Notifier | None = None,
    ) -> AsyncIterator[RequestStream]:
        self._check_ready()
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in flight")
        add = AddRequest(request_id, prompt_token_ids, params, priority, cache_salt, lora_name)
        try:  # a message that can't be encoded must fail this request, not the pipe
            encode_frame([add])
        except (ProtocolError, ValueError, TypeError, OverflowError) as exc:
            raise ValueError(f"the request cannot be sent to the engine: {exc}") from exc
        stream = RequestStream(request_id, len(prompt_token_ids), self.max_buffered_tokens,
                               notifier or Notifier(),
                               abort=lambda: self._queue(Abort((request_id,))),
                               interval=self.stream_interval)
        self._streams[request_id] = stream
        self._queue(add)
        try:
            yield stream
        finally:
            # No await here, and none before it: a cancellation cannot skip the abort.
            del self._streams[request_id]
            stream.abort()

    async def update_lora(self, op: LoadLora | UnloadLora) -> str | None:
        """Send a LoRA load or unload; the core's error, or None once it is done."""
        self._check_ready()
        done, result = self._lora_ops[op.op_id] = (trio.Event(), [])
        try:
            self._queue(op)
            await done.wait()
        finally:
            del self._lora_ops[op.op_id]
        if isinstance(result[0], EngineUnavailable):
            raise result[0]
        return result[0]

    def _check_ready(self) -> None:
        if self.state is not ClientState.READY:
            raise EngineUnavailable(self.failure or f"the engine is {self.state.value}")

"""The frontend's handle on the engine core process.

One reader task fans the core's frames out to per-request buffers; one writer task owns the
pipe towards the core. Every request lives inside ``async with client.open_stream(...)``:
leaving that block for any reason, cancellation included, queues an ``Abort`` with
``send_nowait`` (no ``await``, so a cancel can never skip it) unless the core already said the
request finished. That is the whole of the "a disconnect frees KV blocks" guarantee.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import math
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

from izh_trio.frontend.request_stream import Notifier, RequestStream
from izh_trio.wire import (
    Abort,
    AddRequest,
    EngineConfig,
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
from izh_trio.wire.codec import converter

log = logging.getLogger(__name__)


class ClientState(enum.Enum):
    """STARTING -> READY -> (FAILED | CLOSED); STARTING -> FAILED when the core can't load."""

    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    CLOSED = "closed"


class EngineUnavailable(Exception):
    """The core is not (or no longer) able to take requests."""


@attrs.define
class ClientStatistics:
    state: ClientState
    streams_open: int
    stats: Stats | None


class EngineClient:
    def __init__(
        self,
        config: EngineConfig,
        *,
        startup_timeout: float = 600.0,
        shutdown_timeout: float = 10.0,
        max_buffered_tokens: int = 1 << 16,
        stream_interval: int = 1,
    ) -> None:
        self.config = config
        self.startup_timeout = startup_timeout
        self.shutdown_timeout = shutdown_timeout
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
        self._started = trio.Event()
        self._process: trio.Process | None = None
        self._scope: trio.CancelScope | None = None

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: trio.TaskStatus[EngineClient] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Spawn the core, wait for Ready, then serve until closed or the core dies."""
        child_in, parent_out = os.pipe()
        parent_in, child_out = os.pipe()
        cmd = [sys.executable, "-m", "izh_trio.engine", "--in-fd", str(child_in),
               "--out-fd", str(child_out),
               "--config", json.dumps(converter.unstructure(self.config))]
        try:
            # A process group of its own: a terminal's Ctrl-C (sent to the foreground group)
            # reaches only the server, which drains before it stops the core; had it reached
            # the core while Python was still starting, before the core could ignore it,
            # the core would die with a fatal error mid-start.
            self._process = await trio.lowlevel.open_process(
                cmd, pass_fds=(child_in, child_out), stdin=subprocess.DEVNULL, process_group=0
            )
        finally:
            os.close(child_in)
            os.close(child_out)
        to_core = trio.lowlevel.FdStream(parent_out)
        from_core = trio.lowlevel.FdStream(parent_in)
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
                    self._fail(self.failure or "the engine core did not start in time")
        except Exception as exc:  # a bug in a pipe task: nothing this client says is trusted
            log.exception("engine client task failed")
            self._fail(f"engine client error: {exc!r}")
        finally:
            with trio.CancelScope(shield=True):
                await self._reap()
        if not started:
            raise EngineUnavailable(self.failure)

    def close(self) -> None:
        """Ask the core to stop; ``run`` returns once it has exited."""
        if self.state in (ClientState.STARTING, ClientState.READY):
            self.state = ClientState.CLOSED
            self._queue(Shutdown())
            self._to_core_send.close()
            self._fail_streams("the server is shutting down")

    async def _reap(self) -> None:
        proc = self._process
        if proc is None:
            return
        with trio.move_on_after(self.shutdown_timeout):
            await proc.wait()
        if proc.returncode is None:
            log.warning("engine core did not exit in %.0fs; killing it", self.shutdown_timeout)
            proc.send_signal(signal.SIGKILL)
            await proc.wait()

    def _fail(self, message: str) -> None:
        if self.state in (ClientState.FAILED, ClientState.CLOSED):
            return
        log.error("engine core failed: %s", message)
        self.state = ClientState.FAILED
        self.failure = message
        self._to_core_send.close()
        self._started.set()
        self._fail_streams(message)
        if self._scope is not None:  # stop the pipe tasks: closing the pipe ends the core
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
        return ClientStatistics(self.state, len(self._streams), self.stats)

    # ------------------------------------------------------------------ pipe tasks
    def _queue(self, msg: ToCore) -> None:
        # A closed channel means the core is gone: there is nothing left to tell it.
        with contextlib.suppress(trio.ClosedResourceError):
            self._to_core_send.send_nowait(msg)

    async def _write_loop(self, stream: trio.lowlevel.FdStream) -> None:
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

    async def _read_loop(self, stream: trio.lowlevel.FdStream) -> None:
        decoder = FrameDecoder()
        async with stream:
            while True:
                try:
                    data = await stream.receive_some(1 << 16)
                except trio.BrokenResourceError:
                    data = b""
                if not data:
                    self._fail(self.failure or "the engine core exited unexpectedly")
                    return
                try:
                    messages = decoder.feed(data)
                except ProtocolError as exc:
                    self._fail(f"protocol error from the engine core: {exc}")
                    return
                for msg in messages:
                    self._dispatch(msg)

    def _dispatch(self, msg: object) -> None:
        if isinstance(msg, StepOutputs):
            for out in msg.outputs:
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    stream.push(out)
        elif isinstance(msg, Stats):
            self.stats = msg
        elif isinstance(msg, RequestFailed):
            stream = self._streams.get(msg.request_id)
            if stream is not None:
                if msg.rejected:
                    stream.reject(msg.message)
                else:
                    stream.done_in_core = True
                    stream.fail(msg.message)
        elif isinstance(msg, Ready):
            self.ready = msg
            if self.state is ClientState.STARTING:
                self.state = ClientState.READY
            self._started.set()
        elif isinstance(msg, LoraUpdated):
            op = self._lora_ops.get(msg.op_id)
            if op is not None:
                op[1].append(msg.error)
                op[0].set()
        elif isinstance(msg, Fatal):
            self._fail(msg.message)
        else:
            self._fail(f"unexpected message from the engine core: {msg!r:.200}")

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
        if self.state is not ClientState.READY:
            raise EngineUnavailable(self.failure or f"the engine is {self.state.value}")
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
        if self.state is not ClientState.READY:
            raise EngineUnavailable(self.failure or f"the engine is {self.state.value}")
        done, result = self._lora_ops[op.op_id] = (trio.Event(), [])
        try:
            self._queue(op)
            await done.wait()
        finally:
            del self._lora_ops[op.op_id]
        if isinstance(result[0], EngineUnavailable):
            raise result[0]
        return result[0]

    async def wait_idle(self, timeout: float) -> Stats | None:
        """Poll until the core reports nothing running and no KV in use (tests, drain)."""
        with trio.move_on_after(timeout):
            while True:
                s = self.stats
                if s is not None and not self._streams and s.num_running == 0 \
                        and s.num_waiting == 0 and s.kv_cache_usage == 0.0:
                    return s
                await trio.sleep(0.01)
        return self.stats

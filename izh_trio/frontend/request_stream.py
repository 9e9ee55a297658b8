"""One request's view of the engine: a coalescing buffer between the reader task and a route.

The reader must never wait on one slow consumer, so ``push`` never blocks: outputs that arrive
while the route is busy (say, writing to a slow client) merge into one delta. The buffer is
bounded: a consumer that falls ``max_buffered_tokens`` behind is failed, and its abort frees
the engine's blocks. With a stream interval of N (``--stream-interval``, as vLLM's), the
route is woken for the first token, then once N tokens are waiting, and for the end: fewer,
larger SSE events for a server whose per-event cost is what limits it. Several streams (the
``n`` choices of one HTTP request) can share one :class:`Notifier`, so a single task waits
on all of them without spawning any.

A stream's :class:`StreamState` says who ended the request in the core: the core (its last
output, or a failure), or the frontend (an abort, which the core may not have read yet). The
core saying anything of a request it already ended is a protocol error.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs
import trio

from izh_trio.wire import FinishReason, ProtocolError, RequestOutput, TokenLogprobs


class EngineError(Exception):
    """This request failed in or because of the engine; ``rejected`` means it was bad input,
    ``slow_client`` that its client fell too far behind the engine."""

    def __init__(self, message: str, *, rejected: bool = False,
                 slow_client: bool = False) -> None:
        super().__init__(message)
        self.rejected = rejected
        self.slow_client = slow_client


class StreamState(enum.Enum):
    """RUNNING -> (FINISHED | ABORTED); ABORTED -> FINISHED when the core ended the request
    before it read the abort."""

    RUNNING = "running"
    FINISHED = "finished"  # the core said so: no more news will come from it
    ABORTED = "aborted"  # the frontend told the core to drop it


_NEXT: dict[StreamState, frozenset[StreamState]] = {
    StreamState.RUNNING: frozenset({StreamState.FINISHED, StreamState.ABORTED}),
    StreamState.ABORTED: frozenset({StreamState.FINISHED}),
    StreamState.FINISHED: frozenset(),
}


class Notifier:
    """A level-triggered wakeup shared by the streams of one HTTP request."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def notify(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()


@attrs.define
class Delta:
    """Everything new since the consumer last looked."""

    token_ids: list[int]
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None
    logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None
    #: With the first token: the core's queue and prefill seconds.
    first_token_timing: tuple[float, float] | None = None


class RequestStream:
    def __init__(self, request_id: str, num_prompt_tokens: int, max_buffered: int,
                 notifier: Notifier, abort: Callable[[], None], interval: int = 1) -> None:
        self.request_id = request_id
        self._max_buffered = max_buffered
        self._interval = interval
        self._taken_any = False
        self._notifier = notifier
        self._abort = abort
        self._pending = Delta([], num_prompt_tokens, 0, 0)
        self._has_news = False
        self._error: EngineError | None = None
        #: The consumer has taken the final delta (or the error).
        self.exhausted = False
        self.state = StreamState.RUNNING

    def _transition(self, new: StreamState) -> None:
        # Only the core's messages can ask for a missing transition: abort() checks first.
        if new not in _NEXT[self.state]:
            raise ProtocolError(f"request {self.request_id!r}: {new.value} after the core "
                                "ended it")
        self.state = new

    # ---------------------------------------------------------------- reader side
    def push(self, out: RequestOutput) -> None:
        if self.state is StreamState.FINISHED:
            raise ProtocolError(f"request {self.request_id!r}: an output after the core "
                                "ended it")
        p = self._pending
        p.token_ids.extend(out.new_token_ids)
        p.num_prompt_tokens = out.num_prompt_tokens
        p.num_output_tokens = out.num_output_tokens
        p.num_cached_tokens = out.num_cached_tokens
        if out.logprobs is not None:
            p.logprobs = [*(p.logprobs or ()), *out.logprobs]
        if out.prompt_logprobs is not None:
            p.prompt_logprobs = out.prompt_logprobs
        if out.first_token_timing is not None:
            p.first_token_timing = out.first_token_timing
        if out.finish_reason is not None:
            p.finish_reason = out.finish_reason
            p.stop_token_id = out.stop_token_id
            self._transition(StreamState.FINISHED)
        self._has_news = True
        if len(p.token_ids) > self._max_buffered and self.state is StreamState.RUNNING:
            self._set_error(EngineError(
                f"the client fell more than {self._max_buffered} tokens behind",
                slow_client=True))
            self.abort()
        if self._due():
            self._notifier.notify()

    def _due(self) -> bool:
        """The news is worth a wake-up: the first token, ``interval`` tokens, or the end."""
        p = self._pending
        return (not self._taken_any or len(p.token_ids) >= self._interval
                or p.finish_reason is not None)

    def failed_in_core(self, message: str, *, rejected: bool) -> None:
        """The core ended the request with an error: ``rejected`` at admission (bad input)."""
        self._transition(StreamState.FINISHED)
        self._set_error(EngineError(message, rejected=rejected))

    def fail(self, message: str) -> None:
        self._set_error(EngineError(message))

    def _set_error(self, error: EngineError) -> None:
        if self._error is None and not self.exhausted:
            self._error = error
        self._notifier.notify()

    # ---------------------------------------------------------------- route side
    def abort(self) -> None:
        """Tell the core to drop the request now (a stop string, a client gone); idempotent."""
        if self.state is StreamState.RUNNING:
            self._transition(StreamState.ABORTED)
            self._abort()

    def take_nowait(self, *, held: bool = False) -> Delta | None:
        """The news since the last call, or None; raises the stream's error once.

        ``held``: also what the stream interval is still holding back (a deadline passed)."""
        if self.exhausted:
            return None
        if self._error is not None:
            # Raised once and not kept (nor held by a local): its traceback's frames refer
            # to this stream, a reference cycle for every failed request otherwise.
            self.exhausted = True
            try:
                raise self._error
            finally:
                self._error = None
        if not self._has_news or not (held or self._due()):
            return None
        self._taken_any = True
        delta = self._pending
        self._pending = Delta([], delta.num_prompt_tokens, delta.num_output_tokens,
                              delta.num_cached_tokens)
        self._has_news = False
        self.exhausted = delta.finish_reason is not None
        return delta

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Delta:
        while True:
            delta = self.take_nowait()
            if delta is not None:
                return delta
            if self.exhausted:
                raise StopAsyncIteration
            await self._notifier.wait()

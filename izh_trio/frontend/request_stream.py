"""One request's view of the engine: a coalescing buffer between the reader task and a route.

The reader must never wait on one slow consumer, so ``push`` never blocks: outputs that arrive
while the route is busy (say, writing to a slow client) merge into one delta. The buffer is
bounded: a consumer that falls ``max_buffered_tokens`` behind is failed, and its abort frees
the engine's blocks.
"""

from __future__ import annotations

import attrs
import trio

from izh_trio.wire import FinishReason, RequestOutput


class EngineError(Exception):
    """This request failed in or because of the engine; ``rejected`` means it was bad input."""

    def __init__(self, message: str, *, rejected: bool = False) -> None:
        super().__init__(message)
        self.rejected = rejected


@attrs.define
class Delta:
    """Everything new since the consumer last looked."""

    token_ids: list[int]
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    finish_reason: FinishReason | None


class RequestStream:
    def __init__(self, request_id: str, num_prompt_tokens: int, max_buffered: int) -> None:
        self.request_id = request_id
        self._max_buffered = max_buffered
        self._pending = Delta([], num_prompt_tokens, 0, 0, None)
        self._has_news = False
        self._wakeup = trio.Event()
        self._error: EngineError | None = None
        self._consumed_final = False
        #: True once the core reported the request finished (no Abort needed then).
        self.done_in_core = False

    # ---------------------------------------------------------------- reader side
    def push(self, out: RequestOutput) -> None:
        p = self._pending
        p.token_ids.extend(out.new_token_ids)
        p.num_prompt_tokens = out.num_prompt_tokens
        p.num_output_tokens = out.num_output_tokens
        p.num_cached_tokens = out.num_cached_tokens
        if out.finish_reason is not None:
            p.finish_reason = out.finish_reason
            self.done_in_core = True
        self._has_news = True
        if len(p.token_ids) > self._max_buffered and not self.done_in_core:
            self.fail(f"the client fell more than {self._max_buffered} tokens behind")
        self._wakeup.set()

    def reject(self, message: str) -> None:
        self.done_in_core = True
        self._set_error(EngineError(message, rejected=True))

    def fail(self, message: str) -> None:
        self._set_error(EngineError(message))

    def _set_error(self, error: EngineError) -> None:
        if self._error is None:
            self._error = error
        self._wakeup.set()

    # ---------------------------------------------------------------- route side
    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Delta:
        while True:
            if self._error is not None:
                raise self._error
            if self._has_news:
                delta = self._pending
                self._pending = Delta([], delta.num_prompt_tokens, delta.num_output_tokens,
                                      delta.num_cached_tokens, None)
                self._has_news = False
                self._consumed_final = delta.finish_reason is not None
                return delta
            if self._consumed_final:
                raise StopAsyncIteration
            self._wakeup = trio.Event()
            await self._wakeup.wait()

"""The engine side of one HTTP request: its ``n`` choices, from engine streams to text deltas.

Every choice is an engine request opened in one ``AsyncExitStack``: leaving
:func:`open_generation` for any reason (finished, error, disconnect, deadline) leaves every
``open_stream`` block and so aborts whatever is still running. The choices share one
:class:`Notifier`, so one task serves them all and no task is spawned per request.

A deadline is a ``trio.move_on_at`` around each wait: when it fires, the choices still
running end with ``finish_reason: "length"`` and the block is left, which aborts them.
"""

from __future__ import annotations

import enum
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import trio

from izh_trio.frontend import access_log
from izh_trio.frontend.engine_client import EngineClient, EngineUnavailable
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation_registry import Registry
from izh_trio.frontend.metrics import Metrics, RequestMetrics
from izh_trio.frontend.request_stream import EngineError, Notifier, RequestStream
from izh_trio.frontend.stop import StopChecker
from izh_trio.frontend.tokenizer import ModelTokenizer
from izh_trio.wire import SamplingParams, TokenLogprobs


class EndCause(enum.Enum):
    """Why a generation ended (its trace says): the engine finished every choice, or what
    stopped it. ``Generation.end_cause`` is None for one left before it ended."""

    FINISHED = "finished"
    STOP_STRING = "stop_string"
    DEADLINE = "deadline"
    DRAIN = "drain"
    SLOW_CLIENT = "slow_client"
    ENGINE_ERROR = "engine_error"
    REJECTED = "rejected"


@attrs.frozen
class Totals:
    """A generation's token counts as usage counts them, and its choices' finish reasons."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reasons: list[str]


@attrs.frozen
class ChoiceSpec:
    index: int
    prompt_ids: list[int]
    params: SamplingParams
    #: Which of the request's prompts this choice samples: usage counts each prompt once.
    prompt_index: int = 0
    stop: tuple[str, ...] = ()
    include_stop_str: bool = False
    skip_special_tokens: bool = True
    #: Special tokens shown even when skipping them: the markers an output parser reads.
    keep_special: frozenset[int] = frozenset()


@attrs.define
class ChoiceDelta:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None
    prompt_logprobs: tuple[TokenLogprobs, ...] | None
    finish_reason: str | None
    stop_reason: str | int | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    first: bool


class _Choice:
    def __init__(self, spec: ChoiceSpec, stream: RequestStream, tokenizer: ModelTokenizer
                 ) -> None:
        self.spec = spec
        self.stream = stream
        self.detok = tokenizer.detokenizer(spec.skip_special_tokens, spec.keep_special)
        self.stop = StopChecker(spec.stop, spec.include_stop_str)
        self.done = False
        self.reason: str | None = None
        self.started = False
        self.first: float | None = None  # time.monotonic() of its first output
        self.last: float | None = None
        self.counts = (len(spec.prompt_ids), 0, 0)  # prompt, output, cached tokens so far
        self.timing: tuple[float, float] | None = None  # the core's queue and prefill seconds

    def take(self, metrics: RequestMetrics, arrival: float, *, expiring: bool = False
             ) -> ChoiceDelta | None:
        """What arrived since the last call, as a delta; None if nothing is due yet.

        ``expiring``: the deadline passed. Whatever the stream holds is taken, and the choice
        ends with ``"length"`` unless the engine finished it first."""
        delta = self.stream.take_nowait(held=expiring)
        if delta is None:
            return None
        now = time.monotonic()
        if self.last is None:
            self.first = now
            metrics.ttft.observe(now - arrival)
            access_log.note_first_token(now - arrival)
            self.timing = delta.first_token_timing
        else:
            metrics.itl.observe(now - self.last)
        self.last = now
        finished = delta.finish_reason
        shown, stop_token = delta.token_ids, delta.stop_token_id
        if stop_token is not None and not self.spec.include_stop_str:
            shown = shown[:-1]  # the eos or stop token itself is not part of the text
        final = finished is not None or expiring
        text = self.detok.push(shown) + (self.detok.finish() if final else "")
        text = self.stop.push(text, final=final)
        reason: str | None = (finished.value if finished is not None
                              else "length" if expiring else None)
        # Like vLLM: stop_reason names the request's own stop token, not the eos.
        stop_reason: str | int | None = (
            stop_token if stop_token in self.spec.params.stop_token_ids else None)
        if self.stop.matched is not None:
            self.stream.abort()  # now, not when the HTTP request ends
            reason, stop_reason = "stop", self.stop.matched
        self.counts = (delta.num_prompt_tokens, delta.num_output_tokens,
                       delta.num_cached_tokens)
        return self._delta(text, delta.token_ids, delta.logprobs, delta.prompt_logprobs,
                           reason, stop_reason, metrics, now - arrival)

    def expire(self, metrics: RequestMetrics, arrival: float) -> ChoiceDelta:
        """The deadline passed: end with what was generated (and any held-back text)."""
        delta = self.take(metrics, arrival, expiring=True)
        self.stream.abort()
        if delta is not None:
            return delta
        return self._delta(self.stop.push(self.detok.finish(), final=True), [], None, None,
                           "length", None,
                           metrics, time.monotonic() - arrival)

    def _delta(self, text: str, token_ids: list[int], logprobs: list[TokenLogprobs] | None,
               prompt_logprobs: tuple[TokenLogprobs, ...] | None, reason: str | None,
               stop_reason: str | int | None, metrics: RequestMetrics, elapsed: float
               ) -> ChoiceDelta:
        first, self.started = not self.started, True
        if reason is not None:
            self.done, self.reason = True, reason
            metrics.ended(reason, elapsed, self.counts, self.timing, None if
                          self.first is None else time.monotonic() - self.first)
        return ChoiceDelta(self.spec.index, text, token_ids, logprobs, prompt_logprobs, reason,
                           stop_reason, *self.counts, first)


class Generation:
    def __init__(self, choices: list[_Choice], notifier: Notifier, metrics: Metrics,
                 arrival: float, deadline: float) -> None:
        self._choices = choices
        self._notifier = notifier
        # the served model's series, bound at start: looked up here once, not per token
        self._metrics = metrics.requests
        self._arrival = arrival
        self._deadline = deadline  # trio time; inf: none
        self._aborted: str | None = None
        self._cause: EndCause | None = None  # a cause the frontend met (see end_cause)

    @property
    def finished(self) -> bool:
        """Every choice has ended: the next :meth:`next` returns ``[]`` without waiting."""
        return all(c.done for c in self._choices)

    @property
    def end_cause(self) -> EndCause | None:
        """Why it ended so far: None while a choice runs (or when left before the end)."""
        if self._cause is not None or not self.finished:
            return self._cause
        stopped = any(c.stop.matched is not None for c in self._choices)
        return EndCause.STOP_STRING if stopped else EndCause.FINISHED

    @property
    def first_token(self) -> tuple[float, tuple[float, float] | None] | None:
        """When its first output arrived (``time.monotonic()``), with the core's queue and
        prefill seconds for it; None before one did."""
        firsts = [(c.first, c.timing) for c in self._choices if c.first is not None]
        return min(firsts, key=lambda first: first[0], default=None)

    def abort(self, reason: str) -> None:
        """Fail this generation from outside (server drain); the route sees a 503."""
        self._aborted = reason
        self._notifier.notify()

    def totals(self) -> Totals:
        """Its totals so far, counted as usage counts them: a prompt its ``n`` samples share
        once, with its first sample's cache hits."""
        firsts = {c.spec.prompt_index: c for c in reversed(self._choices)}.values()
        return Totals(prompt_tokens=sum(c.counts[0] for c in firsts),
                      completion_tokens=sum(c.counts[1] for c in self._choices),
                      cached_tokens=sum(c.counts[2] for c in firsts),
                      finish_reasons=[c.reason for c in self._choices if c.reason is not None])

    def close(self) -> None:
        """It is left: count, once, the request's parameters and what cut it short
        (``settled``), then hand the access log its totals."""
        cause, first = self.end_cause, self._choices[0].spec
        self._metrics.settled(
            cause.value if cause is not None else None,
            [(*c.counts, c.done) for c in self._choices],
            sum(c.spec.prompt_index == first.prompt_index for c in self._choices),
            first.params.max_tokens)
        totals = self.totals()
        access_log.note_generation(
            prompt_tokens=totals.prompt_tokens, completion_tokens=totals.completion_tokens,
            cached_tokens=totals.cached_tokens, finish_reasons=totals.finish_reasons)

    async def next(self) -> list[ChoiceDelta]:
        """The deltas that arrived since the last call; an empty list once every choice ended."""
        expired = False
        while True:
            if self._aborted is not None:
                self._cause = EndCause.DRAIN
                raise access_log.noted(APIError(503, self._aborted))
            try:
                if expired:
                    return [c.expire(self._metrics, self._arrival) for c in self._choices
                            if not c.done]
                out = [d for c in self._choices if not c.done
                       and (d := c.take(self._metrics, self._arrival)) is not None]
            except EngineError as exc:
                self._cause = (EndCause.REJECTED if exc.rejected else EndCause.SLOW_CLIENT
                               if exc.slow_client else EndCause.ENGINE_ERROR)
                if exc.rejected:
                    raise access_log.noted(APIError(400, str(exc))) from None
                raise access_log.noted(
                    APIError(500, f"the request failed in the engine: {exc}")) from None
            if out or self.finished:
                return out
            if self._deadline == math.inf:  # no deadline: skip the cancel scope (hot path)
                await self._notifier.wait()
                continue
            with trio.move_on_at(self._deadline):
                await self._notifier.wait()
                continue
            expired, self._cause = True, EndCause.DEADLINE


@attrs.frozen
class GenerationPlan:
    """Everything one HTTP request asks of the engine, decided before any byte is sent."""

    specs: Sequence[ChoiceSpec]
    arrival: float  # time.monotonic() when the request came in
    priority: int = 0
    cache_salt: str | None = None
    deadline: float = math.inf  # trio time
    lora_name: str | None = None


@attrs.frozen
class GenerationContext:
    """What opening a generation needs of the server: taken when it is opened, since a
    respawned engine core comes with a new client."""

    client: EngineClient
    tokenizer: ModelTokenizer
    metrics: Metrics
    registry: Registry


@asynccontextmanager
async def open_generation(context: GenerationContext, plan: GenerationPlan
                          ) -> AsyncIterator[Generation]:
    notifier = Notifier()
    base = uuid.uuid4().hex
    async with AsyncExitStack() as stack:
        choices = []
        for spec in plan.specs:
            try:
                stream = await stack.enter_async_context(context.client.open_stream(
                    f"{base}-{spec.index}", spec.prompt_ids, spec.params,
                    priority=plan.priority, cache_salt=plan.cache_salt,
                    lora_name=plan.lora_name, notifier=notifier))
            except EngineUnavailable as exc:
                raise APIError(503, f"the engine is unavailable: {exc}") from None
            except ValueError as exc:
                raise access_log.noted(APIError(400, str(exc))) from None
            choices.append(_Choice(spec, stream, context.tokenizer))
        generation = Generation(choices, notifier, context.metrics, plan.arrival,
                                plan.deadline)
        context.registry.add(generation)
        stack.callback(context.registry.discard, generation)
        stack.callback(generation.close)
        yield generation

"""What each API implements for the serving pipeline: a request becomes a :class:`Job`, whose
:class:`Output` says the generation's deltas in the API's own format.

The pipeline (``serving.pipeline``) owns everything around them: reading the body,
admission, the deadline, the engine requests and their abort, the answer's head, the
stream's batching of events into writes, its in-band errors. An API adds a translator (its
parsed body to a :class:`Job`) and an :class:`Output`; nothing else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import attrs
from quart import Response

from izh_trio.frontend.admission import Ticket
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import ChoiceDelta, ChoiceSpec, GenerationPlan

#: What a route answers: a JSON body, or a response (a stream).
Answer = Response | dict[str, Any]


@attrs.frozen
class Head:
    """What every answer of one request carries, decided once it is admitted."""

    id: str  # the X-Request-Id the client gave (echoed back), or a fresh one
    created: int  # Unix seconds
    model: str  # the model id the answer reports: the base model or a LoRA adapter
    fingerprint: str  # system_fingerprint: the backend configuration


class Output(Protocol):
    """One request's answer as an API says it, fed the generation's deltas in order.

    A non-streamed answer is :meth:`add` for each delta, then :meth:`body`. A streamed one is
    :meth:`opening`, :meth:`stream` for each delta, then :meth:`closing`, or, once the
    stream has begun and something fails, :meth:`failing`. The streamed methods append
    server-sent events (whole ones, as bytes) to ``events``: the pipeline writes what a
    wake-up of the generation gathered in one write, so a stream's last events, its
    closing ones included, go out together."""

    def add(self, delta: ChoiceDelta) -> None: ...

    def body(self) -> dict[str, Any]: ...

    def opening(self, events: list[bytes]) -> None: ...

    def stream(self, delta: ChoiceDelta, events: list[bytes]) -> None: ...

    def closing(self, events: list[bytes]) -> None: ...

    def failing(self, error: APIError, events: list[bytes]) -> None: ...


@attrs.frozen
class Keepalive:
    """An event a stream sends after ``interval`` seconds without one (a long prompt, a slow
    batch), so that a client or a proxy does not take the quiet for a dead connection."""

    interval: float
    event: bytes


@attrs.frozen(kw_only=True)
class Job:
    """A request translated: what to ask of the engine, and how to answer."""

    specs: Sequence[ChoiceSpec]
    model: str  # the model id the answer reports
    lora: str | None  # the LoRA adapter to run (None: the base model)
    priority: int = 0
    cache_salt: str | None = None
    stream: bool = False
    id_prefix: str  # of a fresh request id: "chatcmpl-", "cmpl-"
    output: Callable[[Head], Output]
    #: Awaited once the answer is complete, before its end is sent (a response is stored),
    #: with the error that ended it if one did (a non-streamed answer then raises it after).
    finish: Callable[[APIError | None], Awaitable[None]] | None = None
    #: Runs the generation away from the request and answers at once (a background
    #: response); it owns the admission ticket it is given.
    detach: Callable[[GenerationPlan, Ticket, Output], Awaitable[Answer]] | None = None
    keepalive: Keepalive | None = None  # for a stream: what it sends when quiet


class Tally:
    """A generation's token counts as usage counts them: a prompt that ``n`` samples share
    once, with its first sample's cache hits; every sample's output."""

    def __init__(self, specs: Sequence[ChoiceSpec]) -> None:
        firsts: dict[int, ChoiceSpec] = {}
        for spec in specs:
            firsts.setdefault(spec.prompt_index, spec)
        self._firsts = [spec.index for spec in firsts.values()]
        self.prompt_tokens = sum(len(spec.prompt_ids) for spec in firsts.values())
        self._output = [0] * len(specs)  # by choice index
        self._cached = [0] * len(specs)

    def add(self, delta: ChoiceDelta) -> None:
        self._output[delta.index] = delta.num_output_tokens
        self._cached[delta.index] = delta.num_cached_tokens

    @property
    def completion_tokens(self) -> int:
        return sum(self._output)

    @property
    def cached_tokens(self) -> int:
        return sum(self._cached[i] for i in self._firsts)

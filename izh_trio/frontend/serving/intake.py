"""Reading a generation request: the server that takes it, its body, the model and LoRA
adapter it names, its id, its deadline and its output constraint."""

from __future__ import annotations

import math
import time
import uuid
from typing import Any, Generic, TypeVar

import attrs
import trio
from quart import Quart, Request, current_app, g, request

from izh_trio.frontend import heap, json_input
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.grammar_check import check_grammar
from izh_trio.frontend.grammar_pool import (
    GrammarBusy,
    GrammarCrashed,
    GrammarTimeout,
    GrammarUnavailable,
)
from izh_trio.frontend.grammar_worker import Parsed
from izh_trio.frontend.schemas import parse_body
from izh_trio.frontend.server import Server, ServerState
from izh_trio.frontend.structured import Constraint

R = TypeVar("R", bound=attrs.AttrsInstance)  # a request schema (schemas.parse_body)

REQUEST_ID_HEADER = "X-Request-Id"
TIMEOUT_HEADER = "X-Request-Timeout"
#: A body this large is parsed by a worker process (``grammar_worker``), off the event loop.
_BIG_BODY = 1 << 20
#: The top-level fields of every API whose content is rendered into the prompt. In them, a
#: text longer than any prompt that fits, or an array or object of more members than the
#: context has tokens (each token id, message, part or tool takes one at least), cannot be
#: used: the parse worker reports it by its size rather than send megabytes back to be
#: decoded on the event loop (a 30 MB string held it 20-100 ms, 7 M token ids ~0.9 s).
PROMPT_FIELDS = ("prompt", "messages", "input", "instructions", "system", "tools",
                 "functions")


@attrs.frozen
class Intake(Generic[R]):
    """A generation request as read: the server serving it, when it came, its body."""

    server: Server
    arrival: float  # time.monotonic() when the route began
    body: dict[str, Any]  # the JSON object, for fields its schema leaves raw
    req: R  # the body parsed by the API's schema


async def read_request(schema: type[R]) -> Intake[R]:
    """The current request, read (its arrival first: the time to first token counts from
    here), with its body parsed by ``schema`` (or a 400, or a 503 while not serving)."""
    arrival = time.monotonic()
    server = server_of(current_app)
    body = await json_body(request)
    return Intake(server, arrival, body, parse_body(schema, body))


def server_of(app: Quart) -> Server:
    server: Server = app.extensions["izh"]
    if server.state is ServerState.DRAINING:
        raise APIError(503, "the server is shutting down", headers={"Retry-After": "1"})
    if not server.serving():
        failure = server.client.failure if server.client else None
        raise APIError(503, f"the engine is unavailable ({failure or server.state.value})",
                       headers={"Retry-After": "1"})
    return server


async def json_body(request: Request) -> Any:
    """The request's JSON body: every route reads its body here, and every way a body can
    fail to parse (syntax, encoding, lone surrogates, huge numbers, NaN, nesting) is a 400
    naming the problem and, where known, the top-level field (``json_input``)."""
    chunks = [chunk async for chunk in request.body]  # as they arrive; quart bounds them
    if sum(map(len, chunks)) > _BIG_BODY:
        # orjson holds the GIL for the whole parse: parsed by a worker, the chunks sent on as
        # they are, never joined here (a fresh buffer of megabytes costs the loop its page
        # faults)
        server = server_of(current_app)
        limit = server.ready.max_model_len
        parsed = await _parsed_by_a_worker(chunks, server.prompt_size.longest(limit), limit)
        del chunks  # megabytes of small buffers, now free in the heap: give them back
        await trio.to_thread.run_sync(heap.trim)
        if parsed.too_long is not None:
            raise server.prompt_size.size_error(parsed.too_long, parsed.too_long_kind, limit,
                                                parsed.field)
        if parsed.error is not None:
            raise APIError(400, f"the request body is not valid JSON: {parsed.error}",
                           param=parsed.field)
        return parsed.value
    raw = b"".join(chunks)
    try:
        return json_input.loads(raw)
    except json_input.JSONInputError as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc.message}",
                       param=exc.field) from None


async def _parsed_by_a_worker(chunks: list[bytes], longest: int | None,
                              most_items: int) -> Parsed:
    pool = server_of(current_app).grammars
    try:
        return await pool.parse_json(chunks, PROMPT_FIELDS, longest, most_items)
    except (GrammarTimeout, GrammarCrashed):
        raise APIError(400, "the request body is too large or too complex to parse") from None
    except (GrammarBusy, GrammarUnavailable):
        raise APIError(503, "large request bodies cannot be parsed right now; retry shortly",
                       headers={"Retry-After": "1"}) from None


def served_model(server: Server, requested: str | None) -> str:
    """The base model or one of its LoRA adapters (they share its tokenizer), else a 404."""
    if requested is not None and requested != server.model_name \
            and requested not in server.loras:
        raise APIError(404, f"The model `{requested}` does not exist.", param="model",
                       code="model_not_found")
    return requested or server.model_name


def resolve_model(server: Server, model: str | None, lora: str | None) -> tuple[str, str | None]:
    """The model id a response reports and the LoRA adapter to run (None: the base model).

    ``model`` may name the base model or an adapter; the ``lora`` field names an adapter.
    Unknown names are 404s (model_not_found); two different adapters are a 400.
    """
    adapter: str | None = served_model(server, model)
    adapter = None if adapter == server.model_name else adapter
    if lora is not None:
        if lora not in server.loras:
            raise APIError(404, f"The LoRA adapter `{lora}` does not exist.", param="lora",
                           code="model_not_found")
        if adapter not in (None, lora):
            raise APIError(400, f"model names the LoRA adapter {adapter!r} but lora names "
                                f"{lora!r}", param="lora")
        adapter = lora
    return adapter or server.model_name, adapter


def request_id(request: Request, prefix: str) -> str:
    """The client's X-Request-Id (echoed back on the response), or a fresh one: ``prefix``
    and 32 hex digits."""
    given = request.headers.get(REQUEST_ID_HEADER, "").strip()
    rid = given[:256] if given else f"{prefix}{uuid.uuid4().hex}"
    g.request_id = rid
    return rid


def deadline_of(request: Request, server: Server) -> float:
    """The generation's deadline in trio time: X-Request-Timeout, else the server default."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is not None:
        try:
            timeout = float(raw)
        except ValueError:
            timeout = -1.0
        if not 0 < timeout < 1e7:
            raise APIError(400, f"{TIMEOUT_HEADER} must be a positive number of seconds",
                           param=TIMEOUT_HEADER)
    else:
        timeout = server.settings.request_timeout or math.inf
    return trio.current_time() + timeout


async def checked_constraint(server: Server, constraint: Constraint | None
                             ) -> Constraint | None:
    """The output constraint with its grammar written (its input's bounds checked: in a
    worker thread when it is big) and compiled once by a grammar worker (a subprocess: a
    grammar that crashes the library crashes it, not this process) exactly as the engine
    will compile it; or a 400 naming its field."""
    if constraint is None:
        return None
    constraint = await server.offload.run(constraint.written, size=constraint.size)
    await check_grammar(server.grammars, constraint.grammar, constraint.param)
    return constraint

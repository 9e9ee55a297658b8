"""Helpers every route needs: the server object, the JSON body, model and id checks."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from typing import Any

import attrs
import trio
from quart import Quart, Request, g

from izh_trio.frontend import request_scope
from izh_trio.frontend.admission import Ticket
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.generation import ChoiceSpec, Generation, GenerationPlan, open_generation
from izh_trio.frontend.server import Server, ServerState
from izh_trio.frontend.structured import Constraint, check_grammar
from izh_trio.wire import SamplingParams

REQUEST_ID_HEADER = "X-Request-Id"
TIMEOUT_HEADER = "X-Request-Timeout"


#: Choices (prompts x n) one request may ask for.
MAX_CHOICES = 64


def server_of(app: Quart) -> Server:
    server: Server = app.extensions["izh"]
    if server.state is ServerState.DRAINING:
        raise APIError(503, "the server is shutting down", headers={"Retry-After": "1"})
    if not server.serving():
        failure = server.client.failure if server.client else None
        raise APIError(503, f"the engine is unavailable ({failure or server.state.value})",
                       headers={"Retry-After": "1"})
    return server


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


def admit(server: Server, request: Request, specs: Sequence[ChoiceSpec]) -> Ticket:
    """Check size, take an in-flight slot, then charge the key's budget (or 400/503/429).

    The slot comes first so that a request turned away for capacity costs no budget.
    """
    if len(specs) > MAX_CHOICES:
        raise APIError(400, f"at most {MAX_CHOICES} choices (prompts x n) per request",
                       param="n")
    cost = sum(len(s.prompt_ids) + s.params.max_tokens for s in specs)
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    key = token.strip() if server.api_keys and scheme.lower() == "bearer" else (
        request.remote_addr or "anonymous")
    ticket = server.admission.admit()
    try:
        server.limiter.charge(key, cost)
    except APIError:
        ticket.release()
        raise
    return ticket


async def open_streamed(server: Server, plan: GenerationPlan, ticket: Ticket) -> Generation:
    """A streamed response's generation, opened now, in the route, and closed (aborting
    whatever still runs) when the request ends: its requests reach the engine core before
    quart starts the response (``request_scope``). The ticket is returned when the request
    ends too, right after the generation closes, however it ends: the body finished or
    failed, the client left, or the body never ran (a client gone before the status line
    went out). A generation that cannot be opened is an ordinary error response."""
    try:
        request_scope.at_exit(ticket.release)
    except RuntimeError:  # no request scope: an unwrapped app, a bug
        ticket.release()
        raise
    return await request_scope.enter(open_generation(server, plan))


async def json_body(request: Request) -> Any:
    raw = await request.get_data()
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None


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
    adapter = served_model(server, model)
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
    """The client's X-Request-Id (echoed back on the response), or a fresh one."""
    given = request.headers.get(REQUEST_ID_HEADER, "").strip()
    rid = given[:256] if given else f"{prefix}-{uuid.uuid4().hex}"
    g.request_id = rid
    return rid


async def checked_constraint(server: Server, constraint: Constraint | None
                             ) -> Constraint | None:
    """The output constraint, checked against the vocabulary (or a 400 naming its field)."""
    if constraint is not None:
        tokenizer = await trio.to_thread.run_sync(lambda: server.tokenizer.ll_tokenizer)
        check_grammar(constraint.grammar, tokenizer, constraint.param)
    return constraint


def constrained(params: SamplingParams, constraint: Constraint | None) -> SamplingParams:
    if constraint is None:
        return params
    return attrs.evolve(params, grammar=constraint.grammar)

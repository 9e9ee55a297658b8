"""The Responses API's side of the response store: its errors as HTTP answers, a request's
input as stored items, a response read back (and found orphaned), a chain as the items that
continue it, a response written and counted.

A running background response is rewritten by its owner at least every ``HEARTBEAT_S``
(``background``); one not written for ``STALE_S`` lost its owner (a killed server, a replica
gone) and is stored as failed by whoever reads it next, so none stays ``in_progress``
forever, with SQLite or Redis alike.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.response_store import (
    InvalidTransition,
    PageError,
    ResponseStatus,
    ResponseStore,
    StoredResponse,
    StoreUnavailable,
    UnknownResponse,
    conversation,
)
from izh_trio.frontend.server import Server

HEARTBEAT_S = 5.0
STALE_S = 30.0
#: Ids an input item gets when the client gave none, by type.
_PREFIXES = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_",
             "reasoning": "rs_"}


@contextmanager
def store_errors() -> Iterator[None]:
    """The store's exceptions as OpenAI's error answers: 503, 404, 400."""
    try:
        yield
    except StoreUnavailable as exc:
        raise APIError(503, f"the response store is unavailable: {exc}",
                       headers={"Retry-After": "1"}) from None
    except UnknownResponse as exc:
        raise not_found(exc.response_id) from None
    except PageError as exc:
        raise APIError(400, str(exc), param=exc.param) from None


def not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.",
                    param="response_id", code="not_found")


def store_of(server: Server) -> ResponseStore:
    if server.store is None:
        raise APIError(503, "the response store is unavailable: it could not be opened at "
                            "start (see the server's log)", headers={"Retry-After": "1"})
    return server.store


async def reachable(server: Server) -> ResponseStore:
    """The store, once it answered: a ``store: true`` request is a 503 before it generates."""
    store = store_of(server)
    with store_errors():
        await store.get("resp_reachable")
    return store


def input_items(input_: Any) -> list[dict[str, Any]]:
    """A (checked) request input as the items stored for it, each with an id."""
    if isinstance(input_, str):
        input_ = [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": input_}]}]
    items = []
    for item in input_:
        kind = item.get("type", "message")
        stored = {"id": f"{_PREFIXES.get(kind, 'item_')}{uuid.uuid4().hex}", **item,
                  "type": kind}
        if kind == "message" and isinstance(item.get("content"), str):  # as OpenAI lists it
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            stored["content"] = [{"type": part, "text": item["content"]}]
        items.append(stored)
    return items


async def load(server: Server, response_id: str) -> StoredResponse:
    """The stored response, or a 404; an orphaned running one is failed first."""
    store = store_of(server)
    with store_errors():
        record = await store.get(response_id)
        if record is None:
            raise not_found(response_id)
        if _orphaned(server, record):
            record = await _fail_orphan(store, record)
    return record


def _orphaned(server: Server, record: StoredResponse) -> bool:
    running = record.status in (ResponseStatus.QUEUED, ResponseStatus.IN_PROGRESS)
    updated = record.updated_at if record.updated_at is not None else record.created_at
    return (running and server.background.get(record.id) is None
            and time.time() - updated > STALE_S)


async def _fail_orphan(store: ResponseStore, record: StoredResponse) -> StoredResponse:
    response = {**record.response, "status": "failed", "error": {
        "code": "server_error", "message": "the server running this response stopped"}}
    try:
        return await store.put(attrs.evolve(record.advance(ResponseStatus.FAILED, response),
                                            updated_at=time.time()))
    except InvalidTransition:  # its owner (or another reader) ended it meanwhile
        return await store.get(record.id) or record


async def continued(server: Server, previous_id: str) -> list[dict[str, Any]]:
    """The items of the conversation ``previous_id`` ends (oldest first), for the turn that
    continues it; 404 for an unknown turn, 400 for one still running."""
    store = store_of(server)
    with store_errors():
        chain = await store.chain(previous_id)
    for record in chain:
        if not record.status.final:
            raise APIError(400, f"response {record.id!r} is still {record.status.value}: "
                                "continue it once it has ended", param="previous_response_id")
    return conversation(chain)


async def save(server: Server, record: StoredResponse) -> None:
    """Write a response as it stands now; counted once it ends. Raises the store's own
    errors (``InvalidTransition``: another replica ended it first)."""
    await store_of(server).put(attrs.evolve(record, updated_at=time.time()))
    if record.status.final:
        counted(server, record.status.value)


def counted(server: Server, status: str) -> None:
    server.metrics.responses.labels(status=status).inc()

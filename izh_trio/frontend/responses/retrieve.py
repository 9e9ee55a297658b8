"""The routes of stored responses: ``GET /v1/responses/{id}`` (``?stream=true``: its events),
``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items`` and ``POST
/v1/responses/{id}/cancel``, in OpenAI's shapes; an unknown, expired or deleted id is a 404.

They read the store only, so they answer while the server drains, and on any replica that
shares the store.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, current_app, request

from izh_trio.frontend import sse
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.response_store import InvalidTransition, ResponseStatus
from izh_trio.frontend.responses.follow import follow
from izh_trio.frontend.responses.stored import load, not_found, save, store_errors, store_of
from izh_trio.frontend.server import Server

_TRUE, _FALSE = ("true", "1"), ("false", "0", "")


def _server() -> Server:
    server: Server = current_app.extensions["izh"]
    return server


def _int_arg(name: str, default: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise APIError(400, f"{name} must be an integer", param=name) from None


async def retrieve(response_id: str) -> Response | dict[str, Any]:
    server = _server()
    record = await load(server, response_id)
    stream = request.args.get("stream", "false").lower()
    if stream not in _TRUE + _FALSE:
        raise APIError(400, "stream must be true or false", param="stream")
    if stream in _FALSE:
        return record.response
    if not record.response.get("background"):
        raise APIError(400, "only a background response can be streamed again; this one "
                            "was answered to its request", param="stream")
    after = _int_arg("starting_after", -1)
    return Response(follow(server, response_id, after), mimetype="text/event-stream",
                    headers=sse.HEADERS)


async def delete(response_id: str) -> dict[str, Any]:
    server = _server()
    run = server.background.get(response_id)
    if run is not None:  # stopped first, or its last write would store it again
        await run.stop()
    with store_errors():
        deleted = await store_of(server).delete(response_id)
    if not deleted:
        raise not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


async def input_items(response_id: str) -> dict[str, Any]:
    with store_errors():
        page = await store_of(_server()).input_items(
            response_id, after=request.args.get("after"), before=request.args.get("before"),
            limit=_int_arg("limit", 20), order=request.args.get("order", "desc"))
    if page is None:
        raise not_found(response_id)
    return page.to_json()


async def cancel(response_id: str) -> dict[str, Any]:
    """Cancel a background response; one already ended is answered unchanged."""
    server = _server()
    record = await load(server, response_id)
    if not record.response.get("background"):
        raise APIError(400, "only a background response can be cancelled", param="response_id")
    if record.status.final:
        return record.response
    run = server.background.get(response_id)
    if run is not None:
        await run.stop()
    else:  # another replica runs it: it sees the cancel at its next write, and stops
        response = {**record.response, "status": ResponseStatus.CANCELLED.value}
        try:
            with store_errors():
                await save(server, record.advance(ResponseStatus.CANCELLED, response))
        except InvalidTransition:
            pass  # it ended meanwhile: answered as it ended
    return (await load(server, response_id)).response


def add_routes(bp: Blueprint) -> None:
    path = "/v1/responses/<response_id>"
    bp.add_url_rule(path, "retrieve", retrieve, methods=["GET"])
    bp.add_url_rule(path, "delete", delete, methods=["DELETE"])
    bp.add_url_rule(f"{path}/input_items", "input_items", input_items, methods=["GET"])
    bp.add_url_rule(f"{path}/cancel", "cancel", cancel, methods=["POST"])

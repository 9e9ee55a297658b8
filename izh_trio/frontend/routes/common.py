"""Helpers every route needs: the server object, the JSON body, model and id checks."""

from __future__ import annotations

import json
import uuid
from typing import Any

from quart import Quart, Request, g

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.server import Server, ServerState

REQUEST_ID_HEADER = "X-Request-Id"


def server_of(app: Quart) -> Server:
    server: Server = app.extensions["izh"]
    if server.state is not ServerState.SERVING or not server.healthy():
        failure = server.client.failure if server.client else None
        raise APIError(503, f"the server is not serving ({failure or server.state.value})")
    return server


async def json_body(request: Request) -> Any:
    raw = await request.get_data()
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None


def served_model(server: Server, requested: str | None) -> str:
    if requested is not None and requested != server.model_name:
        raise APIError(404, f"The model `{requested}` does not exist.", param="model",
                       code="model_not_found")
    return server.model_name


def request_id(request: Request, prefix: str) -> str:
    """The client's X-Request-Id (echoed back on the response), or a fresh one."""
    given = request.headers.get(REQUEST_ID_HEADER, "").strip()
    rid = given[:256] if given else f"{prefix}-{uuid.uuid4().hex}"
    g.request_id = rid
    return rid


def check_salt(salt: str | None) -> None:
    if salt is not None:
        try:
            salt.encode()
        except UnicodeEncodeError:
            raise APIError(400, "cache_salt must be valid Unicode text",
                           param="cache_salt") from None

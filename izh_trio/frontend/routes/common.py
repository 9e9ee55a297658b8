"""Helpers every route needs: the server object, the JSON body, the model name check."""

from __future__ import annotations

import json
from typing import Any

from quart import Quart, Request

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.server import Server, ServerState


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

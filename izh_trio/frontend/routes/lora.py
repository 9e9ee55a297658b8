"""``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``, in vLLM's shapes.

Served only with ``--enable-lora-runtime-updates`` (a 404 otherwise, as if the routes did not
exist): loading reads files from the server's disk, which an open API should not offer. Updates
run one at a time; the adapter list changes once the engine has answered.
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs
from quart import Blueprint, Response, current_app, request

from izh_trio.frontend.engine_client import EngineUnavailable
from izh_trio.frontend.errors import APIError
from izh_trio.frontend.schemas import parse_body
from izh_trio.frontend.server import Server
from izh_trio.frontend.serving.intake import json_body, server_of
from izh_trio.wire import LoadLora, UnloadLora

bp = Blueprint("lora", __name__)


@attrs.frozen(kw_only=True)
class LoadLoraRequest:
    lora_name: str = attrs.field(validator=attrs.validators.min_len(1))
    lora_path: str = attrs.field(validator=attrs.validators.min_len(1))


@attrs.frozen(kw_only=True)
class UnloadLoraRequest:
    lora_name: str = attrs.field(validator=attrs.validators.min_len(1))


def _updatable() -> Server:
    server: Server = current_app.extensions["izh"]
    if not server.settings.enable_lora_runtime_updates:
        raise APIError(404, "LoRA runtime updates are not enabled on this server "
                            "(--enable-lora-runtime-updates)")
    return server_of(current_app)


async def _apply(server: Server, op: LoadLora | UnloadLora) -> str | None:
    try:
        if server.client is None:  # no core started yet
            raise EngineUnavailable("the engine has not started")
        return await server.client.update_lora(op)
    except EngineUnavailable as exc:
        raise APIError(503, f"the engine is unavailable: {exc}",
                       headers={"Retry-After": "1"}) from None


@bp.post("/v1/load_lora_adapter")
async def load_lora_adapter() -> Any:
    server = _updatable()
    req = parse_body(LoadLoraRequest, await json_body(request))
    async with server.lora_lock:
        if req.lora_name == server.model_name or req.lora_name in server.loras:
            raise APIError(400, f"The lora adapter '{req.lora_name}' has already been loaded.",
                           param="lora_name")
        error = await _apply(server, LoadLora(uuid.uuid4().hex, req.lora_name, req.lora_path))
        if error is not None:
            raise APIError(400, error, param="lora_path")
        server.loras[req.lora_name] = req.lora_path
    return Response(f"Success: LoRA adapter '{req.lora_name}' added successfully.",
                    mimetype="text/plain")


@bp.post("/v1/unload_lora_adapter")
async def unload_lora_adapter() -> Any:
    server = _updatable()
    req = parse_body(UnloadLoraRequest, await json_body(request))
    async with server.lora_lock:
        if req.lora_name not in server.loras:
            raise APIError(404, f"The lora adapter '{req.lora_name}' cannot be found.",
                           param="lora_name", code="model_not_found")
        error = await _apply(server, UnloadLora(uuid.uuid4().hex, req.lora_name))
        if error is not None:
            raise APIError(500, error)
        del server.loras[req.lora_name]
    return Response(f"Success: LoRA adapter '{req.lora_name}' removed successfully.",
                    mimetype="text/plain")

"""Routes about the server rather than a generation: models, health, metrics, version."""

from __future__ import annotations

import time
from importlib import resources
from typing import Any

from quart import Blueprint, Response, current_app

from izh_trio import __version__
from izh_trio.frontend.errors import error_body
from izh_trio.frontend.server import Server

bp = Blueprint("meta", __name__)

#: The served API's description: package data (``izh_trio/schemas/``), so that a wheel serves
#: it too; the checkout's top-level ``schemas`` is a link to that folder.
OPENAPI_PATH = resources.files("izh_trio") / "schemas" / "openapi.json"


def _server() -> Server:
    server: Server = current_app.extensions["izh"]
    return server


@bp.get("/v1/models")
async def models() -> Any:
    server = _server()
    ready = server.client.ready if server.client else None
    base = {"object": "model", "created": int(time.time()), "owned_by": "izh_trio",
            "max_model_len": ready.max_model_len if ready else None}
    cards = [{"id": server.model_name, **base, "root": str(server.model_dir), "parent": None}]
    cards += [{"id": name, **base, "root": path, "parent": server.model_name}
              for name, path in server.loras.items()]  # LoRA adapters of the base model
    return {"object": "list", "data": cards}


@bp.get("/health")
async def health() -> Any:
    """200 while the engine core is alive and serving; 503 tells an orchestrator to restart."""
    server = _server()
    if server.healthy():
        return {"status": "ok"}
    reason = (server.client.failure if server.client else None) or server.state.value
    return error_body(503, f"unhealthy: {reason}"), 503


@bp.get("/ready")
async def ready() -> Any:
    server = _server()
    if server.serving():
        return {"status": "ready"}
    return error_body(503, f"not ready: {server.state.value}"), 503


@bp.get("/metrics")
async def metrics() -> Response:
    return Response(_server().metrics.render(), mimetype="text/plain; version=0.0.4")


@bp.get("/openapi.json")
async def openapi() -> Response:
    return Response(OPENAPI_PATH.read_bytes(), mimetype="application/json")


@bp.get("/version")
async def version() -> Any:
    return {"version": __version__}

"""What the HTTP routes share: settings, tokenizer, engine client, metrics, lifecycle."""

from __future__ import annotations

import enum
import logging
from pathlib import Path

import trio

from izh_trio.frontend.engine_client import EngineClient
from izh_trio.frontend.metrics import Metrics
from izh_trio.frontend.settings import Settings
from izh_trio.frontend.tokenizer import ModelTokenizer
from izh_trio.wire import Ready, Stats

log = logging.getLogger(__name__)


class ServerState(enum.Enum):
    """CREATED -> STARTING -> SERVING -> STOPPED."""

    CREATED = "created"
    STARTING = "starting"
    SERVING = "serving"
    STOPPED = "stopped"


class Server:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.state = ServerState.CREATED
        self.model_dir: Path | None = None
        self.model_name = settings.served_model_name or ""
        self.tokenizer: ModelTokenizer | None = None
        self.client: EngineClient | None = None
        self.metrics = Metrics(self._stats, self.healthy)
        self._client_done = trio.Event()

    async def start(self, nursery: trio.Nursery) -> None:
        """Build or find the model, load the tokenizer, spawn the core and wait for Ready."""
        self.state = ServerState.STARTING
        self.model_dir = await trio.to_thread.run_sync(self.settings.resolve_model_dir)
        self.model_name = self.settings.model_name(self.model_dir)
        self.tokenizer = await trio.to_thread.run_sync(ModelTokenizer, self.model_dir)
        self.client = EngineClient(self.settings.engine_config(self.model_dir),
                                   startup_timeout=self.settings.startup_timeout)
        await nursery.start(self._run_client)
        self.state = ServerState.SERVING
        log.info("serving %s from %s (max_model_len %d)", self.model_name, self.model_dir,
                 self.ready.max_model_len)

    async def _run_client(self, *, task_status: trio.TaskStatus[None]) -> None:
        try:
            await self.client.run(task_status=task_status)
        finally:
            self._client_done.set()

    async def stop(self) -> None:
        self.state = ServerState.STOPPED
        if self.client is not None:
            self.client.close()
            await self._client_done.wait()

    # ------------------------------------------------------------------ views
    @property
    def ready(self) -> Ready:
        assert self.client is not None and self.client.ready is not None
        return self.client.ready

    def healthy(self) -> bool:
        return self.client is not None and self.client.healthy

    def _stats(self) -> Stats | None:
        return self.client.stats if self.client is not None else None

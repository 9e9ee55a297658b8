"""What the HTTP routes share, and the server's lifecycle.

The engine core runs under a supervisor: if it dies (or reports ``Fatal``), every in-flight
request fails at once, ``/health`` turns 503, and a fresh core is spawned after a backoff
(bounded retries). Shutdown is a drain with a deadline: ``/ready`` and new requests get 503
at once, in-flight generations get ``drain_timeout`` to finish, then the rest are failed.
"""

from __future__ import annotations

import enum
import gc
import logging
from pathlib import Path

import trio

from izh_trio.frontend import heap, tracing
from izh_trio.frontend.admission import Admission
from izh_trio.frontend.engine_client import (
    ClientState,
    ClientStatistics,
    EngineClient,
    EngineUnavailable,
)
from izh_trio.frontend.engine_process import run_core
from izh_trio.frontend.errors import innermost_message
from izh_trio.frontend.generation import GenerationContext
from izh_trio.frontend.generation_registry import Registry
from izh_trio.frontend.grammar_pool import GrammarPool, WorkerSpec
from izh_trio.frontend.limits import RateLimiter
from izh_trio.frontend.metrics import Metrics
from izh_trio.frontend.metrics_engine import ServerFacts
from izh_trio.frontend.offload import Offload
from izh_trio.frontend.prompt_size import PromptSize
from izh_trio.frontend.response_store import (
    ResponseStore,
    StoreUnavailable,
    expire_periodically,
    open_store,
)
from izh_trio.frontend.responses.runs import Runs
from izh_trio.frontend.settings import Settings
from izh_trio.frontend.tokenizer import ModelTokenizer
from izh_trio.frontend.tool_formats import HERMES, ToolFormat, choose_tool_format
from izh_trio.wire import Ready

log = logging.getLogger(__name__)

#: The cyclic collector's first generation runs once this many more container objects were
#: made than freed. CPython's 700 suits a program whose live set grows; here a step's outputs
#: and the chunks they become are made in bursts of thousands and freed milliseconds later,
#: so at 256 streams the collector ran ~190 times a second only to walk them, and the ones it
#: promoted made full collections of ~60 ms every ~0.6 s: 20-25 % of this process's CPU, and
#: each full collection a 60 ms stall of every stream. Garbage with cycles still gets
#: collected, after this many objects instead of 700, all at once: so a request or connection
#: must not leave any (``connection_cycles``; tests/e2e/test_gc.py counts what each leaves).
GC_FIRST_THRESHOLD = 50_000


class StartupError(Exception):
    """The server cannot start (a missing checkpoint, a device torch lacks, a setting the
    engine refuses); the message says which, in one line, for the operator."""


class ServerState(enum.Enum):
    """CREATED -> STARTING -> SERVING -> DRAINING -> STOPPED; any but STOPPED -> STOPPED."""

    CREATED = "created"
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    STOPPED = "stopped"


_NEXT: dict[ServerState, frozenset[ServerState]] = {
    ServerState.CREATED: frozenset({ServerState.STARTING, ServerState.STOPPED}),
    ServerState.STARTING: frozenset({ServerState.SERVING, ServerState.STOPPED}),
    ServerState.SERVING: frozenset({ServerState.DRAINING, ServerState.STOPPED}),
    ServerState.DRAINING: frozenset({ServerState.STOPPED}),
    ServerState.STOPPED: frozenset(),
}


class Server:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.state = ServerState.CREATED
        self.model_dir: Path | None = None
        self.model_name = settings.served_model_name or ""
        self._tokenizer: ModelTokenizer | None = None
        self.client: EngineClient | None = None
        self.admission = Admission(settings.max_pending)
        self.metrics = Metrics(self._engine_statistics, self.admission.statistics,
                               ServerFacts(restarts=lambda: self.engine_restarts),
                               prefix=settings.metrics_prefix)
        self.limiter = RateLimiter(settings.rate_limit_tokens_per_minute)
        self.api_keys = settings.all_api_keys()
        self.generations = Registry()  # open now: the drain fails what is left of them
        #: LoRA adapters served now, name -> path as given; runtime updates change it.
        self.loras: dict[str, str] = dict(settings.lora_modules)
        self.lora_lock = trio.Lock()  # one runtime update at a time
        self.engine_restarts = 0
        self.startup_failure: str | None = None  # why ``start`` failed, for the CLI to say
        #: Big inputs' tokenizing and rendering, off the event loop (small ones inline).
        self.offload = Offload()
        #: Which prompts are too long by their size alone (set with the tokenizer).
        self.prompt_size = PromptSize(None)
        #: The checkpoint's tool-call syntax (chosen with the tokenizer; ``tool_formats``).
        self.tool_format: ToolFormat = HERMES
        #: Where request grammars are compiled before admission (subprocesses, on demand).
        self.grammars = GrammarPool(self._grammar_spec)
        #: The Responses API's store (opened at start), the background responses running
        #: here, and the nursery they run in: the server's, not a request's.
        self.store: ResponseStore | None = None
        self.background = Runs()
        self.nursery: trio.Nursery | None = None
        self._supervisor_done = trio.Event()

    async def start(self, nursery: trio.Nursery) -> None:
        """Build or find the model, load the tokenizer, spawn the core and wait for Ready;
        any failure is a :class:`StartupError` (its cause logged at DEBUG)."""
        self._transition(ServerState.STARTING)
        try:
            await self._start(nursery)
        except Exception as exc:
            self.startup_failure = innermost_message(exc)
            log.debug("start-up failed", exc_info=True)
            raise StartupError(self.startup_failure) from None

    async def _start(self, nursery: trio.Nursery) -> None:
        self.model_dir = await trio.to_thread.run_sync(self.settings.resolve_model_dir)
        self.model_name = self.settings.model_name(self.model_dir)
        if self.model_name in self.loras:
            raise ValueError(f"LoRA adapter name {self.model_name!r} is the served model's name")
        tracing.start(self.settings.otlp_traces_endpoint, self.model_name)
        await self._open_store(nursery)
        heap.map_big_buffers()  # before the tokenizer's and requests' big allocations
        self._tokenizer = await trio.to_thread.run_sync(ModelTokenizer, self.model_dir)
        self.prompt_size = await trio.to_thread.run_sync(PromptSize.of, self.tokenizer.tokenizer)
        template = self.tokenizer.chat_template
        self.tool_format = choose_tool_format(
            self.settings.tool_call_parser, None if template is None else template.source,
            self.tokenizer.tokenizer.token_to_id)
        await nursery.start(self._supervise)
        self._tell_metrics()
        # Start-up objects (tokenizer, templates, imports) live as long as the server: keep
        # them out of every later collection, which then only walks per-request garbage.
        gc.collect()
        gc.freeze()
        threshold, *older = gc.get_threshold()
        gc.set_threshold(max(threshold, GC_FIRST_THRESHOLD), *older)
        self._transition(ServerState.SERVING)
        nursery.start_soon(self.metrics.loop_lag.watch)  # from now on: start-up is not lag
        log.info("serving %s from %s (max_model_len %d)", self.model_name, self.model_dir,
                 self.ready.max_model_len)

    def _tell_metrics(self) -> None:
        """The labels only known once the core is up: the model's name, the cache's size."""
        s = self.settings
        facts = self.metrics.facts
        facts.model_name = self.model_name
        facts.cache_config = {
            "block_size": str(s.block_size), "cache_dtype": "auto",
            "enable_prefix_caching": "True",
            "gpu_memory_utilization": str(s.gpu_memory_utilization),
            "num_gpu_blocks": str(self.ready.num_kv_blocks), "num_cpu_blocks": "0"}
        if s.lora_modules or s.enable_lora_runtime_updates:
            facts.max_lora = s.max_loras or (8 if s.enable_lora_runtime_updates
                                             else min(8, len(s.lora_modules)))
        self.metrics.bind(self.model_name)

    async def _open_store(self, nursery: trio.Nursery) -> None:
        """Open the response store and enforce its TTL and row cap in the background. A store
        the operator named must open (Redis connects on first use); the default one, in the
        cache directory, may not (a read-only home): then only stored responses are refused
        (503), and everything else is served."""
        s = self.settings
        self.nursery = nursery
        try:
            self.store = await open_store(s.response_store, s.response_store_ttl,
                                          s.response_store_max_rows)
        except StoreUnavailable as exc:
            if s.response_store is not None:
                raise
            log.warning("the default response store cannot be opened (%s): responses with "
                        "store: true will be refused; set --response-store", exc)
            return
        nursery.start_soon(expire_periodically, self.store, min(60.0, s.response_store_ttl))

    async def _supervise(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Run the core; respawn it with backoff when it dies, up to ``max_engine_restarts``."""
        assert self.model_dir is not None
        started = False
        failures = 0
        try:
            while True:
                # The adapters loaded now: a respawned core keeps the runtime-loaded ones.
                config = self.settings.engine_config(self.model_dir, tuple(self.loras.items()))
                client = EngineClient(startup_timeout=self.settings.startup_timeout,
                                      max_buffered_tokens=self.settings.max_stream_buffer_tokens,
                                      stream_interval=self.settings.stream_interval)
                self.client = client
                async with trio.open_nursery() as nursery:
                    try:
                        await nursery.start(run_core, config, client)
                    except EngineUnavailable:
                        if not started:
                            raise  # a first start that fails fails the server's startup
                    else:
                        if not started:
                            task_status.started()
                            started = True
                        else:
                            log.info("engine core is back (restart %d)", self.engine_restarts)
                if client.state is ClientState.CLOSED or self.state in (ServerState.DRAINING,
                                                                       ServerState.STOPPED):
                    return
                failures = failures + 1 if client.ready is None else 1
                if failures > self.settings.max_engine_restarts:
                    log.error("engine core failed %d times in a row; giving up", failures)
                    return
                delay = min(30.0, 0.5 * 2 ** (failures - 1))
                log.warning("engine core died (%s); respawning in %.1fs", client.failure, delay)
                await trio.sleep(delay)
                self.engine_restarts += 1
        finally:
            self._supervisor_done.set()

    async def drain(self, timeout: float) -> None:
        """Stop taking requests, let in-flight ones finish for ``timeout`` s, fail the rest."""
        if self.state is not ServerState.SERVING:
            return
        self._transition(ServerState.DRAINING)
        log.info("draining: %d requests in flight, %.0fs to finish", self.admission.in_flight,
                 timeout)
        with trio.move_on_after(timeout):
            await self.admission.wait_empty()
        self.generations.abort_all("the server is shutting down")
        with trio.move_on_after(2.0):  # let the aborted ones write their error events
            await self.admission.wait_empty()

    async def stop(self) -> None:
        if self.state is not ServerState.STOPPED:
            self._transition(ServerState.STOPPED)
        await self.grammars.aclose()
        if self.client is not None:
            self.client.close()
        await self._supervisor_done.wait()
        if self.store is not None:
            await self.store.aclose()
        await tracing.shutdown()  # the last requests' spans: flushed, within a deadline

    def _transition(self, new: ServerState) -> None:
        if new not in _NEXT[self.state]:
            raise RuntimeError(f"server: no transition {self.state.value} -> {new.value}")
        self.state = new

    # ------------------------------------------------------------------ views
    @property
    def tokenizer(self) -> ModelTokenizer:
        """The checkpoint's tokenizer, loaded before the server serves."""
        assert self._tokenizer is not None
        return self._tokenizer

    @property
    def ready(self) -> Ready:
        assert self.client is not None and self.client.ready is not None
        return self.client.ready

    def generation_context(self) -> GenerationContext:
        """What a generation needs of the server, for one opened now."""
        assert self.client is not None
        return GenerationContext(self.client, self.tokenizer, self.metrics, self.generations)

    def _grammar_spec(self) -> WorkerSpec:
        """The engine's view of the vocabulary (``engine/guided.py``), for grammar workers."""
        assert self.model_dir is not None
        model = self.ready.model
        return WorkerSpec(self.model_dir / "tokenizer.json", model.vocab_size,
                          model.eos_token_ids)

    def healthy(self) -> bool:
        return self.client is not None and self.client.healthy

    def serving(self) -> bool:
        return self.state is ServerState.SERVING and self.healthy()

    def _engine_statistics(self) -> ClientStatistics | None:
        return self.client.statistics() if self.client is not None else None

"""Server settings: one attrs class, each field declared once with its default, bounds and
help; ``izh-trio serve``'s flags and the ``IZH_*`` environment variables are derived from it
(``setting_fields``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs import validators as v

from izh_trio.frontend.metrics_names import prefix_is_valid
from izh_trio.frontend.response_store.factory import check_url
from izh_trio.frontend.response_store.protocol import DEFAULT_MAX_ROWS, DEFAULT_TTL_S
from izh_trio.frontend.setting_fields import given_env, setting
from izh_trio.frontend.tool_formats.choose import TOOL_CALL_PARSERS
from izh_trio.frontend.tracing import check_endpoint
from izh_trio.wire import EngineConfig
from izh_trio.wire.log_format import FORMATS as LOG_FORMATS
from izh_trio.wire.log_format import LEVELS as LOG_LEVELS
from izh_trio.wire.options import ATTENTION_BACKENDS, CUDA_GRAPHS_MODES, DTYPES, check_lora_names


def parse_lora_module(spec: str | tuple[str, str] | list[str]) -> tuple[str, str]:
    """``NAME=PATH`` (or a pair already) as ``(name, path)``."""
    if isinstance(spec, str):
        name, sep, path = spec.partition("=")
        if not sep:
            raise ValueError(f"LoRA module {spec!r} is not NAME=PATH")
    else:
        name, path = spec
    name, path = name.strip(), path.strip()
    if not name or not path:
        raise ValueError(f"LoRA module {spec!r} needs a name and a path (NAME=PATH)")
    return name, path


def _lora_modules(specs: Iterable[str | tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    pairs = tuple(parse_lora_module(s) for s in specs)
    check_lora_names(pairs)
    return pairs


_optional_path = attrs.converters.optional(Path)


def zero_is_none(default: float, text: str) -> Any:
    """A limit that 0 turns off: not negative, and its help says so."""
    return setting(default, f"{text} (0: none)", validator=v.ge(0))


def _traces_endpoint(_instance: object, _attribute: object, url: str | None) -> None:
    check_endpoint(url)  # imports nothing of OpenTelemetry


def _store_url(_instance: object, _attribute: object, url: str | None) -> None:
    check_url(url)  # a bad URL is a one-line error at start, not a failure on first use


def _metric_prefix(_instance: object, _attribute: object, prefix: str) -> None:
    if not prefix_is_valid(prefix):
        raise ValueError(f"metrics prefix {prefix!r}: letters, digits and underscores only, "
                         "not a digit first")


@attrs.frozen
class Settings:
    """Everything the server is told; the engine's share becomes an ``EngineConfig``."""

    # setting() is attrs.field with metadata: a field, not a shared default (RUF009).
    model_dir: Path | None = setting(  # noqa: RUF009
        None, "Hugging Face checkpoint directory (default: the embedded tiny model, built once and "
        "cached)", converter=_optional_path)
    served_model_name: str | None = setting(
        None, "the model's name in the API (default: the model directory's name)",
        metavar="NAME")
    tool_call_parser: str = setting(
        "auto", "the model's tool-call syntax (auto: read from its chat template and tokens)",
        choices=TOOL_CALL_PARSERS)
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8000, "port to listen on", validator=[v.ge(0), v.le(65535)])
    max_model_len: int | None = setting(
        None, "longest sequence, prompt and output (default: the checkpoint's "
        "max_position_embeddings)", validator=v.optional(v.ge(1)))
    max_num_seqs: int = setting(256, "sequences the engine runs at once", validator=v.ge(1))
    max_num_batched_tokens: int = setting(2048, "tokens one engine step computes at most",
                                          validator=v.ge(1))
    block_size: int = setting(16, "tokens per KV-cache block", validator=v.ge(1))
    num_kv_blocks: int | None = setting(
        None, "KV-cache blocks (default: sized from --kv-cache-gib on CPU, from "
        "--gpu-memory-utilization on CUDA)", validator=v.optional(v.ge(1)))
    kv_cache_gib: float = setting(1.0, "KV-cache size in GiB on CPU", validator=v.gt(0))
    dtype: str = setting(
        "auto", "the model's dtype (auto: the checkpoint's, except on CPU an fp16 one runs in "
        "bf16 where the CPU multiplies bf16 natively, and a bf16 or fp16 one in fp32 where "
        "no AVX-512 serves it)", choices=DTYPES)
    device: str = setting("cpu", "cpu, cuda or cuda:N")
    attention_backend: str = setting(
        "auto", "auto: triton kernels on CUDA, the torch path on CPU", choices=ATTENTION_BACKENDS)
    cuda_graphs: str = setting(
        "auto", "capture decode steps as CUDA graphs (auto: on with CUDA + triton)",
        choices=CUDA_GRAPHS_MODES)
    gpu_memory_utilization: float = setting(
        0.9, "fraction of GPU memory for weights, activations and the KV cache",
        validator=[v.gt(0), v.le(1)])
    seed: int = setting(0, "seed of the engine's sampling")
    engine_threads: int = setting(0, "torch threads in the engine process (0: torch's default)",
                                  validator=v.ge(0))
    api_keys: tuple[str, ...] = setting(
        (), "accepted Bearer key (repeatable; the environment: comma-separated)",
        converter=tuple, flag="--api-key", env="IZH_API_KEY", action="append", metavar="KEY")
    api_keys_file: Path | None = setting(  # noqa: RUF009
        None, "file of accepted keys, one per line (# comments), read at start",
        converter=_optional_path)
    max_pending: int = zero_is_none(0, "requests in flight beyond which new ones get 503")
    rate_limit_tokens_per_minute: int = zero_is_none(
        0, "per-key budget of prompt + max_tokens tokens")
    request_timeout: float = zero_is_none(
        0.0, "default generation deadline in seconds, which X-Request-Timeout overrides")
    max_body_bytes: int = setting(32 << 20, "largest request body", validator=v.ge(1024))
    max_stream_buffer_tokens: int = setting(
        8192, "output tokens a stream may fall behind its client before it is aborted",
        validator=v.ge(1))
    # As vLLM's --stream-interval: fewer, larger events when per-event cost is the limit.
    stream_interval: int = setting(
        1, "tokens per SSE event after a stream's first (1: every token)", validator=v.ge(1))
    metrics_prefix: str = setting(
        "izh", "the first part of every /metrics name (vllm: vLLM's names, for its dashboards)",
        validator=_metric_prefix, metavar="PREFIX")
    startup_timeout: float = setting(
        600.0, "seconds the engine may take to start, model load included", validator=v.gt(0))
    max_engine_restarts: int = setting(
        5, "consecutive engine failures after which it is no longer respawned",
        validator=v.ge(0))
    drain_timeout: float = setting(
        30.0, "seconds in-flight requests get to finish on SIGTERM", validator=v.ge(0))
    lora_modules: tuple[tuple[str, str], ...] = setting(
        (), "PEFT LoRA adapters to serve; a request picks one by model or lora",
        converter=_lora_modules, parse=parse_lora_module, metavar="NAME=PATH")
    max_loras: int | None = setting(
        None, "adapters resident at once (default: all loaded at start, at most 8)",
        validator=v.optional(v.ge(1)))
    max_lora_rank: int | None = setting(
        None, "LoRA slot rank (default: the largest rank loaded at start)",
        validator=v.optional(v.ge(1)))
    enable_lora_runtime_updates: bool = setting(
        False, "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (else 404)")
    response_store: str | None = setting(
        None, "where stored responses live: sqlite:///PATH or redis://HOST:PORT/DB (default: "
        "SQLite in the cache directory)", validator=_store_url, metavar="URL")
    response_store_ttl: float = setting(
        DEFAULT_TTL_S, "seconds a stored response is kept", validator=v.gt(0))
    response_store_max_rows: int = setting(
        DEFAULT_MAX_ROWS, "stored responses kept at most (the oldest go first)",
        validator=v.ge(1))
    log_format: str = setting(
        "text", "every log line, one per request included: text, or json (one object a line)",
        choices=LOG_FORMATS)
    log_level: str = setting("INFO", "the server's log level", choices=LOG_LEVELS,
                             converter=str.upper)
    otlp_traces_endpoint: str | None = setting(
        None, "OpenTelemetry: a span per generation request, sent to this OTLP/HTTP collector "
        "(/v1/traces is added to an address without a path); needs izh-trio[otel] "
        "(default: no tracing)", validator=_traces_endpoint,
        metavar="URL")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Every field from its ``IZH_*`` variable (``IZH_API_KEY`` for the keys); unset ones
        default."""
        return cls(**given_env(cls, os.environ if env is None else env))

    def all_api_keys(self) -> tuple[str, ...]:
        keys = list(self.api_keys)
        if self.api_keys_file is not None:
            # UTF-8, whatever the locale: keys are compared as UTF-8 bytes (frontend.auth).
            text = self.api_keys_file.read_text(encoding="utf-8", errors="surrogateescape")
            for line in text.splitlines():
                key = line.split("#", 1)[0].strip()
                if key:
                    keys.append(key)
        return tuple(keys)

    def resolve_model_dir(self) -> Path:
        if self.model_dir is not None:
            return self.model_dir
        from izh_trio.tiny import default_tiny_dir

        return default_tiny_dir()

    def model_name(self, model_dir: Path) -> str:
        return self.served_model_name or model_dir.resolve().name

    def engine_config(self, model_dir: Path,
                      lora_modules: tuple[tuple[str, str], ...] | None = None) -> EngineConfig:
        """``lora_modules``: the adapters loaded now (runtime updates change them)."""
        loras = self.lora_modules if lora_modules is None else lora_modules
        return EngineConfig(
            model_dir=str(model_dir),
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            block_size=self.block_size,
            num_kv_blocks=self.num_kv_blocks,
            kv_cache_bytes=int(self.kv_cache_gib * (1 << 30)),
            dtype=self.dtype,
            device=self.device,
            attention_backend=self.attention_backend,
            cuda_graphs=self.cuda_graphs,
            gpu_memory_utilization=self.gpu_memory_utilization,
            seed=self.seed,
            num_threads=self.engine_threads,
            lora_modules=tuple((name, str(Path(path).resolve())) for name, path in loras),
            max_loras=self.max_loras,
            max_lora_rank=self.max_lora_rank,
            lora_runtime_updates=self.enable_lora_runtime_updates,
            log_format=self.log_format,
        )

"""Server settings: one attrs class, from CLI flags or ``IZH_*`` environment variables."""

from __future__ import annotations

import os
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs import validators as v

from izh_trio.wire import EngineConfig
from izh_trio.wire.log_format import FORMATS as LOG_FORMATS
from izh_trio.wire.log_format import LEVELS as LOG_LEVELS

#: Environment names that are not simply the field's name in capitals.
_ENV_NAMES = {"api_keys": "API_KEY"}


def _from_env_text(raw: str, tp: Any) -> Any:
    """An ``IZH_*`` value as the field's type: numbers, booleans, comma lists, text."""
    kinds = {t for t in typing.get_args(tp) if t is not type(None)} or {tp}
    if typing.get_origin(tp) is tuple:
        return tuple(item.strip() for item in raw.split(",") if item.strip())
    if bool in kinds:
        if raw.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ValueError(f"not a boolean: {raw!r}")
        return raw.lower() in ("1", "true", "yes", "on")
    if int in kinds:
        return int(raw)
    if float in kinds:
        return float(raw)
    return raw


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
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"LoRA module names must be unique: {names}")
    return pairs


@attrs.frozen
class Settings:
    """Everything the server is told; the engine's share becomes an ``EngineConfig``."""

    #: None: build (once, cached) the embedded tiny random Qwen3 checkpoint.
    model_dir: Path | None = attrs.field(
        default=None, converter=attrs.converters.optional(Path)
    )
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = attrs.field(default=8000, validator=[v.ge(0), v.le(65535)])
    max_model_len: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    max_num_seqs: int = attrs.field(default=256, validator=v.ge(1))
    max_num_batched_tokens: int = attrs.field(default=2048, validator=v.ge(1))
    block_size: int = attrs.field(default=16, validator=v.ge(1))
    num_kv_blocks: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    kv_cache_gib: float = attrs.field(default=1.0, validator=v.gt(0))
    dtype: str = attrs.field(default="auto", validator=v.in_(("auto", "float32", "bfloat16",
                                                                "float16")))
    device: str = "cpu"
    attention_backend: str = attrs.field(default="auto",
                                         validator=v.in_(("auto", "torch", "triton")))
    cuda_graphs: str = attrs.field(default="auto", validator=v.in_(("auto", "on", "off")))
    gpu_memory_utilization: float = attrs.field(default=0.9, validator=[v.gt(0), v.le(1)])
    seed: int = 0
    engine_threads: int = attrs.field(default=0, validator=v.ge(0))
    api_keys: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    #: A file of accepted keys, one per line (``#`` comments), read at start.
    api_keys_file: Path | None = attrs.field(
        default=None, converter=attrs.converters.optional(Path)
    )
    #: Requests in flight beyond which new ones get 503 (0: no cap).
    max_pending: int = attrs.field(default=0, validator=v.ge(0))
    #: Tokens (prompt + max_tokens) each key may use per minute (0: no limit).
    rate_limit_tokens_per_minute: int = attrs.field(default=0, validator=v.ge(0))
    #: Default deadline of a generation in seconds (0: none); ``X-Request-Timeout`` overrides.
    request_timeout: float = attrs.field(default=0.0, validator=v.ge(0))
    #: On SIGTERM: how long in-flight requests get to finish before they are failed.
    drain_timeout: float = attrs.field(default=30.0, validator=v.ge(0))
    max_body_bytes: int = attrs.field(default=32 << 20, validator=v.ge(1024))
    #: Output tokens a stream may fall behind its client before it is aborted.
    max_stream_buffer_tokens: int = attrs.field(default=8192, validator=v.ge(1))
    #: A stream's SSE events after its first carry at least this many tokens (as vLLM's
    #: ``--stream-interval``): fewer, larger events when per-event cost is the limit.
    stream_interval: int = attrs.field(default=1, validator=v.ge(1))
    #: Consecutive engine-core failures after which the server stops respawning it.
    max_engine_restarts: int = attrs.field(default=5, validator=v.ge(0))
    startup_timeout: float = attrs.field(default=600.0, validator=v.gt(0))
    #: LoRA adapters (PEFT directories) served beside the base model, as (name, path).
    lora_modules: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_lora_modules)
    #: Adapters resident in the engine at once (None: all loaded at start, at most 8).
    max_loras: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    #: The engine's LoRA slot rank (None: the largest rank loaded at start).
    max_lora_rank: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    #: Serve ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (else 404).
    enable_lora_runtime_updates: bool = False
    #: Every log line, the access log's included: ``text`` or ``json`` (one object a line).
    log_format: str = attrs.field(default="text", validator=v.in_(LOG_FORMATS))
    log_level: str = attrs.field(default="INFO", converter=str.upper,
                                 validator=v.in_(LOG_LEVELS))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Every field from ``IZH_<FIELD>`` (``IZH_API_KEY`` for the keys), unset ones default."""
        env = os.environ if env is None else env
        values = {}
        for field in attrs.fields(attrs.resolve_types(cls)):
            raw = env.get("IZH_" + _ENV_NAMES.get(field.name, field.name.upper()))
            if raw not in (None, ""):
                values[field.name] = _from_env_text(raw, field.type)
        return cls(**values)

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

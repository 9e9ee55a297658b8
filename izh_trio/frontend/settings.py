"""Server settings: one attrs class, from CLI flags or ``IZH_*`` environment variables."""

from __future__ import annotations

import os
from pathlib import Path

import attrs
from attrs import validators as v

from izh_trio.wire import EngineConfig


def _opt_int(value: str | None) -> int | None:
    return None if value in (None, "") else int(value)


def _opt_float(value: str | None) -> float | None:
    return None if value in (None, "") else float(value)


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
    #: Consecutive engine-core failures after which the server stops respawning it.
    max_engine_restarts: int = attrs.field(default=5, validator=v.ge(0))
    startup_timeout: float = attrs.field(default=600.0, validator=v.gt(0))

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)

        def get(name: str) -> str | None:
            value = env.get("IZH_" + name)
            return value if value not in (None, "") else None

        fields = {
            "model_dir": get("MODEL_DIR"),
            "served_model_name": get("SERVED_MODEL_NAME"),
            "host": get("HOST"),
            "port": _opt_int(get("PORT")),
            "max_model_len": _opt_int(get("MAX_MODEL_LEN")),
            "max_num_seqs": _opt_int(get("MAX_NUM_SEQS")),
            "max_num_batched_tokens": _opt_int(get("MAX_NUM_BATCHED_TOKENS")),
            "block_size": _opt_int(get("BLOCK_SIZE")),
            "num_kv_blocks": _opt_int(get("NUM_KV_BLOCKS")),
            "kv_cache_gib": _opt_float(get("KV_CACHE_GIB")),
            "dtype": get("DTYPE"),
            "device": get("DEVICE"),
            "attention_backend": get("ATTENTION_BACKEND"),
            "cuda_graphs": get("CUDA_GRAPHS"),
            "gpu_memory_utilization": _opt_float(get("GPU_MEMORY_UTILIZATION")),
            "seed": _opt_int(get("SEED")),
            "engine_threads": _opt_int(get("ENGINE_THREADS")),
            "api_keys": tuple(k for k in (get("API_KEY") or "").split(",") if k) or None,
            "max_pending": _opt_int(get("MAX_PENDING")),
            "api_keys_file": get("API_KEYS_FILE"),
            "rate_limit_tokens_per_minute": _opt_int(get("RATE_LIMIT_TOKENS_PER_MINUTE")),
            "request_timeout": _opt_float(get("REQUEST_TIMEOUT")),
            "drain_timeout": _opt_float(get("DRAIN_TIMEOUT")),
            "max_body_bytes": _opt_int(get("MAX_BODY_BYTES")),
            "max_stream_buffer_tokens": _opt_int(get("MAX_STREAM_BUFFER_TOKENS")),
            "max_engine_restarts": _opt_int(get("MAX_ENGINE_RESTARTS")),
            "startup_timeout": _opt_float(get("STARTUP_TIMEOUT")),
        }
        return cls(**{k: val for k, val in fields.items() if val is not None})

    def all_api_keys(self) -> tuple[str, ...]:
        keys = list(self.api_keys)
        if self.api_keys_file is not None:
            for line in self.api_keys_file.read_text().splitlines():
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

    def engine_config(self, model_dir: Path) -> EngineConfig:
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
        )

"""Settings declared once: every field is a ``serve`` flag and an ``IZH_*`` variable that read
the same, ``--help`` shows each field's help, and a bad value is a one-line usage error."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from izh_trio.cli import main
from izh_trio.frontend.settings import Settings
from izh_trio.tiny import TinySpec
from izh_trio.wire import EngineConfig
from izh_trio.wire.options import ATTENTION_BACKENDS, CUDA_GRAPHS_MODES, DTYPES

#: Each field: its flag and values on the command line, its variable and value in the
#: environment, all different from the default. The names are the ones users already use.
SAMPLES = {
    "model_dir": (["--model-dir", "/m"], "IZH_MODEL_DIR", "/m"),
    "served_model_name": (["--served-model-name", "name"], "IZH_SERVED_MODEL_NAME", "name"),
    "tool_call_parser": (["--tool-call-parser", "mistral"], "IZH_TOOL_CALL_PARSER", "mistral"),
    "host": (["--host", "0.0.0.0"], "IZH_HOST", "0.0.0.0"),
    "port": (["--port", "8123"], "IZH_PORT", "8123"),
    "max_model_len": (["--max-model-len", "512"], "IZH_MAX_MODEL_LEN", "512"),
    "max_num_seqs": (["--max-num-seqs", "7"], "IZH_MAX_NUM_SEQS", "7"),
    "max_num_batched_tokens": (["--max-num-batched-tokens", "99"],
                               "IZH_MAX_NUM_BATCHED_TOKENS", "99"),
    "block_size": (["--block-size", "32"], "IZH_BLOCK_SIZE", "32"),
    "num_kv_blocks": (["--num-kv-blocks", "64"], "IZH_NUM_KV_BLOCKS", "64"),
    "kv_cache_gib": (["--kv-cache-gib", "0.5"], "IZH_KV_CACHE_GIB", "0.5"),
    "dtype": (["--dtype", "bfloat16"], "IZH_DTYPE", "bfloat16"),
    "device": (["--device", "cuda:1"], "IZH_DEVICE", "cuda:1"),
    "attention_backend": (["--attention-backend", "triton"], "IZH_ATTENTION_BACKEND", "triton"),
    "cuda_graphs": (["--cuda-graphs", "off"], "IZH_CUDA_GRAPHS", "off"),
    "gpu_memory_utilization": (["--gpu-memory-utilization", "0.5"],
                               "IZH_GPU_MEMORY_UTILIZATION", "0.5"),
    "seed": (["--seed", "7"], "IZH_SEED", "7"),
    "engine_threads": (["--engine-threads", "2"], "IZH_ENGINE_THREADS", "2"),
    "api_keys": (["--api-key", "k1", "--api-key", "k2"], "IZH_API_KEY", "k1, k2"),
    "api_keys_file": (["--api-keys-file", "/keys"], "IZH_API_KEYS_FILE", "/keys"),
    "max_pending": (["--max-pending", "10"], "IZH_MAX_PENDING", "10"),
    "rate_limit_tokens_per_minute": (["--rate-limit-tokens-per-minute", "1000"],
                                     "IZH_RATE_LIMIT_TOKENS_PER_MINUTE", "1000"),
    "request_timeout": (["--request-timeout", "2.5"], "IZH_REQUEST_TIMEOUT", "2.5"),
    "drain_timeout": (["--drain-timeout", "1.5"], "IZH_DRAIN_TIMEOUT", "1.5"),
    "max_body_bytes": (["--max-body-bytes", "2048"], "IZH_MAX_BODY_BYTES", "2048"),
    "max_stream_buffer_tokens": (["--max-stream-buffer-tokens", "100"],
                                 "IZH_MAX_STREAM_BUFFER_TOKENS", "100"),
    "stream_interval": (["--stream-interval", "4"], "IZH_STREAM_INTERVAL", "4"),
    "metrics_prefix": (["--metrics-prefix", "vllm"], "IZH_METRICS_PREFIX", "vllm"),
    "max_engine_restarts": (["--max-engine-restarts", "0"], "IZH_MAX_ENGINE_RESTARTS", "0"),
    "startup_timeout": (["--startup-timeout", "60"], "IZH_STARTUP_TIMEOUT", "60"),
    "lora_modules": (["--lora-modules", "a=/a", "b=/b"], "IZH_LORA_MODULES", "a=/a,b=/b"),
    "max_loras": (["--max-loras", "2"], "IZH_MAX_LORAS", "2"),
    "max_lora_rank": (["--max-lora-rank", "8"], "IZH_MAX_LORA_RANK", "8"),
    "enable_lora_runtime_updates": (["--enable-lora-runtime-updates"],
                                    "IZH_ENABLE_LORA_RUNTIME_UPDATES", "yes"),
    "response_store": (["--response-store", "redis://h:1/2"], "IZH_RESPONSE_STORE",
                       "redis://h:1/2"),
    "response_store_ttl": (["--response-store-ttl", "60"], "IZH_RESPONSE_STORE_TTL", "60"),
    "response_store_max_rows": (["--response-store-max-rows", "5"],
                                "IZH_RESPONSE_STORE_MAX_ROWS", "5"),
    "log_format": (["--log-format", "json"], "IZH_LOG_FORMAT", "json"),
    "log_level": (["--log-level", "warning"], "IZH_LOG_LEVEL", "Warning"),
    "otlp_traces_endpoint": (["--otlp-traces-endpoint", "http://127.0.0.1:4318"],
                             "IZH_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318"),
}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Settings, int]]:
    """What ``main`` would serve, instead of serving it."""
    seen: list[tuple[Settings, int]] = []
    monkeypatch.setattr("izh_trio.cli.serve",
                        lambda settings, backlog: seen.append((settings, backlog)))
    monkeypatch.setattr("izh_trio.cli.log_format.configure", lambda *_: None)
    return seen


def test_every_field_has_a_flag_and_a_variable_that_read_the_same(served) -> None:
    assert set(SAMPLES) == {f.name for f in attrs.fields(Settings)}
    main(["serve", *[arg for args, _, _ in SAMPLES.values() for arg in args]])
    from_env = Settings.from_env({name: value for _, name, value in SAMPLES.values()})
    assert served == [(from_env, 2048)]
    default = Settings()
    assert [f.name for f in attrs.fields(Settings)
            if getattr(from_env, f.name) == getattr(default, f.name)] == []
    assert from_env.api_keys == ("k1", "k2")
    assert from_env.lora_modules == (("a", "/a"), ("b", "/b"))
    assert (from_env.log_level, from_env.model_dir) == ("WARNING", Path("/m"))
    # The engine's share crosses the wire as it was read.
    assert from_env.engine_config(Path("/m")).attention_backend == "triton"


def test_no_flag_and_no_variable_give_the_defaults(served) -> None:
    main(["serve"])
    assert served == [(Settings(), 2048)] and Settings.from_env({}) == Settings()
    assert Settings.from_env({"IZH_PORT": ""}) == Settings()  # empty: unset


def test_help_lists_every_flag_with_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    for field in attrs.fields(Settings):
        assert SAMPLES[field.name][0][0] in text
        # A help ending in a parenthesis gets the default inside it: "(...; default: X)".
        assert " ".join(field.metadata["help"].split()).removesuffix(")") in text
    assert "--backlog N listen backlog" in text
    assert "--port N port to listen on (default: 8000)" in text
    assert "--dtype {auto,float32,bfloat16,float16}" in text


@pytest.mark.parametrize(("args", "error"), [
    (["--port", "x"], "argument --port: invalid int value: 'x'"),
    (["--dtype", "f16"], "argument --dtype: invalid choice: 'f16' (choose from 'auto', "
                         "'float32', 'bfloat16', 'float16')"),
    (["--lora-modules", "sql"], "argument --lora-modules: LoRA module 'sql' is not NAME=PATH"),
    (["--lora-modules", "a=/x", "a=/y"], "LoRA module names must be unique: ['a', 'a']"),
    (["--gpu-memory-utilization", "2"], "'gpu_memory_utilization' must be <= 1: 2.0"),
    (["--backlog", "-1"], "'backlog' must be >= 0: -1"),
    (["--response-store", "mysql://x"], "--response-store 'mysql://x': expected "
                                        "sqlite:///PATH or redis://HOST:PORT/DB"),
    (["--response-store-ttl", "0"], "'response_store_ttl' must be > 0: 0.0"),
    (["--log-level", "loud"], "argument --log-level: invalid choice: 'LOUD' (choose from "
                              "'DEBUG', 'INFO', 'WARNING', 'ERROR', 'CRITICAL')"),
])
def test_a_bad_value_is_a_one_line_usage_error(args: list[str], error: str, served,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", *args])
    assert exit_.value.code == 2 and served == []
    assert capsys.readouterr().err.splitlines() == ["usage: izh-trio serve [options]",
                                                    f"izh-trio serve: error: {error}"]


@pytest.mark.parametrize(("env", "error"), [
    ({"IZH_PORT": "x"}, "IZH_PORT='x': invalid literal for int() with base 10: 'x'"),
    ({"IZH_ENABLE_LORA_RUNTIME_UPDATES": "maybe"}, "IZH_ENABLE_LORA_RUNTIME_UPDATES='maybe': "
                                                   "not a boolean (one of 1, true, yes, on, "
                                                   "0, false, no, off)"),
    ({"IZH_LORA_MODULES": "a"}, "IZH_LORA_MODULES='a': LoRA module 'a' is not NAME=PATH"),
])
def test_a_bad_variable_is_named(env: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError) as info:
        Settings.from_env(env)
    assert str(info.value) == error


@pytest.mark.parametrize(("field", "choices"), [
    ("dtype", DTYPES), ("attention_backend", ATTENTION_BACKENDS),
    ("cuda_graphs", CUDA_GRAPHS_MODES),
])
def test_every_choice_the_settings_take_crosses_the_wire(field: str, choices: tuple) -> None:
    for choice in choices:
        config = attrs.evolve(Settings(), **{field: choice}).engine_config(Path("/m"))
        assert getattr(config, field) == choice
    with pytest.raises(ValueError):
        Settings(**{field: "other"})
    with pytest.raises(ValueError):
        EngineConfig(model_dir="/m", **{field: "other"})


def test_one_lora_name_check_on_both_sides() -> None:
    pairs = (("a", "/x"), ("a", "/y"))
    with pytest.raises(ValueError) as settings_error:
        Settings(lora_modules=pairs)
    with pytest.raises(ValueError) as wire_error:
        EngineConfig(model_dir="/m", lora_modules=pairs)
    assert str(settings_error.value) == str(wire_error.value)


def test_make_tiny_flags_make_the_spec(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    made = []
    monkeypatch.setattr("izh_trio.cli.make_tiny_checkpoint",
                        lambda out, spec: made.append((out, spec)) or out)
    assert main(["make-tiny", "ckpt", "--vocab", "600", "--hidden", "128", "--intermediate",
                 "300", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--head-dim", "32",
                 "--seed", "3", "--tie"]) == 0
    assert made == [(Path("ckpt"), TinySpec(
        vocab_size=600, hidden_size=128, intermediate_size=300, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, seed=3,
        tie_word_embeddings=True))]
    assert main(["make-tiny", "plain"]) == 0
    assert made[-1] == (Path("plain"), TinySpec())
    assert capsys.readouterr().out.split() == ["ckpt", "plain"]
    with pytest.raises(SystemExit) as exit_:
        main(["make-tiny", "bad", "--heads", "3"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "izh-trio make-tiny: error: num_attention_heads (3) must be a multiple of "
        "num_key_value_heads (2)")


def test_make_tiny_refuses_a_directory_of_something_else(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_:
        main(["make-tiny", str(tmp_path)])
    assert exit_.value.code == (f"izh-trio: cannot write {tmp_path}: {tmp_path} exists and "
                                "is not a tiny checkpoint of this spec")

"""``izh-trio serve`` and ``izh-trio make-tiny``."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import attrs
import trio

from izh_trio.frontend.settings import Settings, parse_lora_module
from izh_trio.wire import log_format


def _lora_module(text: str) -> tuple[str, str]:
    try:
        return parse_lora_module(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI API for a Qwen3 checkpoint")
    d = Settings()
    p.add_argument("--model-dir", type=Path, default=None,
                   help="Hugging Face Qwen3 directory (default: the embedded tiny model)")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--kv-cache-gib", type=float, default=d.kv_cache_gib)
    p.add_argument("--dtype", default=d.dtype,
                   choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default=d.device, help="cpu, cuda or cuda:N")
    p.add_argument("--attention-backend", default=d.attention_backend,
                   choices=["auto", "torch", "triton"],
                   help="auto: triton kernels on CUDA, the torch path on CPU")
    p.add_argument("--cuda-graphs", default=d.cuda_graphs, choices=["auto", "on", "off"],
                   help="capture decode steps as CUDA graphs (auto: on with CUDA + triton)")
    p.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization,
                   help="fraction of GPU memory for weights, activations and the KV cache")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--engine-threads", type=int, default=d.engine_threads)
    p.add_argument("--api-key", action="append", default=[], dest="api_keys",
                   help="accepted Bearer key (repeatable)")
    p.add_argument("--max-pending", type=int, default=d.max_pending,
                   help="requests in flight beyond which new ones get 503 (0: no cap)")
    p.add_argument("--api-keys-file", type=Path, default=None,
                   help="file of accepted keys, one per line")
    p.add_argument("--rate-limit-tokens-per-minute", type=int,
                   default=d.rate_limit_tokens_per_minute,
                   help="per-key budget of prompt + max_tokens tokens (0: none)")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout,
                   help="default generation deadline in seconds (0: none)")
    p.add_argument("--drain-timeout", type=float, default=d.drain_timeout,
                   help="seconds in-flight requests get to finish on SIGTERM")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--max-stream-buffer-tokens", type=int, default=d.max_stream_buffer_tokens)
    p.add_argument("--stream-interval", type=int, default=d.stream_interval,
                   help="tokens per SSE event after a stream's first (1: every token)")
    p.add_argument("--max-engine-restarts", type=int, default=d.max_engine_restarts)
    p.add_argument("--startup-timeout", type=float, default=d.startup_timeout)
    p.add_argument("--lora-modules", nargs="+", type=_lora_module, default=[],
                   metavar="NAME=PATH",
                   help="PEFT LoRA adapters to serve; a request picks one by model or lora")
    p.add_argument("--max-loras", type=int, default=None,
                   help="adapters resident at once (default: all loaded at start, at most 8)")
    p.add_argument("--max-lora-rank", type=int, default=None,
                   help="LoRA slot rank (default: the largest rank loaded at start)")
    p.add_argument("--enable-lora-runtime-updates", action="store_true",
                   help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter")
    p.add_argument("--backlog", type=int, default=2048,
                   help="listen backlog: a burst of new connections beyond it is reset")
    p.add_argument("--log-level", default=d.log_level, type=str.upper,
                   choices=log_format.LEVELS)
    p.add_argument("--log-format", default=d.log_format, choices=log_format.FORMATS,
                   help="every log line, one per request included: text, or json (one "
                        "object a line)")


def _settings_from(args: argparse.Namespace) -> Settings:
    names = {f.name for f in attrs.fields(Settings)}
    return Settings(**{k: v for k, v in vars(args).items() if k in names})


def check_address(host: str, port: int) -> None:
    """Fail now, in one line, if the address cannot be listened on: hypercorn binds only after
    the app's start-up, so a busy port would otherwise cost a model load and end in a
    traceback. It binds as hypercorn's ``Config`` does (the family from the host's spelling,
    SO_REUSEADDR); a port taken between this check and hypercorn's bind fails as before."""
    bare = host.replace("[", "").replace("]", "")
    try:
        with socket.socket(socket.AF_INET6 if ":" in bare else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((bare, port))
    except OSError as exc:
        raise SystemExit(f"izh-trio: cannot listen on {host}:{port}: "
                         f"{exc.strerror or exc}") from None


def serve(settings: Settings, backlog: int = 2048) -> None:
    """hypercorn's trio worker on our app until SIGINT or SIGTERM (see ``_serve``)."""
    from hypercorn.config import Config

    from izh_trio.frontend.app import create_app

    check_address(settings.host, settings.port)
    config = Config()
    config.bind = [f"{settings.host}:{settings.port}"]
    config.backlog = backlog  # hypercorn's 100 resets part of a 256-client burst
    config.startup_timeout = settings.startup_timeout
    config.graceful_timeout = 5.0  # the drain already waited for in-flight requests
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # ours: one handler, one format
    try:
        app = create_app(settings)
    except OSError as exc:  # an API keys file that cannot be read, say
        raise _cannot_start(exc) from None
    server = app.extensions["izh"]
    try:
        status = trio.run(_serve, app, config, settings.drain_timeout)
    except BaseException:
        if server.startup_failure is not None:
            raise _cannot_start(server.startup_failure) from None
        raise
    if status:
        raise SystemExit(status)


def _cannot_start(reason: object) -> SystemExit:
    return SystemExit(f"izh-trio: cannot start: {reason}")


async def _serve(app: Any, config: Any, drain_timeout: float) -> int:
    """Serve until signalled; the exit status (0, or 130 when interrupted).

    SIGINT and SIGTERM are ours from the first moment, never a KeyboardInterrupt: one raised
    inside the app's start-up comes out of trio's nurseries as an exception group, which
    hypercorn takes for a framework without lifespan support, and it goes on serving a server
    that never started. The first signal drains a serving server (then exit 0) or abandons a
    start-up; a second one stops at once."""
    from hypercorn.trio import serve as hypercorn_serve

    from izh_trio.frontend.server import ServerState

    server = app.extensions["izh"]
    stop = trio.Event()
    status = 0
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal status
                async for _ in signals:
                    if stop.is_set() or server.state in (ServerState.CREATED,
                                                         ServerState.STARTING):
                        status = 130
                        nursery.cancel_scope.cancel()
                        return
                    stop.set()

            async def until_drained() -> None:
                await stop.wait()
                await server.drain(drain_timeout)

            nursery.start_soon(watch)
            await hypercorn_serve(app, config, shutdown_trigger=until_drained)
            nursery.cancel_scope.cancel()
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="izh-trio")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    tiny = sub.add_parser("make-tiny", help="write the tiny random Qwen3 checkpoint to DIR")
    tiny.add_argument("dir", type=Path)
    args = parser.parse_args(argv)

    if args.command == "make-tiny":
        from izh_trio.tiny import make_tiny_checkpoint

        print(make_tiny_checkpoint(args.dir))
        return 0
    try:
        settings = _settings_from(args)
    except (TypeError, ValueError) as exc:  # the settings' own validators: a usage error
        serve_parser = sub.choices["serve"]
        serve_parser.error(str(exc))
    log_format.configure(settings.log_level, settings.log_format)
    try:
        serve(settings, backlog=args.backlog)
    except KeyboardInterrupt:  # before the server took the signals over
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

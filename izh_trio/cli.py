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
from attrs import validators as v

from izh_trio.frontend.setting_fields import add_flags, given_flags, setting
from izh_trio.frontend.settings import Settings
from izh_trio.tiny import SHAPES, TinySpec, make_tiny_checkpoint
from izh_trio.wire import log_format


@attrs.frozen
class ServeOptions:
    """``izh-trio serve``'s own settings, beyond the app's (hypercorn's CLI has its own)."""

    backlog: int = setting(2048, "listen backlog: a burst of new connections beyond it is "
                           "reset", validator=v.ge(0))


#: ``make-tiny``'s flags: the ``TinySpec`` field each sets, and its help.
_TINY_FLAGS = {
    "--vocab": ("vocab_size", "vocabulary size"),
    "--hidden": ("hidden_size", "hidden size"),
    "--intermediate": ("intermediate_size", "MLP intermediate size"),
    "--layers": ("num_hidden_layers", "decoder layers"),
    "--heads": ("num_attention_heads", "attention heads"),
    "--kv-heads": ("num_key_value_heads", "key/value heads"),
    "--head-dim": ("head_dim", "head dimension"),
    "--seed": ("seed", "seed of the random weights"),
    "--learned-vocab": ("learned_vocab", "tokens learned; the rest are fillers (default: all)"),
}


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser, and each command's own (whose usage line a bad value's error follows)."""
    parser = argparse.ArgumentParser(prog="izh-trio")
    sub = parser.add_subparsers(dest="command", required=True)
    # A short usage line: the flags are listed once, under --help's options.
    serve_parser = sub.add_parser("serve", help="serve the OpenAI API for a Qwen3 checkpoint",
                                  usage="%(prog)s [options]",
                                  description="The app under hypercorn (izh_trio.app:app) "
                                  "reads the same settings from IZH_* environment variables: "
                                  "--max-num-seqs is IZH_MAX_NUM_SEQS (all but --backlog, "
                                  "hypercorn's own there).")
    add_flags(serve_parser, Settings)
    add_flags(serve_parser, ServeOptions)
    tiny = sub.add_parser("make-tiny", help="write the tiny random Qwen3 checkpoint to DIR",
                          description="The defaults are the checkpoint izh-trio serve builds "
                          "for itself; the flags make other shapes (benchmarks).")
    tiny.add_argument("dir", type=Path, metavar="DIR",
                      help="where to write it: missing, empty, or this checkpoint already")
    tiny.add_argument("--shape", choices=sorted(SHAPES), default=argparse.SUPPRESS,
                      help="a real model's shape (the flags above change it further)")
    default = TinySpec()
    for flag, (field, text) in _TINY_FLAGS.items():
        tiny.add_argument(flag, dest=field, type=int, default=argparse.SUPPRESS, metavar="N",
                          help=f"{text} (default: {getattr(default, field)})")
    tiny.add_argument("--tie", dest="tie_word_embeddings", action="store_true",
                      default=argparse.SUPPRESS, help="tie the LM head to the embeddings")
    return parser, sub.choices


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


def _built(parser: argparse.ArgumentParser, cls: Any, values: dict[str, Any]) -> Any:
    """``cls(**values)``; a value its own validators refuse is a usage error of ``parser``."""
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    parser, commands = _parser()
    args = parser.parse_args(argv)
    if args.command == "make-tiny":
        given = {k: v for k, v in vars(args).items() if k not in ("command", "dir", "shape")}
        base = SHAPES.get(getattr(args, "shape", ""), TinySpec())
        spec = _built(commands["make-tiny"], TinySpec, {**attrs.asdict(base), **given})
        try:
            print(make_tiny_checkpoint(args.dir, spec))
        except OSError as exc:  # a directory holding something else, say
            raise SystemExit(f"izh-trio: cannot write {args.dir}: {exc}") from None
        return 0
    settings = _built(commands["serve"], Settings, given_flags(Settings, args))
    options = _built(commands["serve"], ServeOptions, given_flags(ServeOptions, args))
    log_format.configure(settings.log_level, settings.log_format)
    try:
        serve(settings, backlog=options.backlog)
    except KeyboardInterrupt:  # before the server took the signals over
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A closed HTTP connection is freed when it closes, not by the cyclic collector: the HTTP
process collects its first generation only every 50,000 containers, and a thousand
connections' cycles collected at once stalled the event loop for 80-150 ms."""

from __future__ import annotations

import gc
from functools import partial
from typing import Any

import hypercorn.trio.run
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from hypercorn.trio.tcp_server import TCPServer

from izh_trio.frontend import connection_cycles
from tests.refcycles import cyclic_collector_off

CONNECTIONS = 20


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _get(port: int) -> bytes:
    """One request on a connection of its own, read to the server's close."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := await stream.receive_some():
            answer += chunk
    return answer


def _servers_alive() -> int:
    return sum(isinstance(o, TCPServer) for o in gc.get_objects())


def test_install_is_idempotent() -> None:
    assert connection_cycles.install()
    assert connection_cycles.install()
    assert hypercorn.trio.run.TCPServer is connection_cycles.TidyTCPServer


async def test_a_closed_connection_leaves_no_garbage_cycle() -> None:
    assert connection_cycles.install()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, _app, config,  # type: ignore[arg-type]
                                            shutdown_trigger=trio.sleep_forever))
        port = int(binds[0].rsplit(":", 1)[1])
        with cyclic_collector_off():
            for _ in range(CONNECTIONS):
                assert (await _get(port)).startswith(b"HTTP/1.1 200")
            # The client reads the close before the server's handler returns: wait for that.
            with trio.fail_after(30):
                while _servers_alive():
                    await trio.sleep(0.01)
            assert gc.collect() < CONNECTIONS  # was ~28 objects a connection
        nursery.cancel_scope.cancel()

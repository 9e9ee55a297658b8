"""hypercorn's per-connection objects freed when the connection ends, not by the cyclic GC.

hypercorn's trio ``TCPServer`` holds the protocol it builds, and the protocol holds the
server's bound ``protocol_send``: a reference cycle, so every closed connection left 30-50
objects (its socket among them) for the cyclic collector. This process collects its first
generation only after 50,000 more containers (``server.GC_FIRST_THRESHOLD``), so a thousand
closed connections -- a thousand requests from clients or a proxy that do not keep
connections alive -- were freed in one collection: a stall of the event loop of 80-150 ms.

:func:`install` points hypercorn's trio worker (which builds ``TCPServer`` by its
module-level name) at a subclass that drops the two references once ``run`` returns: by
then the connection's task group has ended, so nothing of the connection calls back into
it. Where a hypercorn release no longer has ``TCPServer.run`` there, nothing is installed and
those connections are collected as before (a test notices).
"""

from __future__ import annotations

import logging

import hypercorn.trio.run
from hypercorn.trio.tcp_server import TCPServer

log = logging.getLogger(__name__)

#: What a finished TCPServer still refers to that refers back to it.
_CYCLE_ATTRIBUTES = ("protocol", "_task_group")


class TidyTCPServer(TCPServer):
    """hypercorn's trio connection handler, leaving no reference cycle once it has run."""

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            for name in _CYCLE_ATTRIBUTES:
                self.__dict__.pop(name, None)


def install() -> bool:
    """Have hypercorn's trio worker serve connections with :class:`TidyTCPServer`
    (idempotent); False (and hypercorn left as it is) where this hypercorn does not fit."""
    current = getattr(hypercorn.trio.run, "TCPServer", None)
    if current is TidyTCPServer:
        return True
    if current is not TCPServer or not callable(getattr(TCPServer, "run", None)):
        log.warning("this hypercorn's trio worker does not build hypercorn.trio.tcp_server."
                    "TCPServer: closed connections are left to the cyclic collector")
        return False
    hypercorn.trio.run.TCPServer = TidyTCPServer  # type: ignore[misc]
    return True

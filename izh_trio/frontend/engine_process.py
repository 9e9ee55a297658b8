"""The engine core as a child process: spawn it, hand its pipes out as trio streams, reap it.

Nothing here speaks the protocol: :class:`~izh_trio.frontend.engine_client.EngineClient`
does, over the two streams, and :func:`run_core` joins the two. The core exits on EOF on its
input pipe, so closing our end of it is how it is told to go when it no longer listens.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

from izh_trio.frontend.engine_client import EngineClient
from izh_trio.wire import EngineConfig
from izh_trio.wire.codec import converter

log = logging.getLogger(__name__)


@attrs.frozen
class CoreProcess:
    process: trio.Process
    to_core: trio.lowlevel.FdStream
    from_core: trio.lowlevel.FdStream


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


@asynccontextmanager
async def open_core_process(config: EngineConfig, *, shutdown_timeout: float = 10.0
                            ) -> AsyncIterator[CoreProcess]:
    """Spawn the core; on the way out close our pipe ends, wait ``shutdown_timeout`` s for it
    to exit (SIGKILL after that) and log how it exited."""
    child_in, parent_out = os.pipe()
    parent_in, child_out = os.pipe()
    cmd = [sys.executable, "-m", "izh_trio.engine", "--in-fd", str(child_in),
           "--out-fd", str(child_out), "--config", json.dumps(converter.unstructure(config))]
    try:
        # A process group of its own: a terminal's Ctrl-C (sent to the foreground group)
        # reaches only the server, which drains before it stops the core; had it reached
        # the core while Python was still starting, before the core could ignore it,
        # the core would die with a fatal error mid-start.
        process = await trio.lowlevel.open_process(
            cmd, pass_fds=(child_in, child_out), stdin=subprocess.DEVNULL, process_group=0
        )
    except BaseException:
        os.close(parent_out)
        os.close(parent_in)
        raise
    finally:
        os.close(child_in)
        os.close(child_out)
    core = CoreProcess(process, trio.lowlevel.FdStream(parent_out),
                       trio.lowlevel.FdStream(parent_in))
    try:
        yield core
    finally:
        with trio.CancelScope(shield=True):
            await core.to_core.aclose()  # EOF: the core stops, if nothing told it to already
            await core.from_core.aclose()
            await _reap(process, shutdown_timeout)


async def _reap(process: trio.Process, timeout: float) -> None:
    with trio.move_on_after(timeout):
        await process.wait()
    if process.returncode is None:
        log.warning("engine core did not exit in %.0fs; killing it", timeout)
        process.send_signal(signal.SIGKILL)
        await process.wait()
    assert process.returncode is not None
    level = logging.INFO if process.returncode == 0 else logging.WARNING
    log.log(level, "engine core (pid %d) %s", process.pid, _describe_exit(process.returncode))


async def run_core(config: EngineConfig, client: EngineClient, *,
                   shutdown_timeout: float = 10.0,
                   task_status: trio.TaskStatus[EngineClient] = trio.TASK_STATUS_IGNORED
                   ) -> None:
    """Spawn a core and serve ``client`` over its pipes until either ends; started (with the
    client) once the core is ready; raises ``EngineUnavailable`` if it never is."""
    async with open_core_process(config, shutdown_timeout=shutdown_timeout) as core:
        await client.run(core.to_core, core.from_core, task_status=task_status)

"""The engine core as a child process: frames in on one fd, frames out on another.

The loop blocks on the pipe only when there is no work; otherwise it drains whatever arrived
and steps. A reader thread turns bytes into messages so a step never waits on I/O.

EOF on the input pipe ends the process: the kernel closes the server's end when the server
exits for any reason, SIGKILL included, and no other process holds it (it is close-on-exec).
PDEATHSIG is deliberately not used: it fires when the *thread* that forked us exits, and trio
spawns processes from a worker thread that its thread cache retires after a few idle seconds.

SIGINT and SIGTERM are ignored. The server drains its in-flight requests when it gets either,
which needs this process to go on stepping until the server says Shutdown or goes away. The
server spawns it in a process group of its own, out of a terminal's Ctrl-C; a service
manager that signals every process of the service (systemd's default) still reaches it.
SIGKILL ends it at once.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import logging
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import MutableMapping

from izh_trio.engine.cpu_load import SPREAD_MIN_WEIGHT_BYTES, checkpoint_bytes
from izh_trio.wire import (
    Abort,
    AddRequest,
    EngineConfig,
    Fatal,
    FrameDecoder,
    LoadLora,
    Message,
    ProtocolError,
    Shutdown,
    StepOutputs,
    UnloadLora,
    encode_frame,
    log_format,
)
from izh_trio.wire.codec import converter

log = logging.getLogger("izh_trio.engine")
#: What the reader thread hands the loop: a message, the error that stopped it, or None at EOF.
_Inbound = Message | ProtocolError | OSError | None


def _read_frames(fd: int, inbox: queue.SimpleQueue[_Inbound]) -> None:
    decoder = FrameDecoder()
    try:
        while data := os.read(fd, 1 << 16):
            for msg in decoder.feed(data):
                inbox.put(msg)
    except (ProtocolError, OSError) as exc:
        inbox.put(exc)
        return
    inbox.put(None)


class _Writer:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, messages: list[Message]) -> None:
        view = memoryview(encode_frame(messages))
        while view:
            view = view[os.write(self.fd, view) :]


#: glibc ``mallopt`` parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory() -> bool:
    """Let glibc keep the step's activations' memory between steps instead of handing it
    back to the kernel: by default a tensor over 128 KiB is a fresh ``mmap`` (and ``brk``
    trims the heap's top), so every step page-faults its activations in again
    (``tools/bench/results/cpu-kernels.md``). Blocks up to 32 MiB (glibc's ceiling) come from the
    heap, which is never trimmed below 1 GiB; the engine's memory then stays at its peak, as a
    server's does anyway. No-op where the C library is not glibc."""
    libc_name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(libc_name) if libc_name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD,
                                                                         1 << 30))


#: Test-only: seconds to pause after each step while work remains, so that a test's long
#: request is still running when the test acts on it, however fast the machine (the e2e tests'
#: ``PACED``). Unset, as it always is when serving: no pause and no cost.
TEST_STEP_DELAY_ENV = "IZH_TEST_STEP_DELAY"


#: libgomp spin-waits this many ``pause`` loops for more work before it sleeps (well under a
#: millisecond, where its default spins for several)
OPENMP_SPIN_COUNT = "2000"


def stop_idle_openmp_spinning(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Make torch's idle OpenMP threads sleep soon after a parallel region, not spin on.

    libgomp's default keeps a worker spinning for milliseconds after every parallel region in
    case another follows. Within a step one does, microseconds later; after a two-thread step
    it does not, and the spinning worker holds the core the HTTP process and the client need
    (``tools/bench/results/cpu-kernels.md``). Must run before torch loads libgomp (it reads
    the variable once); a user's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` wins."""
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return False
    environ["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT
    return True


def serve(config: EngineConfig, in_fd: int, out_fd: int) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):  # the server decides when we stop
        signal.signal(sig, signal.SIG_IGN)
    if config.device.startswith("cpu"):
        keep_freed_memory()  # before torch allocates anything
        # A model that spreads its decode steps over every core runs a parallel region per
        # linear: a worker put to sleep after each pays a wake-up in every one of them (a
        # third of a 0.6B bf16 step). Its frontend is idle when it spreads: let workers spin.
        if checkpoint_bytes(config.model_dir) < SPREAD_MIN_WEIGHT_BYTES:
            stop_idle_openmp_spinning()
    from izh_trio.engine.core import EngineCore  # torch loads here, after the fds are safe

    out = _Writer(out_fd)
    inbox: queue.SimpleQueue[_Inbound] = queue.SimpleQueue()
    threading.Thread(target=_read_frames, args=(in_fd, inbox), daemon=True,
                     name="izh-engine-reader").start()
    try:
        core = EngineCore(config)
    except Exception as exc:
        # The frontend reports the reason; the traceback is for whoever debugs the engine.
        log.error("engine failed to start: %s (IZH_ENGINE_LOG_LEVEL=DEBUG shows where)", exc)
        log.debug("engine start-up traceback", exc_info=True)
        out.send([Fatal(f"engine failed to start: {exc}")])
        return 1
    gc.collect()
    gc.freeze()  # the model and its modules: never walked by a collection again
    out.send([core.ready()])
    step_delay = max(0.0, float(os.environ.get(TEST_STEP_DELAY_ENV) or 0.0))
    if step_delay:
        log.warning("%s=%g: every step is followed by a pause (for tests only)",
                    TEST_STEP_DELAY_ENV, step_delay)

    while True:
        msgs = []
        if not core.has_work:
            core.idle()
            msgs.append(inbox.get())
        while True:
            try:
                msgs.append(inbox.get_nowait())
            except queue.Empty:
                break
        replies: list[Message] = []
        changed = False
        for msg in msgs:
            if msg is None or isinstance(msg, Shutdown):
                return 0
            if isinstance(msg, Exception):
                out.send([Fatal(f"protocol error from the frontend: {msg}")])
                return 2
            if isinstance(msg, AddRequest):
                failed = core.add_request(msg)
                if failed is not None:
                    replies.append(failed)
            elif isinstance(msg, Abort):
                core.abort(msg.request_ids)
            elif isinstance(msg, LoadLora | UnloadLora):
                replies.append(core.update_lora(msg))
            changed = True
        if core.has_work:
            try:
                outputs = core.step()
            except Exception:
                log.exception("engine step failed")
                out.send([Fatal("engine step failed: " + traceback.format_exc(limit=4))])
                return 3
            if outputs:
                replies.append(StepOutputs(outputs))
            replies += core.take_failures()
            changed = True
        if changed:
            replies.append(core.stats())
        if replies:
            out.send(replies)
        if step_delay and core.has_work:
            time.sleep(step_delay)  # messages that arrive meanwhile are read next iteration


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="izh_trio.engine")
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    parser.add_argument("--config", required=True, help="EngineConfig as JSON")
    args = parser.parse_args(argv)
    config = converter.structure(json.loads(args.config), EngineConfig)
    log_format.configure(os.environ.get("IZH_ENGINE_LOG_LEVEL", "INFO"), config.log_format)
    try:
        return serve(config, args.in_fd, args.out_fd)
    except BrokenPipeError:
        return 0  # the server went away while we were writing

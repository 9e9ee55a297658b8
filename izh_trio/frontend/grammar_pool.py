"""Grammar workers, from the HTTP process's side: a small pool, started on demand.

A job takes a free worker (or waits for one, boundedly), sends the grammar down its pipe
and waits for the verdict, all on trio's own pipe streams: the event loop never blocks. A
job over its time bound has its worker killed (``GrammarTimeout``); a worker that dies under
a job (SIGSEGV from a native stack overflow) fails that job alone (``GrammarCrashed``) and
is logged once, as a warning; a job whose request is cancelled kills its worker too (a
worker holds one job at a time, and the answer to a cancelled one is of no use). A killed
or dead worker is replaced by a fresh one when a job next needs it. Other requests, and
``/health``, never wait on any of this.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import attrs
import trio

from izh_trio.frontend.grammar_worker import (
    FrameBuffer,
    Hello,
    Job,
    Message,
    Parsed,
    ParseJob,
    Verdict,
    encode,
)
from izh_trio.wire import converters

log = logging.getLogger(__name__)
_Answer = TypeVar("_Answer", Verdict, Parsed)  # what a job is answered with


def job_stack_bytes() -> int:
    """Half the stack the engine core compiles on (its main thread's: the stack limit,
    which it inherits from this process, as the worker does), at most 4 MiB."""
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    engine = 8 << 20 if soft == resource.RLIM_INFINITY else min(soft, 8 << 20)
    return max(engine // 2, 1 << 20)


@attrs.frozen
class WorkerSpec:
    """What a worker needs to compile as the engine does."""

    tokenizer_path: Path
    vocab_size: int
    eos_token_ids: tuple[int, ...] = attrs.field(converter=converters.ints)


@attrs.frozen
class PoolSettings:
    #: Workers at most: one slow grammar leaves the other free; each holds a tokenizer.
    workers: int = 2
    #: A job's time bound: compiles take milliseconds; a bounded grammar takes < 1 s.
    job_timeout: float = 5.0
    #: How long a job waits for a free worker, and how many may wait, before a 503.
    queue_timeout: float = 10.0
    max_waiting: int = 64
    #: A worker's start (Python, llguidance and the tokenizer: about a second).
    startup_timeout: float = 60.0
    stack_bytes: int = attrs.field(factory=job_stack_bytes)


class GrammarTimeout(Exception):
    """The job ran past its time bound; its worker was killed."""


class GrammarCrashed(Exception):
    """The worker died under the job."""


class GrammarBusy(Exception):
    """No worker came free in time, or too many jobs wait already."""


class GrammarUnavailable(Exception):
    """A worker could not be started."""


@attrs.define
class _Worker:
    process: trio.Process
    to_worker: trio.lowlevel.FdStream
    from_worker: trio.lowlevel.FdStream
    frames: FrameBuffer = attrs.Factory(FrameBuffer)
    pending: list[Message] = attrs.Factory(list)

    async def receive(self) -> Message | None:
        """The next message; None once the worker is gone (or says nothing sensible)."""
        while not self.pending:
            try:
                data = await self.from_worker.receive_some(1 << 16)
                if not data:
                    return None
                self.pending += self.frames.feed(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, ValueError):
                return None
        return self.pending.pop(0)

    async def stop(self) -> None:
        """Kill and reap (shielded: a cancelled job must still leave no process behind)."""
        with trio.CancelScope(shield=True):
            if self.process.returncode is None:
                self.process.kill()
            await self.process.wait()
            await self.to_worker.aclose()
            await self.from_worker.aclose()


def _describe(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


class GrammarPool:
    def __init__(self, spec: Callable[[], WorkerSpec],
                 settings: PoolSettings | None = None) -> None:
        self._spec = spec  # called at a worker's start: the model is known by then
        self.settings = settings or PoolSettings()
        self._idle: list[_Worker] = []
        self._free = trio.Semaphore(self.settings.workers)
        self._waiting = 0
        self._closed = False
        self.crashes = 0  # workers that died under a job (tests, metrics)

    async def check(self, grammar: str) -> str | None:
        """Compile ``grammar`` in a worker: None, or the library's (raw) error."""
        reply = await self._job(Job(grammar), Verdict, "compiling a request's grammar")
        return reply.error

    async def parse_json(self, chunks: list[bytes], bounded: tuple[str, ...] = (),
                         longest: int | None = None, most_items: int | None = None
                         ) -> Parsed:
        """Parse a big request body, in ``chunks``, in a worker (``json_input.loads``); a
        string of more than ``longest`` characters, or an array or object of more than
        ``most_items`` members, in one of its ``bounded`` top-level fields is reported, not
        sent back."""
        job = ParseJob(sum(map(len, chunks)), longest=longest, most_items=most_items,
                       bounded=bounded)
        return await self._job(job, Parsed,
                               "parsing a request body", chunks)

    async def _job(self, job: Job | ParseJob, answer: type[_Answer], what: str,
                   chunks: Sequence[bytes] = ()) -> _Answer:
        if self._closed:
            raise GrammarUnavailable("the server is shutting down")
        if self._waiting >= self.settings.max_waiting:
            raise GrammarBusy(f"{self._waiting} grammars are waiting already")
        self._waiting += 1
        try:
            with trio.move_on_after(self.settings.queue_timeout) as scope:
                await self._free.acquire()
            if scope.cancelled_caught:
                raise GrammarBusy("no grammar worker came free in time")
        finally:
            self._waiting -= 1
        try:
            return await self._run(await self._worker(), job, answer, what, chunks)
        finally:
            self._free.release()

    async def _worker(self) -> _Worker:
        """An idle worker that is still alive, else a new one."""
        while self._idle:
            worker = self._idle.pop()
            if worker.process.returncode is None:
                return worker
            log.warning("grammar worker %d died while idle (%s); starting another",
                        worker.process.pid, _describe(worker.process.returncode))
            await worker.stop()
        return await self._start()

    async def _run(self, worker: _Worker, job: Job | ParseJob, answer: type[_Answer], what: str,
                   chunks: Sequence[bytes]) -> _Answer:
        keep = False
        try:
            with trio.move_on_after(self.settings.job_timeout) as scope:
                try:
                    await worker.to_worker.send_all(encode(job))
                    for chunk in chunks:  # a ParseJob's document follows its frame, raw
                        await worker.to_worker.send_all(chunk)
                    reply = await worker.receive()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    reply = None
            if scope.cancelled_caught:
                log.warning("grammar worker %d took over %gs %s; killed it",
                            worker.process.pid, self.settings.job_timeout, what)
                raise GrammarTimeout(f"over {self.settings.job_timeout:g} s")
            if not isinstance(reply, answer):
                with trio.move_on_after(1.0):
                    await worker.process.wait()
                self.crashes += 1
                log.warning("grammar worker %d died (%s) while %s; that request fails, a new "
                            "worker starts when one is needed",
                            worker.process.pid, _describe(worker.process.returncode), what)
                raise GrammarCrashed(_describe(worker.process.returncode))
            keep = not self._closed
            return reply
        finally:
            if keep:
                self._idle.append(worker)
            else:
                await worker.stop()

    async def _start(self) -> _Worker:
        try:
            spec = self._spec()
        except Exception as exc:  # the engine went away meanwhile: no vocabulary to use
            raise GrammarUnavailable(f"no model to compile for: {exc!r}") from None
        child_in, parent_out = os.pipe()
        parent_in, child_out = os.pipe()
        cmd = [sys.executable, "-m", "izh_trio.frontend.grammar_worker",
               "--in-fd", str(child_in), "--out-fd", str(child_out),
               "--tokenizer", str(spec.tokenizer_path), "--vocab-size", str(spec.vocab_size),
               "--eos", ",".join(map(str, spec.eos_token_ids)),
               "--stack-bytes", str(self.settings.stack_bytes)]
        try:
            # A process group of its own, as the engine core's: a terminal's Ctrl-C goes to
            # the server alone, which drains.
            process = await trio.lowlevel.open_process(
                cmd, pass_fds=(child_in, child_out), stdin=subprocess.DEVNULL,
                process_group=0)
        except OSError as exc:
            for fd in (parent_in, parent_out):
                os.close(fd)
            raise GrammarUnavailable(f"cannot start a grammar worker: {exc}") from None
        finally:
            os.close(child_in)
            os.close(child_out)
        worker = _Worker(process, trio.lowlevel.FdStream(parent_out),
                         trio.lowlevel.FdStream(parent_in))
        hello = None
        try:
            with trio.move_on_after(self.settings.startup_timeout):
                hello = await worker.receive()
        finally:
            if not (isinstance(hello, Hello) and hello.error is None):
                await worker.stop()
        if not isinstance(hello, Hello) or hello.error is not None:
            why = hello.error if isinstance(hello, Hello) else "it did not start in time"
            log.warning("a grammar worker could not start: %s", why)
            raise GrammarUnavailable(why)
        return worker

    async def aclose(self) -> None:
        """Stop the idle workers; a busy one stops when its job ends."""
        self._closed = True
        while self._idle:
            await self._idle.pop().stop()

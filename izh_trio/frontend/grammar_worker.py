"""The grammar worker: a subprocess that compiles request grammars, so that a crash is its own.

llguidance is native code: a grammar that overflows its stack kills the process it runs in
with SIGSEGV. Compiled in the HTTP process, one request would take the server down, and
the engine with it. Compiled here, it takes down this worker, whose parent fails that one
request and starts another worker (``grammar_pool``).

Each job is compiled as the engine compiles it (``engine/guided.py``): an ``LLMatcher`` on
an ``LLTokenizer`` built from the checkpoint's ``tokenizer.json`` with the model's vocabulary
size and eos tokens, then its first token mask. So a grammar the engine cannot compile is
refused here first, with its error. The job runs on a thread whose stack is half the
engine's (the parent passes its size): a grammar within a factor of two of overflowing the
engine's stack overflows this one first.

It also parses request bodies of megabytes (``ParseJob``): orjson holds the GIL for the whole parse,
so no thread of the HTTP process can take that off its event loop; here it costs the loop only the
copy back (msgpack).

Messages go over a pipe pair as length-prefixed msgpack frames. The worker ignores SIGINT
and SIGTERM, like the engine core (a terminal's Ctrl-C or a service manager must not kill a
job under the drain), and exits when its input pipe closes: it never outlives the server.
Imports nothing of the frontend's (no trio, no quart) and never torch.
"""

from __future__ import annotations

import argparse
import os
import signal
import struct
import threading
from pathlib import Path
from typing import Any, BinaryIO

import attrs
import msgpack

_LEN = struct.Struct(">I")
#: A grammar is bounded well below this (``grammar_limits``), a body by --max-body-bytes;
#: anything larger is corruption.
MAX_FRAME = 1 << 30


@attrs.frozen
class Hello:
    """The worker's first message: ready (its tokenizer built), or why it cannot be."""

    pid: int
    error: str | None = None


@attrs.frozen
class Job:
    grammar: str


@attrs.frozen
class Verdict:
    """A job's outcome: None, or llguidance's error (raw: the parent cleans it)."""

    error: str | None


@attrs.frozen
class ParseJob:
    """A client's JSON document, to parse as ``json_input.loads`` does. On the pipe the
    frame carries only ``size``; the document's bytes follow it raw (no copy of megabytes
    into a frame on the event loop), and the reader attaches them as ``data``."""

    size: int
    data: bytes = b""
    #: The longest string the document's ``bounded`` top-level fields may hold, in
    #: characters (None: any), and the most members an array or object there may have: a
    #: bigger one is reported, not sent back (``Parsed.too_long``).
    longest: int | None = None
    most_items: int | None = None
    bounded: tuple[str, ...] = ()


@attrs.frozen
class Parsed:
    """The parsed value, or why it was refused (``json_input.JSONInputError``'s parts), or
    the length of a string longer than the job allowed (then no value: a string of
    megabytes, decoded on the parent's event loop, would stall it for its page faults)."""

    value: Any = None
    error: str | None = None
    field: str | None = None
    too_long: int | None = None  # the size of what was too big: characters, or members
    too_long_kind: str = "text"  # "text" (a string) or "array" (an array or object)


Message = Hello | Job | Verdict | ParseJob | Parsed
_TYPES = {cls.__name__: cls for cls in (Hello, Job, Verdict, ParseJob, Parsed)}


def encode(msg: Message) -> bytes:
    fields = attrs.asdict(msg, recurse=False)
    if isinstance(msg, ParseJob):
        del fields["data"]  # sent raw after the frame
    body: bytes = msgpack.packb([type(msg).__name__, fields])
    return _LEN.pack(len(body)) + body


def decode(body: bytes | memoryview) -> Message:
    """One frame's message; ValueError for anything that is not exactly one."""
    try:
        name, fields = msgpack.unpackb(body)
        return _TYPES[name](**fields)
    except Exception as exc:  # any malformed frame, whatever msgpack or attrs raise
        raise ValueError(f"bad grammar worker frame: {exc!r}") from None


class FrameBuffer:
    """Bytes in, whole messages out (either side's reader)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._raw_for: ParseJob | None = None  # a job whose raw document is still arriving

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while True:
            if self._raw_for is not None:
                size = self._raw_for.size
                if len(self._buf) < size:
                    break
                out.append(attrs.evolve(self._raw_for, data=bytes(self._buf[:size])))
                del self._buf[:size]
                self._raw_for = None
                continue
            if len(self._buf) < _LEN.size:
                break
            (size,) = _LEN.unpack_from(self._buf)
            if size > MAX_FRAME:
                raise ValueError(f"grammar worker frame of {size} bytes")
            if len(self._buf) < _LEN.size + size:
                break
            with memoryview(self._buf) as view:  # a frame of megabytes is not copied first
                msg = decode(view[_LEN.size:_LEN.size + size])
            del self._buf[:_LEN.size + size]
            if isinstance(msg, ParseJob):
                if not 0 <= msg.size <= MAX_FRAME:
                    raise ValueError(f"a document of {msg.size} bytes")
                self._raw_for = msg
            else:
                out.append(msg)
        return out


def compile_error(llguidance: Any, tokenizer: Any, grammar: str) -> str | None:
    """The engine's construction (``GuidedDecoding.add``) and its first mask: None, or why
    the grammar cannot be used."""
    try:
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        if not matcher.is_error():
            matcher.compute_bitmask()  # lexers are built lazily: this builds the first
        return (matcher.get_error() or "invalid grammar") if matcher.is_error() else None
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # a Rust panic comes as pyo3's PanicException
        return str(exc) or type(exc).__name__


def _parse(job: ParseJob) -> Parsed:
    from izh_trio.frontend import json_input  # orjson and the standard library only

    try:
        value = json_input.loads(job.data)
    except json_input.JSONInputError as exc:
        return Parsed(error=exc.message, field=exc.field)
    found = _overlong(value, job.bounded, job.longest, job.most_items)
    if found is not None:
        field, size, kind = found
        return Parsed(field=field, too_long=size, too_long_kind=kind)
    return Parsed(value)


def _overlong(document: Any, bounded: tuple[str, ...], longest: int | None,
              most_items: int | None) -> tuple[str, int, str] | None:
    """The first of the ``bounded`` top-level fields holding a string (a value or a key) of
    more than ``longest`` characters or an array or object of more than ``most_items``
    members, its size and its kind; None if there is none."""
    if not isinstance(document, dict) or (longest is None and most_items is None):
        return None
    for top in bounded:
        if top not in document:
            continue
        stack = [document[top]]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                if longest is not None and len(item) > longest:
                    return top, len(item), "text"
            elif isinstance(item, dict | list):
                if most_items is not None and len(item) > most_items:
                    return top, len(item), "array"
                if isinstance(item, dict):
                    stack += item.keys()
                    stack += item.values()
                else:
                    stack += item
    return None


def _serve(inp: BinaryIO, out: BinaryIO, args: argparse.Namespace) -> None:
    try:
        import llguidance  # here, not at the top: the parent imports this module's messages

        eos = [int(t) for t in args.eos.split(",") if t]
        tokenizer = llguidance.LLTokenizer(Path(args.tokenizer).read_text(),
                                           n_vocab=args.vocab_size, eos_token=eos or None)
    except Exception as exc:  # reported to the parent, which logs it; no traceback here
        _send(out, Hello(os.getpid(), f"{type(exc).__name__}: {exc}"))
        return
    _send(out, Hello(os.getpid()))
    frames = FrameBuffer()
    while data := inp.read(1 << 16):
        for msg in frames.feed(data):
            if isinstance(msg, Job):
                _send(out, Verdict(compile_error(llguidance, tokenizer, msg.grammar)))
            elif isinstance(msg, ParseJob):
                _send(out, _parse(msg))


def _run(inp: BinaryIO, out: BinaryIO, args: argparse.Namespace) -> None:
    try:
        _serve(inp, out, args)
    except (ValueError, OSError):
        return  # a garbled frame or a closed pipe: the parent sees this worker end


def _send(out: BinaryIO, msg: Message) -> None:
    view = memoryview(encode(msg))
    while view:  # a raw pipe write may take only part of a large frame
        view = view[out.write(view) or 0:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="izh_trio.frontend.grammar_worker")
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--eos", default="")
    parser.add_argument("--stack-bytes", type=int, default=4 << 20)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with os.fdopen(args.in_fd, "rb", buffering=0) as inp, \
            os.fdopen(args.out_fd, "wb", buffering=0) as out:
        threading.stack_size(args.stack_bytes)  # the jobs' thread: see the module
        job_thread = threading.Thread(target=_run, args=(inp, out, args),
                                      name="grammar-jobs", daemon=True)
        job_thread.start()
        job_thread.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

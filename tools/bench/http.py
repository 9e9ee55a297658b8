"""A lean HTTP/1.1 client on trio for a streaming load generator, plain http only.

httpx cost the load generator ~90 us of CPU per streamed token; on a 2-core box that CPU is
taken from the server being measured. Here one reader task watches every open response
through a selector and feeds the bytes to each request's sink as they arrive: one trio
wakeup per batch of ready sockets instead of a task switch, a failed ``recv`` and a stack of
stream wrappers per read. Requests still connect and send from their own tasks, and reuse
keep-alive sockets from a small pool.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
from typing import Protocol
from urllib.parse import urlsplit

import trio

from tools.bench.framing import (
    CLOSE,
    ConnectError,
    HTTPError,
    RemoteProtocolError,
    Response,
    parse_head,
)

__all__ = ["ConnectError", "HTTPClient", "HTTPError", "RemoteProtocolError", "Response", "Sink"]

RECEIVE_SIZE = 65536
DRAIN_S = 2.0  # a body still open after the sink is satisfied gets this long to end


class _NoReply(RemoteProtocolError):
    """The connection ended before any byte of a reply: on a reused socket, a stale one."""


class Sink(Protocol):
    """Where a response goes: its head once, then body pieces with their arrival time."""

    def head(self, resp: Response) -> None: ...

    def body(self, data: bytes, now: float) -> bool:
        """Consume a piece (b"" marks the end of the body); True once nothing more is needed."""
        ...


class Exchange:
    """One request's response on one socket, fed by the reader task when bytes arrive."""

    def __init__(self, sock: socket.socket, sink: Sink) -> None:
        self.sock, self.sink = sock, sink
        self.rest = b""  # received, not yet framed
        self.resp: Response | None = None
        self.error: Exception | None = None
        self.satisfied = False
        self.settled = trio.Event()  # the sink has all it wants, or the exchange failed
        self.finished = trio.Event()  # the body was read to its end, or the exchange failed
        self.ended = False  # the body was read to its end

    def on_readable(self) -> bool:
        """Read once and feed the sink; False once the socket needs no more watching."""
        try:
            data = self.sock.recv(RECEIVE_SIZE)
        except BlockingIOError:
            return True
        except OSError as exc:
            self._fail(_NoReply(str(exc)) if not (self.resp or self.rest)
                       else RemoteProtocolError(f"connection broken: {exc}"))
            return False
        now = time.perf_counter()
        try:
            self._feed(data, now)
        except Exception as exc:  # the sink's own verdict, or bad framing
            self._fail(exc)
        return not (self.ended or self.error)

    def _feed(self, data: bytes, now: float) -> None:
        resp = self.resp
        if not data:  # end of stream
            if resp is None:
                raise _NoReply() if not self.rest else RemoteProtocolError("EOF mid-head")
            if resp.mode != CLOSE:
                raise RemoteProtocolError("server closed the connection mid-body")
            resp.complete = True
        b = self.rest + data if self.rest else data
        if resp is None:
            resp, b = parse_head(b)
            if resp is None:
                self.rest = b
                return
            self.resp = resp
            self.sink.head(resp)
        piece, self.rest = resp.take(b) if b else (b"", b"")
        if piece and not self.satisfied:
            self.satisfied = self.sink.body(piece, now)
        if resp.complete:
            if not self.satisfied:
                self.satisfied = self.sink.body(b"", now) or True
            self.ended = True
            self.finished.set()
        if self.satisfied:
            self.settled.set()

    def _fail(self, exc: Exception) -> None:
        self.error = exc
        self.settled.set()
        self.finished.set()


class HTTPClient:
    """A keep-alive pool for one base URL (at most ``max_connections`` sockets, LIFO reuse)
    and the reader task, started with the first request; ``close()`` (or ``async with``)
    ends both.

    A socket goes back to the pool only after its response was read to the end and the
    server did not ask to close it; a pooled socket the server closed meanwhile is replaced
    (and a request that met one is retried on another socket).
    """

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None,
                 max_connections: int = 64, connect_timeout: float = 30.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"only plain http:// base URLs are supported, not {base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self._prefix = parts.path.rstrip("/")
        fields = {"Host": parts.netloc.rpartition("@")[2]} | (headers or {})
        self._head = "".join(f"{k}: {v}\r\n" for k, v in fields.items())
        self._connect_timeout = connect_timeout
        self._slots = trio.Semaphore(max_connections)
        self._idle: list[socket.socket] = []
        self._selector = selectors.DefaultSelector()
        self._reader_scope: trio.CancelScope | None = None
        self.opened = 0  # sockets connected so far, for tests and curiosity

    async def __aenter__(self) -> HTTPClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the pooled sockets and stop the reader (in-flight requests are not ended)."""
        while self._idle:
            _close(self._idle.pop())
        if self._reader_scope is None:
            self._selector.close()
        else:  # the reader closes the selector on its way out
            self._reader_scope.cancel()

    async def _reader(self) -> None:
        """Wake when any watched socket is readable, and serve them all in one go.

        A system task: it lives as long as the client and never raises, so it needs no
        nursery (one around the caller's code would wrap its exceptions in groups).
        """
        assert self._reader_scope is not None
        fd = self._selector.fileno()  # type: ignore[attr-defined]
        try:
            with self._reader_scope:
                while True:
                    await trio.lowlevel.wait_readable(fd)
                    for key, _ in self._selector.select(0):
                        if not key.data.on_readable():
                            self._selector.unregister(key.fileobj)
        finally:
            self._selector.close()

    def request(self, path: str, body: bytes, content_type: str = "application/json") -> bytes:
        """The whole POST, head and body, serialised once."""
        head = (f"POST {self._prefix}{path} HTTP/1.1\r\n{self._head}"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n")
        return head.encode("latin-1") + body

    async def post(self, path: str, body: bytes, sink: Sink) -> Response:
        """Send one POST and feed its response to ``sink``; returns once the sink is satisfied
        (or the body ended). Raises ``HTTPError`` for trouble, or what the sink raised."""
        if self._reader_scope is None:
            self._reader_scope = trio.CancelScope()
            trio.lowlevel.spawn_system_task(self._reader)
        request = self.request(path, body)
        async with self._slots:
            while True:
                sock = self._reusable()
                reused = sock is not None
                if sock is None:
                    sock = await self._connect()
                ex = Exchange(sock, sink)
                try:
                    await _send_all(sock, request)
                    self._selector.register(sock, selectors.EVENT_READ, ex)
                    await ex.settled.wait()
                    if not ex.finished.is_set():
                        with trio.move_on_after(DRAIN_S):  # the rest, to keep the socket
                            await ex.finished.wait()
                except trio.BrokenResourceError as exc:
                    self._drop(sock)
                    if reused:
                        continue  # a stale keep-alive socket
                    raise RemoteProtocolError(str(exc)) from exc
                except BaseException:
                    self._drop(sock)
                    raise
                if ex.ended and not ex.error and ex.resp and ex.resp.keep_alive and not ex.rest:
                    self._unwatch(sock)
                    self._idle.append(sock)
                else:
                    self._drop(sock)
                if isinstance(ex.error, _NoReply):
                    if reused:
                        continue  # a stale keep-alive socket: the server never answered
                    raise RemoteProtocolError(
                        f"server closed the connection without a reply {ex.error}".strip())
                if ex.error is not None and not ex.satisfied:
                    raise ex.error
                assert ex.resp is not None
                return ex.resp

    def _unwatch(self, sock: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)

    def _drop(self, sock: socket.socket) -> None:
        self._unwatch(sock)
        _close(sock)

    def _reusable(self) -> socket.socket | None:
        """A pooled socket with nothing to read (readable while idle means EOF or junk)."""
        while self._idle:
            sock = self._idle.pop()
            try:
                sock.recv(1, socket.MSG_PEEK)  # non-blocking: raises when there's nothing
            except BlockingIOError:
                return sock
            except OSError:
                pass
            _close(sock)
        return None

    async def _connect(self) -> socket.socket:
        where = f"{self.host}:{self.port}"
        try:
            with trio.fail_after(self._connect_timeout):
                tcp = await trio.open_tcp_stream(self.host, self.port)  # resolves, sets NODELAY
        except trio.TooSlowError:
            raise ConnectError(f"connect to {where} timed out") from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {where}: {exc}") from exc
        self.opened += 1
        # the plain socket out of trio's wrapper: still non-blocking, same file descriptor
        return socket.socket(fileno=tcp.socket.detach())


async def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
        except OSError as exc:
            raise trio.BrokenResourceError(f"send failed: {exc}") from exc


def _close(sock: socket.socket) -> None:
    if sock.fileno() >= 0:
        trio.lowlevel.notify_closing(sock)
        sock.close()

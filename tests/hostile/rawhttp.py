"""HTTP/1.1 by hand, for what httpx would not send: pipelines, malformed requests, raw bytes.

Loopback only, and every socket operation is bounded by a timeout, so a server that never
answers fails the test instead of hanging it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO
from urllib.parse import urlsplit

import attrs
import httpx

TIMEOUT = 30.0


@attrs.frozen
class RawResponse:
    status: int
    headers: dict[str, str]  # lower-case names; the last of repeated ones
    body: bytes

    def as_httpx(self) -> httpx.Response:
        """For the harness's ``openai_error``, which takes an httpx response."""
        return httpx.Response(self.status, headers=self.headers, content=self.body)

    @property
    def closes(self) -> bool:
        return self.headers.get("connection", "").lower() == "close"


def request(method: str, path: str, body: bytes = b"", headers: dict[str, bytes | str] | None
            = None) -> bytes:
    """One request's bytes: Host, a Content-Length when there is a body, then ``headers``."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1"]
    if body or method == "POST":
        lines.append(b"Content-Type: application/json")
        lines.append(b"Content-Length: %d" % len(body))
    for name, value in (headers or {}).items():
        lines.append(name.encode() + b": " + (value if isinstance(value, bytes)
                                              else value.encode()))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@contextmanager
def connect(base: str, timeout: float = TIMEOUT) -> Iterator[socket.socket]:
    url = urlsplit(base)
    assert url.hostname == "127.0.0.1", base  # never anything but loopback
    with socket.create_connection((url.hostname, url.port), timeout=timeout) as sock:
        yield sock


def read_response(reader: BinaryIO) -> RawResponse:
    """One response from a buffered reader of the socket (``sock.makefile("rb")``); only
    Content-Length framing, which every non-streamed answer here has."""
    status_line = reader.readline(65536)
    assert status_line, "the server closed the connection without an answer"
    version, status, *_ = status_line.decode("latin-1").split(" ", 2)
    assert version == "HTTP/1.1", status_line
    headers: dict[str, str] = {}
    while True:
        line = reader.readline(65536)
        assert line, "the connection ended inside the headers"
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    assert "transfer-encoding" not in headers, headers
    length = int(headers.get("content-length", "0"))
    body = reader.read(length)
    assert len(body) == length, (length, body)
    return RawResponse(int(status), headers, body)


def exchange(base: str, data: bytes, answers: int) -> tuple[list[RawResponse], bool]:
    """Send ``data`` at once, read ``answers`` responses; and whether the server then closed
    the connection. A close the last answer announces is waited for (up to ``TIMEOUT``, a
    bound against a hang, so a slow machine still counts it); otherwise one second with
    nothing read counts as open."""
    with connect(base) as sock:
        sock.sendall(data)
        reader = sock.makefile("rb")
        responses = [read_response(reader) for _ in range(answers)]
        sock.settimeout(TIMEOUT if responses and responses[-1].closes else 1.0)
        try:
            closed = reader.read(1) == b""
        except TimeoutError:
            closed = False
        return responses, closed

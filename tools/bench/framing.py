"""HTTP/1.1 response framing on plain bytes, push style: feed what arrived, get what's whole.

No I/O here, so the same code serves the reader task and the unit tests; each call takes
the bytes at hand and hands back what it could not use yet.
"""

from __future__ import annotations

import re

MAX_LINE = 65536  # the whole head, or one chunk-size/trailer line
_SIZE, _DATA_END, _TRAILER = range(3)  # chunked decoder states between chunks
CHUNKED, LENGTH, CLOSE = range(3)  # body framings
_HEX = frozenset(b"0123456789abcdefABCDEF")
_FRAME = re.compile(rb"([0-9A-Fa-f]{1,15})\r\n").match  # the usual size line


class HTTPError(Exception):
    """Network or protocol trouble; the message says what happened."""


class ConnectError(HTTPError):
    """No TCP connection to the server."""


class RemoteProtocolError(HTTPError):
    """The server broke HTTP/1.1 framing or hung up mid-response."""


class Response:
    """Status and headers, and the body framing RFC 9112 section 6 prescribes."""

    def __init__(self, version: str, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers
        tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
        self.keep_alive = ("close" not in tokens if version == "HTTP/1.1"
                           else "keep-alive" in tokens)
        self._state, self._left = _SIZE, 0
        te = headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        if status in (204, 304):
            self.mode = LENGTH
        elif te:  # chunked only when it is the last coding; anything else runs to EOF
            self.mode = CHUNKED if te.rsplit(",", 1)[-1].strip() == "chunked" else CLOSE
        elif length is not None:
            if not length.strip().isdigit():
                raise RemoteProtocolError(f"bad Content-Length {length!r}")
            self.mode, self._left = LENGTH, int(length)
        else:
            self.mode = CLOSE
        if self.mode == CLOSE:
            self.keep_alive = False
        self.complete = self.mode == LENGTH and self._left == 0

    def take(self, b: bytes) -> tuple[bytes, bytes]:
        """(body bytes decoded from ``b``, the bytes left over); sets ``complete`` at the end."""
        if self.mode == CHUNKED:
            return self._chunks(b)
        if self.mode == CLOSE:
            return b, b""
        n = min(self._left, len(b))
        self._left -= n
        self.complete = self._left == 0
        return b[:n], b[n:]

    def _chunks(self, b: bytes) -> tuple[bytes, bytes]:
        """Chunked framing: the chunk data ``b`` holds, with frames split anywhere."""
        out, pos, end = [], 0, len(b)
        while pos < end and not self.complete:
            if not self._left and self._state == _SIZE and (m := _FRAME(b, pos)):
                stop = m.end() + int(m[1], 16)
                if stop > m.end() and b[stop:stop + 2] == b"\r\n":  # a whole frame at once
                    out.append(b[m.end():stop])
                    pos = stop + 2
                    continue
            if self._left:  # inside a chunk's data
                n = min(self._left, end - pos)
                out.append(b[pos:pos + n])
                pos += n
                self._left -= n
                if not self._left:
                    self._state = _DATA_END
                continue
            i = b.find(b"\n", pos)
            if i < 0:
                if end - pos > MAX_LINE:
                    raise RemoteProtocolError("chunk framing line too long")
                break
            line = b[pos:i - 1] if b[i - 1:i] == b"\r" and i > pos else b[pos:i]
            pos = i + 1
            if self._state == _SIZE:
                digits = line.split(b";", 1)[0].strip()
                if not digits or not _HEX.issuperset(digits):
                    raise RemoteProtocolError(f"bad chunk size line {line[:40]!r}")
                self._left = int(digits, 16)
                if not self._left:
                    self._state = _TRAILER
            elif self._state == _DATA_END:
                if line:
                    raise RemoteProtocolError("chunk data not followed by CRLF")
                self._state = _SIZE
            elif not line:  # the empty line after the (usually absent) trailers
                self.complete = True
        data = out[0] if len(out) == 1 else b"".join(out)
        return data, b[pos:] if pos < end else b""


def parse_head(b: bytes) -> tuple[Response | None, bytes]:
    """(the response head at the front of ``b``, the bytes after it); 1xx interim responses
    are skipped, and the head is None while incomplete (all of ``b`` is handed back)."""
    while True:
        crlf, lf = b.find(b"\n\r\n"), b.find(b"\n\n")
        end = crlf + 3 if crlf >= 0 and (lf < 0 or crlf < lf) else lf + 2 if lf >= 0 else -1
        if end < 0:
            if len(b) > MAX_LINE:
                raise RemoteProtocolError("response head too long")
            return None, b
        lines = b[:end].decode("latin-1").split("\n")
        b = b[end:]
        version, _, rest = lines[0].rstrip("\r").partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise RemoteProtocolError(f"not an HTTP/1.x status line: {lines[0][:60]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                name, value = name.strip().lower(), value.strip()
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if not 100 <= int(code) < 200 or code == "101":
            return Response(version, int(code), headers), b

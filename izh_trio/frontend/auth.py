"""Bearer-key authentication: which paths need a key, and whether a request carries one.

Keys are compared as bytes: the UTF-8 bytes of each configured key (from ``--api-key``, the
environment or the keys file) against the raw bytes of the ``Authorization`` header. quart
hands headers over decoded as latin-1, so a key with any non-ASCII character could never
match a decoded header re-encoded as UTF-8; the raw bytes from the ASGI scope can.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence

#: Paths anyone may ask, keys or not: probes for load balancers and orchestrators, and the
#: server's self-description. Every other path needs a key when keys are configured (an
#: unknown path too: with no key it is a 401, not a 404 that would map the routes).
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/version", "/openapi.json"})


def key_bytes(keys: Iterable[str]) -> tuple[bytes, ...]:
    """The bytes a client must send for each key. ``surrogateescape``: a key that came from
    the command line or the environment as bytes that are not UTF-8 is matched by exactly
    those bytes (Python decoded them so)."""
    return tuple(key.encode("utf-8", "surrogateescape") for key in keys)


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The key a request carries, as sent: the token of its first ``Authorization: Bearer
    <token>`` header (OpenAI's clients), else its first ``x-api-key`` header (Anthropic's);
    b"" if it has neither (an Authorization header of another scheme carries no key)."""
    bearer: bytes | None = None
    api_key: bytes | None = None
    for name, value in headers:
        name = name.lower()
        if name == b"authorization" and bearer is None:
            scheme, _, token = value.strip().partition(b" ")
            bearer = token.strip() if scheme.lower() == b"bearer" else b""
        elif name == b"x-api-key" and api_key is None:
            api_key = value.strip()
    return bearer or api_key or b""


def authorized(token: bytes, keys: Sequence[bytes]) -> bool:
    """Whether ``token`` is one of ``keys``. Every key is compared, each in constant time, so
    timing reveals neither a match nor which key."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(token, key)
    return matched and bool(token)

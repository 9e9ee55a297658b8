"""OpenAI's ``system_fingerprint``: which backend configuration produced a response.

A short hash of the served model's name, the checkpoint's identity, the dtype it runs in and
this package's version, so that a client seeing it change knows answers may differ even for
a seeded request. Replicas serving the same checkpoint in the same way agree on it.

The checkpoint's identity is ``config.json`` and, for each ``*.safetensors`` file, its name,
size and last 64 KiB (tensor data, unlike the header): a different fine-tune of the same
architecture changes it, yet start-up reads a few hundred KiB, not gigabytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import trio

from izh_trio import __version__
from izh_trio.frontend.server import Server

_SAMPLE = 64 * 1024
#: One per configuration; a server process has one (computed on its first response).
_known: dict[tuple[str, Path | None, str], str] = {}


async def system_fingerprint(server: Server) -> str:
    key = (server.model_name, server.model_dir, server.ready.model.dtype)
    fingerprint = _known.get(key)
    if fingerprint is None:  # file reads: off the event loop, once
        fingerprint = await trio.to_thread.run_sync(compute, *key)
        _known[key] = fingerprint
    return fingerprint


def compute(model_name: str, model_dir: Path | None, dtype: str) -> str:
    digest = hashlib.sha256()
    for part in (model_name, dtype, __version__):
        digest.update(part.encode() + b"\0")
    for identity in _checkpoint_identity(model_dir) if model_dir is not None else ():
        digest.update(identity)
    return "fp_" + digest.hexdigest()[:10]


def _checkpoint_identity(model_dir: Path) -> Iterator[bytes]:
    config = model_dir / "config.json"
    if config.is_file():
        yield config.read_bytes()
    for weights in sorted(model_dir.glob("*.safetensors")):
        size = weights.stat().st_size
        yield f"{weights.name}\0{size}\0".encode()
        with weights.open("rb") as f:
            f.seek(max(0, size - _SAMPLE))
            yield f.read(_SAMPLE)

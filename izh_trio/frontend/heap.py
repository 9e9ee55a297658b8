"""The HTTP process hands memory back to the system after big requests (glibc's malloc).

Two things kept it. A big buffer (a 30 MB body, its text) is ``mmap``-ed and unmapped when
freed, but glibc then raises its mmap threshold to that buffer's size, so the next ones come
from the heap, where they stay. And tokenizing a big text leaves the tokenizer's many small
allocations as free but resident memory in the worker thread's arena (figures in
``tools/bench/results/frontend.md``). So the threshold
is fixed (big buffers always mapped, hence always returned; small requests never allocate
that much), and the heap is trimmed after a big tokenizing job (``offload``). The engine
core keeps its freed memory on purpose (``engine/process.py``); this is the HTTP process.
No-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

#: mallopt's parameter; buffers from this size on are mapped (glibc's default is 128 KiB,
#: raised by itself up to 32 MiB as big buffers are freed).
_M_MMAP_THRESHOLD = -3
BIG_BUFFER = 1 << 20


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


_LIBC = _libc()


def map_big_buffers() -> bool:
    """Serve allocations of :data:`BIG_BUFFER` and more by ``mmap``, always."""
    return _LIBC is not None and bool(_LIBC.mallopt(_M_MMAP_THRESHOLD, BIG_BUFFER))


def trim() -> None:
    """Give free heap memory back, every thread's arena (ctypes releases the GIL for it; the
    cost grows with what the work left behind)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)

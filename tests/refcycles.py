"""Tests that an object is freed by reference counting alone: with the cyclic collector off,
garbage in a reference cycle stays, so a weak reference to it stays alive."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cyclic_collector_off() -> Iterator[None]:
    """No automatic collection in the block (garbage from before it is collected first)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

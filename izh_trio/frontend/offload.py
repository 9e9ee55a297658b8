"""Big inputs' tokenizing, rendering and decoding, off the event loop.

A big prompt takes the tokenizer seconds, and on the event loop every other request,
``/health`` included, would wait. Work on a big input runs in a worker thread instead,
at most :data:`WORKER_THREADS` at a time (a queue, not a thread per request: the work is
CPU-bound, and this machine has few cores to share with the engine). The tokenizer releases
the GIL while it encodes or decodes a batch (``ModelTokenizer`` uses the batch calls for
long texts), so the loop runs meanwhile; Python work (template rendering) does not release
it but is cut into slices by the interpreter's switch interval, and is bounded by the size
checks made first (``prompt_size``).

Small inputs stay inline: a thread hop costs more than tokenizing a short chat prompt, and
the server is judged on its CPU per request (``tools/bench/results/frontend.md``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

from izh_trio.frontend import heap

T = TypeVar("T")

#: Work on more than this many characters (or :func:`size_of` units) goes to a worker: where
#: the hop costs a small share of the work.
INLINE_CHARS = 4096
#: Worker threads for big inputs, all routes together.
WORKER_THREADS = 2
#: After work that took this long (seconds) the heap is trimmed (``heap``): the trim then
#: costs a few percent of the work.
TRIM_AFTER = 0.02
#: What :func:`size_of` counts for each value in a list or an object besides its text: the
#: Python work of validating, escaping and rendering one item.
_ITEM_COST = 16


class Offload:
    """Runs work inline when it is small, else in a worker thread behind a shared limit."""

    def __init__(self, threads: int = WORKER_THREADS) -> None:
        self.limiter = trio.CapacityLimiter(threads)

    async def run(self, work: Callable[[], T], *, size: int) -> T:
        """``work()``, inline if ``size`` is at most :data:`INLINE_CHARS`, else in a worker
        (waiting for one is cancellable; a started one is waited for, so the limit holds)."""
        if size <= INLINE_CHARS:
            return work()
        # The outcome comes back in a box the worker's frames do not keep: returned or raised
        # through trio's worker, a failure's traceback would reach that frame, which holds
        # the outcome, which holds the failure: a reference cycle holding the request (its
        # body, its text) until the cyclic collector runs, which here is rarely.
        box: list[outcome.Outcome[T]] = []

        def job() -> None:
            start = time.perf_counter()
            box.append(outcome.capture(work))
            # Long work left much garbage (the tokenizer's, resident in this thread's arena).
            if time.perf_counter() - start >= TRIM_AFTER:
                heap.trim()

        await trio.to_thread.run_sync(job, limiter=self.limiter)
        return box.pop().unwrap()


def size_of(value: Any, cap: int = INLINE_CHARS) -> int:
    """The text and items in a JSON value, counted until the count passes ``cap`` (so the
    count costs no more than small work would): enough to tell small from big."""
    total = 0
    stack = [value]
    while stack and total <= cap:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            total += _ITEM_COST * len(item)
            if total <= cap:  # (a million items are not copied only to be counted)
                stack.extend(item.keys())
                stack.extend(item.values())
        elif isinstance(item, list | tuple):
            total += _ITEM_COST * len(item)
            if total <= cap:
                stack.extend(item)
        else:
            total += 1
    return total

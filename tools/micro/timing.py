"""The one timing rule of the micro-benchmarks: best of interleaved rounds."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

MS, US = 1e3, 1e6  # ``unit``: per-call time in milliseconds, microseconds


def best_of(fns: Mapping[str, Callable[[], object]], iters: int | Mapping[str, int],
            rounds: int, unit: float = US) -> dict[str, float]:
    """Each function's best round of ``iters`` calls, as time per call in ``unit``.

    One warm-up call each first (a kernel's compile, first-touch memory); then the rounds
    take the functions in turn, so a machine that slows down mid-run slows them all alike.
    """
    counts = iters if isinstance(iters, Mapping) else dict.fromkeys(fns, iters)
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(counts[name]):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / counts[name] * unit)
    return best

"""The generations open now, so that a drain can fail whatever is left of them."""

from __future__ import annotations

from typing import Protocol


class Abortable(Protocol):
    def abort(self, reason: str) -> None: ...


class Registry:
    def __init__(self) -> None:
        self._open: set[Abortable] = set()

    def add(self, generation: Abortable) -> None:
        self._open.add(generation)

    def discard(self, generation: Abortable) -> None:
        self._open.discard(generation)

    def abort_all(self, reason: str) -> None:
        for generation in list(self._open):
            generation.abort(reason)

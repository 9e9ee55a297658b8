"""Stop strings, found in the detokenized text as it grows.

Text that might be the start of a stop string is held back (up to the longest stop string
minus one character), so a streamed response never shows half of a stop string that is then
taken back. A match ends the choice at once: the route aborts its engine request.
"""

from __future__ import annotations


class StopChecker:
    def __init__(self, stops: tuple[str, ...], include_stop_str: bool = False) -> None:
        self.stops = tuple(s for s in stops if s)
        self.include = include_stop_str
        self._holdback = 0 if include_stop_str else max((len(s) for s in self.stops), default=1) - 1
        self._text = ""
        self._emitted = 0
        #: The stop string that matched, once one has.
        self.matched: str | None = None

    def push(self, piece: str, final: bool = False) -> str:
        """Add newly decoded text; return what may be shown now."""
        if self.matched is not None:
            return ""
        window = max(0, len(self._text) - max((len(s) for s in self.stops), default=0) + 1)
        self._text += piece
        best: tuple[int, str] | None = None
        for stop in self.stops:
            idx = self._text.find(stop, window)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is not None:
            idx, stop = best
            self.matched = stop
            end = idx + len(stop) if self.include else idx
            return self._take(end)
        return self._take(len(self._text) if final else len(self._text) - self._holdback)

    def _take(self, end: int) -> str:
        end = max(end, self._emitted)
        out = self._text[self._emitted : end]
        self._emitted = end
        return out

"""Stop strings, found in the detokenized text as it grows.

Text that might be the start of a stop string is held back (up to the longest stop string
minus one character), so a streamed response never shows half of a stop string that is then
taken back. A match ends the choice at once: the route aborts its engine request.

Only the text a future match could still touch is kept: what is held back, and the last
``longest - 1`` characters before it. Keeping all of it made every push copy the whole text
so far, quadratic in a long answer's length.
"""

from __future__ import annotations


class StopChecker:
    def __init__(self, stops: tuple[str, ...], include_stop_str: bool = False) -> None:
        self.stops = tuple(s for s in stops if s)
        self.include = include_stop_str
        self._longest = max((len(s) for s in self.stops), default=0)
        self._holdback = 0 if include_stop_str else max(self._longest - 1, 0)
        self._text = ""  # the text's tail: every character a match can still start at
        self._emitted = 0  # how much of _text has been shown
        #: The stop string that matched, once one has.
        self.matched: str | None = None

    def push(self, piece: str, final: bool = False) -> str:
        """Add newly decoded text; return what may be shown now."""
        if self.matched is not None:
            return ""
        if not self.stops:
            return piece
        # A match not found before ends in the new piece: it starts at most longest-1 back.
        window = max(0, len(self._text) - self._longest + 1)
        self._text += piece
        best: tuple[int, str] | None = None
        for stop in self.stops:
            idx = self._text.find(stop, window)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is not None:
            idx, stop = best
            self.matched = stop
            return self._take(idx + len(stop) if self.include else idx)
        out = self._take(len(self._text) if final else len(self._text) - self._holdback)
        # Drop what is shown and out of reach of any later match (the next window's start).
        cut = min(self._emitted, len(self._text) - self._longest + 1)
        if cut > 0:
            self._text = self._text[cut:]
            self._emitted -= cut
        return out

    def _take(self, end: int) -> str:
        end = max(end, self._emitted)
        out = self._text[self._emitted : end]
        self._emitted = end
        return out

"""Typed ``tuple`` converters for attrs fields.

mypy's attrs plugin reads a field's ``__init__`` type from its converter, and the bare generic
``converter=tuple`` names no element type; these do. At run time each one *is* the builtin:
``RequestOutput`` and ``TokenLogprobs`` are built per token, where a wrapper would cost a call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    def ints(values: Iterable[int], /) -> tuple[int, ...]: ...

    def floats(values: Iterable[float], /) -> tuple[float, ...]: ...

    def strs(values: Iterable[str], /) -> tuple[str, ...]: ...
else:
    ints = floats = strs = tuple

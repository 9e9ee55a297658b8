"""Cursor pagination of a response's input items, as OpenAI's list endpoints page:
``after`` / ``before`` (item ids), ``limit`` 1-100 (default 20), ``order`` asc or desc
(default desc, newest first)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

Order = Literal["asc", "desc"]
DEFAULT_LIMIT = 20
MAX_LIMIT = 100


class PageError(ValueError):
    """A bad page request (limit out of range, unknown order or cursor): a 400 naming
    ``param``."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@attrs.frozen
class ItemPage:
    data: tuple[dict[str, Any], ...]
    has_more: bool

    @property
    def first_id(self) -> str | None:
        return self.data[0].get("id") if self.data else None

    @property
    def last_id(self) -> str | None:
        return self.data[-1].get("id") if self.data else None

    def to_json(self) -> dict[str, Any]:
        return {"object": "list", "data": list(self.data), "first_id": self.first_id,
                "last_id": self.last_id, "has_more": self.has_more}


def _index(items: Sequence[Mapping[str, Any]], item_id: str, param: str) -> int:
    for i, item in enumerate(items):
        if item.get("id") == item_id:
            return i
    raise PageError(param, f"no input item with id {item_id!r}")


def page_items(
    items: Sequence[Mapping[str, Any]], *, after: str | None = None,
    before: str | None = None, limit: int = DEFAULT_LIMIT, order: str = "desc",
) -> ItemPage:
    """One page of ``items`` (given oldest first): those strictly after ``after`` and strictly
    before ``before`` in the chosen order, at most ``limit`` of them."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise PageError("limit", f"limit must be an integer from 1 to {MAX_LIMIT}")
    if order not in ("asc", "desc"):
        raise PageError("order", "order must be 'asc' or 'desc'")
    ordered = list(items) if order == "asc" else list(reversed(items))
    start = _index(ordered, after, "after") + 1 if after is not None else 0
    stop = _index(ordered, before, "before") if before is not None else len(ordered)
    window = ordered[start:max(start, stop)]
    return ItemPage(data=tuple(dict(item) for item in window[:limit]),
                    has_more=len(window) > limit)

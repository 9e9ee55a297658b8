"""Validators the request schemas share (attrs ``validator=``): a 400 naming the field when a
client sets what this server cannot honour."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs


def refused(why: str) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """Fields that would change the answer and that this server cannot honour: a 400 when set
    (null is the same as leaving them out)."""

    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            raise ValueError(f"'{attr.name}' is not supported: {why}")

    return check


def only_one(why: str) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """A count (``n``) an API answers with one of its own objects: 1, or a 400 saying why."""

    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value != 1:
            raise ValueError(f"'{attr.name}' {why}")

    return check

"""What a metric name may begin with (``--metrics-prefix``), checked where settings are."""

from __future__ import annotations


def prefix_is_valid(prefix: str) -> bool:
    """A Prometheus name's first part: ASCII letters, digits and underscores, no digit first."""
    return bool(prefix) and not prefix[0].isdigit() and all(
        c.isascii() and (c.isalnum() or c == "_") for c in prefix)

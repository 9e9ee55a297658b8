"""Per-key token budgets: a token bucket counted in tokens (prompt + max_tokens).

Each key may spend ``tokens_per_minute`` per minute, with a burst of one minute's worth;
the bucket refills continuously. A request is charged up front, before admission, so a
rejected one costs nothing; the 429 says how long until enough tokens have refilled.
"""

from __future__ import annotations

import math

import attrs
import trio

from izh_trio.frontend.errors import APIError


@attrs.define
class TokenBucket:
    capacity: float
    rate: float  # tokens per second
    tokens: float
    updated: float

    def take(self, cost: float, now: float) -> float:
        """Spend ``cost`` and return 0, or return the seconds until it could be spent."""
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if cost <= self.tokens:
            self.tokens -= cost
            return 0.0
        return (cost - self.tokens) / self.rate


class RateLimiter:
    def __init__(self, tokens_per_minute: int) -> None:
        self.tokens_per_minute = tokens_per_minute  # 0: no limit
        self._buckets: dict[str, TokenBucket] = {}

    def charge(self, key: str, cost: int) -> None:
        """Take ``cost`` tokens from ``key``'s bucket or raise a 429 with Retry-After."""
        if not self.tokens_per_minute:
            return
        budget = self.tokens_per_minute
        if cost > budget:
            raise APIError(429, f"this request needs {cost} tokens (prompt + max_tokens), "
                                f"more than the {budget} tokens per minute this key may use",
                           code="rate_limit_exceeded")
        now = trio.current_time()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(budget, budget / 60.0, budget, now)
        wait = bucket.take(cost, now)
        if wait:
            retry = max(1, math.ceil(wait))
            raise APIError(429, f"rate limit of {budget} tokens per minute reached; retry in "
                                f"{retry} s", code="rate_limit_exceeded",
                           headers={"Retry-After": str(retry)})

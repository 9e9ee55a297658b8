"""Token budgets on trio's virtual clock: refill, Retry-After, isolation between keys."""

from __future__ import annotations

import pytest
import trio

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.limits import RateLimiter


async def test_bucket_refills_at_the_minute_rate(autojump_clock: trio.testing.MockClock
                                                 ) -> None:
    limiter = RateLimiter(tokens_per_minute=600)  # 10 tokens/s, burst 600
    limiter.charge("k", 600)
    with pytest.raises(APIError) as err:
        limiter.charge("k", 100)
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "10"
    await trio.sleep(9.5)
    with pytest.raises(APIError) as err:
        limiter.charge("k", 100)
    assert err.value.headers["Retry-After"] == "1"  # 5 tokens short: rounded up to 1 s
    await trio.sleep(0.5)
    limiter.charge("k", 100)
    limiter.charge("other", 600)  # every key has its own bucket


async def test_bursts_never_exceed_one_minute(autojump_clock: trio.testing.MockClock) -> None:
    limiter = RateLimiter(tokens_per_minute=600)
    await trio.sleep(3600)  # an idle hour does not bank more than a minute's budget
    limiter.charge("k", 600)
    with pytest.raises(APIError):
        limiter.charge("k", 1)


def test_a_request_larger_than_the_budget_never_fits() -> None:
    with pytest.raises(APIError) as err:
        RateLimiter(tokens_per_minute=100).charge("k", 101)
    assert err.value.status == 429 and "Retry-After" not in err.value.headers


def test_zero_means_unlimited() -> None:
    RateLimiter(tokens_per_minute=0).charge("k", 10**9)

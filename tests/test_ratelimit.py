"""Per-client request and character limits (token buckets), on a clock the test moves."""

from __future__ import annotations

import pytest

from service.ratelimit import OverCharLimit, RateLimited, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_client_gets_its_allowance_back_as_time_passes() -> None:
    clock = Clock()
    limiter = RateLimiter(requests_per_minute=3, chars_per_minute=0, clock=clock)
    for _ in range(3):
        limiter.take("a", 10)
    with pytest.raises(RateLimited) as refused:
        limiter.take("a", 10)
    assert refused.value.retry_after == 20  # one request refills in 60 / 3 s
    limiter.take("b", 10)  # another client is counted apart
    clock.now += 20
    limiter.take("a", 10)
    with pytest.raises(RateLimited):
        limiter.take("a", 10)


def test_characters_are_counted_and_a_refused_request_takes_nothing() -> None:
    clock = Clock()
    limiter = RateLimiter(requests_per_minute=10, chars_per_minute=600, clock=clock)
    limiter.take("a", 500)
    with pytest.raises(RateLimited) as refused:
        limiter.take("a", 200)  # 100 short: 10 s at 10 characters a second
    assert (refused.value.retry_after, refused.value.limit) == (10, "CHARS_PER_MINUTE")
    clock.now += 10
    limiter.take("a", 200)  # the refusal took no request and no characters
    with pytest.raises(OverCharLimit):
        limiter.take("a", 601)  # could never pass


def test_off_by_default_and_idle_clients_are_forgotten() -> None:
    RateLimiter(0, 0).take("a", 10**9)
    clock = Clock()
    limiter = RateLimiter(requests_per_minute=1, chars_per_minute=0, clock=clock)
    limiter._prune(clock.now)
    limiter.take("a", 1)
    clock.now += 61
    limiter._prune(clock.now)
    assert limiter._clients == {}

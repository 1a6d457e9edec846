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


def test_a_throttled_address_keeps_serving_the_keys_that_were_right_from_it() -> None:
    from service.ratelimit import KNOWN_KEY_S, KNOWN_KEYS_PER_ADDRESS, FailedKeys

    clock = Clock()
    failed = FailedKeys(per_minute=2, clock=clock)
    failed.succeeded("10.0.0.1", "right")
    for _ in range(2):
        assert failed.wait("10.0.0.1", "guess") == 0
        failed.failed("10.0.0.1")
    assert failed.wait("10.0.0.1", "guess") == 30  # one failure refills in 60 / 2 s
    assert failed.wait("10.0.0.1", "") == 30
    assert failed.wait("10.0.0.1", "right") == 0
    assert failed.wait("10.0.0.2", "guess") == 0  # another address is not throttled
    # Right long ago, or pushed out by the address's newer right keys: throttled like a guess.
    for number in range(KNOWN_KEYS_PER_ADDRESS):
        failed.succeeded("10.0.0.1", f"key{number}")
    assert failed.wait("10.0.0.1", "right") > 0
    assert failed.wait("10.0.0.1", "key0") == 0
    clock.now += KNOWN_KEY_S
    failed.failed("10.0.0.1")
    failed.failed("10.0.0.1")
    assert failed.wait("10.0.0.1", "key0") > 0


def test_a_forwarded_address_is_believed_only_from_a_trusted_proxy(tmp_path) -> None:
    """Rotating X-Forwarded-For from loopback escaped the wrong-key throttle: without
    TRUSTED_PROXIES the address is the connection's; with it, the proxy's word counts."""
    import httpx

    from tests.test_server import fake_server

    def guess(url: str, forwarded_for: str) -> int:
        return httpx.post(url + "/translate", json={"text": "a"}, headers={
            "Authorization": "Bearer guess", "X-Forwarded-For": forwarded_for}).status_code

    env = {"API_KEYS": "right", "FAILED_KEYS_PER_MINUTE": "2"}
    with fake_server(tmp_path / "direct", env=env) as server:
        assert [guess(server.url, f"10.0.0.{n}") for n in range(3)] == [401, 401, 429]
    with fake_server(tmp_path / "proxied", env={**env, "TRUSTED_PROXIES": "127.0.0.1"},
                     ) as server:
        assert [guess(server.url, "10.0.0.1") for _ in range(3)] == [401, 401, 429]
        assert guess(server.url, "10.0.0.2") == 401  # another client behind the proxy

"""Per-client limits on requests and characters per minute, as token buckets.

Each client (an API key, or the client's address when the service has no keys) has two
buckets that hold a minute's allowance and refill continuously: a request takes one token from
the first and its characters from the second, or neither when either falls short, and then the
client is told exactly when the shortfall will have refilled (Retry-After). A moving window, as
the ``limits`` package keeps it, stores one timestamp per unit taken: 10,000 per request for a
character limit; a bucket is two floats and a time.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# Buckets of clients idle for a minute are full again and carry no state: past this many
# clients, those are dropped so that a stream of new addresses cannot grow the table forever.
_PRUNE_ABOVE = 10_000


def _seconds(short: float, per_minute: int) -> int:
    """Whole seconds (at least one) until a bucket refilling ``per_minute`` gains ``short``."""
    return max(1, math.ceil(short * 60 / per_minute))


class RateLimited(Exception):
    def __init__(self, retry_after: int, limit: str) -> None:
        super().__init__(f"rate limit {limit} exceeded; retry in {retry_after}s")
        self.retry_after = retry_after
        self.limit = limit


class OverCharLimit(Exception):
    """A request with more characters than the client may send in a minute: never allowed."""

    def __init__(self, chars: int, limit: int) -> None:
        super().__init__(f"{chars} characters; at most {limit} per minute")
        self.chars = chars
        self.limit = limit


@dataclass
class _Buckets:
    requests: float
    chars: float
    at: float


class RateLimiter:
    """``requests_per_minute`` and ``chars_per_minute`` per client; 0 turns a limit off."""

    def __init__(
        self,
        requests_per_minute: int,
        chars_per_minute: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.requests_per_minute = requests_per_minute
        self.chars_per_minute = chars_per_minute
        self._clock = clock
        self._clients: dict[str, _Buckets] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.requests_per_minute or self.chars_per_minute)

    def take(self, client: str, chars: int) -> None:
        """Count one request of ``chars`` characters, or raise RateLimited (taking nothing)
        or OverCharLimit."""
        if not self.enabled:
            return
        request_cap, char_cap = self.requests_per_minute, self.chars_per_minute
        if char_cap and chars > char_cap:
            raise OverCharLimit(chars, char_cap)
        now = self._clock()
        buckets = self._clients.get(client)
        if buckets is None:
            if len(self._clients) >= _PRUNE_ABOVE:
                self._prune(now)
            buckets = self._clients[client] = _Buckets(request_cap, char_cap, now)
        self._refill(buckets, now)
        waits = []  # seconds until each short bucket holds enough
        if request_cap and buckets.requests < 1:
            waits.append((_seconds(1 - buckets.requests, request_cap), "REQUESTS_PER_MINUTE"))
        if char_cap and buckets.chars < chars:
            waits.append((_seconds(chars - buckets.chars, char_cap), "CHARS_PER_MINUTE"))
        if waits:
            wait, limit = max(waits)
            raise RateLimited(wait, limit)
        if request_cap:
            buckets.requests -= 1
        if char_cap:
            buckets.chars -= chars

    def wait(self, client: str) -> int:
        """Seconds until ``client`` may send one more request (0: now), taking nothing."""
        buckets = self._clients.get(client)
        if not self.requests_per_minute or buckets is None:
            return 0
        self._refill(buckets, self._clock())
        if buckets.requests >= 1:
            return 0
        return _seconds(1 - buckets.requests, self.requests_per_minute)

    def _refill(self, buckets: _Buckets, now: float) -> None:
        """What a minute's allowance gave back since the buckets were last looked at."""
        minutes = (now - buckets.at) / 60
        buckets.requests = min(self.requests_per_minute,
                               buckets.requests + minutes * self.requests_per_minute)
        buckets.chars = min(self.chars_per_minute,
                            buckets.chars + minutes * self.chars_per_minute)
        buckets.at = now

    def _prune(self, now: float) -> None:
        self._clients = {
            client: buckets for client, buckets in self._clients.items() if now - buckets.at < 60
        }


class Usage:
    """Characters translated per client since the process started: DeepL's ``/v2/usage``
    reports them, and ``USAGE_LIMIT_CHARS`` caps them."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, client: str) -> int:
        with self._lock:
            return self._counts.get(client, 0)

    def add(self, client: str, characters: int) -> None:
        with self._lock:
            self._counts[client] = self._counts.get(client, 0) + characters

"""Per-client limits on requests and characters per minute, as token buckets.

Each client (an API key, or the client's address when the service has no keys) has two
buckets that hold a minute's allowance and refill continuously: a request takes one token from
the first and its characters from the second, or neither when either falls short, and then the
client is told exactly when the shortfall will have refilled (Retry-After). A moving window, as
the ``limits`` package keeps it, stores one timestamp per unit taken: 10,000 per request for a
character limit; a bucket is two floats and a time.

``Limits`` keeps the buckets where the service's state is (``service.shared_state``): with a
shared store, in Redis, taken by one script run on the server (refill, check and take at once,
by the server's clock), so a client's allowance is exact however many replicas it reaches;
while the store is down, in the process. An API key may carry its own limits (``Caps``).
``Usage`` counts characters per client, likewise shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from service.shared_state import PREFIX, StateStore, StoreDown, digest

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


@dataclass(frozen=True)
class Caps:
    """A client's allowance per minute; 0 turns a limit off."""

    requests_per_minute: int = 0
    chars_per_minute: int = 0

    @property
    def enabled(self) -> bool:
        return bool(self.requests_per_minute or self.chars_per_minute)


@dataclass
class _Buckets:
    requests: float
    chars: float
    at: float


class RateLimiter:
    """``requests_per_minute`` and ``chars_per_minute`` per client (0 turns a limit off), in
    this process; ``take`` may name other caps for a client (an API key's own)."""

    def __init__(
        self,
        requests_per_minute: int,
        chars_per_minute: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.caps = Caps(requests_per_minute, chars_per_minute)
        self._clock = clock
        self._clients: dict[str, _Buckets] = {}

    @property
    def enabled(self) -> bool:
        return self.caps.enabled

    def take(self, client: str, chars: int, caps: Caps | None = None) -> None:
        """Count one request of ``chars`` characters, or raise RateLimited (taking nothing)
        or OverCharLimit."""
        caps = caps or self.caps
        if not caps.enabled:
            return
        request_cap, char_cap = caps.requests_per_minute, caps.chars_per_minute
        check_size(chars, caps)
        now = self._clock()
        buckets = self._clients.get(client)
        if buckets is None:
            if len(self._clients) >= _PRUNE_ABOVE:
                self._prune(now)
            buckets = self._clients[client] = _Buckets(request_cap, char_cap, now)
        _refill(buckets, now, caps)
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
        if not self.caps.requests_per_minute or buckets is None:
            return 0
        _refill(buckets, self._clock(), self.caps)
        if buckets.requests >= 1:
            return 0
        return _seconds(1 - buckets.requests, self.caps.requests_per_minute)

    def _prune(self, now: float) -> None:
        self._clients = {
            client: buckets for client, buckets in self._clients.items() if now - buckets.at < 60
        }



# How long a key that was right from an address keeps passing while that address is
# throttled, and how many such keys one address keeps (a shared proxy's clients).
KNOWN_KEY_S = 600.0
KNOWN_KEYS_PER_ADDRESS = 32


class FailedKeys:
    """Wrong or missing API keys counted per client address: past ``per_minute`` the address
    gets 429 (``wait``) for every key but those that were right from it within KNOWN_KEY_S,
    which go on being served. So a guesser behind a shared proxy or NAT slows down its own
    guesses, and does not lock out the clients beside it whose keys were working; a key that
    was never right from there is not compared while the address is throttled, so the
    guesser learns nothing from its 429s."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._failures = RateLimiter(per_minute, 0, clock)
        self._clock = clock
        self._known: dict[str, dict[str, float]] = {}  # address -> {key's digest: last right}

    def wait(self, address: str, key: str) -> int:
        """Seconds until ``address`` may have ``key`` compared (0: now)."""
        wait = self._failures.wait(address)
        if not wait:
            return 0
        known = self._known.get(address, {})
        right_at = known.get(digest(key)) if key else None
        return 0 if right_at is not None and self._clock() - right_at < KNOWN_KEY_S else wait

    def failed(self, address: str) -> None:
        """Count a wrong or missing key from ``address``."""
        with contextlib.suppress(RateLimited):  # the caller answers what the failure was
            self._failures.take(address, 0)

    def succeeded(self, address: str, key: str) -> None:
        """Remember that ``key`` was right from ``address``."""
        if not self._failures.enabled:
            return
        now = self._clock()
        if address not in self._known and len(self._known) >= _PRUNE_ABOVE:
            self._known = {a: keys for a, keys in self._known.items()
                           if now - max(keys.values()) < KNOWN_KEY_S}
        known = self._known.setdefault(address, {})
        known.pop(key_digest := digest(key), None)
        known[key_digest] = now  # the most recent last: the oldest goes first
        if len(known) > KNOWN_KEYS_PER_ADDRESS:
            del known[next(iter(known))]

def check_size(chars: int, caps: Caps) -> None:
    """A request larger than a minute's characters is never allowed: OverCharLimit."""
    if caps.chars_per_minute and chars > caps.chars_per_minute:
        raise OverCharLimit(chars, caps.chars_per_minute)


def _refill(buckets: _Buckets, now: float, caps: Caps) -> None:
    """What a minute's allowance gave back since the buckets were last looked at."""
    minutes = (now - buckets.at) / 60
    buckets.requests = min(caps.requests_per_minute,
                           buckets.requests + minutes * caps.requests_per_minute)
    buckets.chars = min(caps.chars_per_minute, buckets.chars + minutes * caps.chars_per_minute)
    buckets.at = now


# The two buckets of RateLimiter, on the server: refilled by the server's clock, checked and
# taken in one step. Returns {0, 0} when taken, else {seconds to wait, 1 (requests) or 2
# (characters)}. Buckets of a client idle for two minutes are full again: they expire.
_TAKE = """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1e6
local rcap, ccap, chars = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local held = redis.call('HMGET', KEYS[1], 'r', 'c', 'at')
local r, c = tonumber(held[1]) or rcap, tonumber(held[2]) or ccap
local minutes = math.max(0, now - (tonumber(held[3]) or now)) / 60
r = math.min(rcap, r + minutes * rcap)
c = math.min(ccap, c + minutes * ccap)
local wait_r, wait_c = 0, 0
if rcap > 0 and r < 1 then wait_r = math.max(1, math.ceil((1 - r) * 60 / rcap)) end
if ccap > 0 and c < chars then wait_c = math.max(1, math.ceil((chars - c) * 60 / ccap)) end
local answer = {0, 0}
if wait_r > 0 or wait_c > 0 then
  if wait_r >= wait_c then answer = {wait_r, 1} else answer = {wait_c, 2} end
else
  if rcap > 0 then r = r - 1 end
  if ccap > 0 then c = c - chars end
end
redis.call('HSET', KEYS[1], 'r', tostring(r), 'c', tostring(c), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], 120)
return answer
"""
_LIMIT_NAMES = {1: "REQUESTS_PER_MINUTE", 2: "CHARS_PER_MINUTE"}


class Limits:
    """Per-client limits where the service's state is: the shared store's buckets, else (and
    while the store is down) this process's."""

    def __init__(self, local: RateLimiter, store: StateStore | None = None) -> None:
        self.local = local
        self.store = store

    @property
    def caps(self) -> Caps:
        return self.local.caps

    async def take(self, client: str, chars: int, caps: Caps | None = None) -> None:
        """As ``RateLimiter.take``, across every replica when the store is shared."""
        caps = caps or self.local.caps
        if not caps.enabled:
            return
        check_size(chars, caps)
        if self.store is not None:
            try:
                wait, limit = await self.store.script(
                    _TAKE, [f"{PREFIX}rate:{client}"],
                    [caps.requests_per_minute, caps.chars_per_minute, chars])
            except StoreDown:
                pass  # this process's buckets meanwhile
            else:
                if wait:
                    raise RateLimited(int(wait), _LIMIT_NAMES[int(limit)])
                return
        self.local.take(client, chars, caps)


class Usage:
    """Characters translated per client: DeepL's ``/v2/usage`` reports them, and
    ``USAGE_LIMIT_CHARS`` caps them. Counted in the process since it started, or with a
    shared store in Redis for good: the counts of every request within ``FLUSH_S`` go there
    in one round trip (a reader of the count writes what is pending first), and what is
    counted while the store is down is added once it is back."""

    FLUSH_S = 0.2

    def __init__(self, store: StateStore | None = None) -> None:
        self._counts: dict[str, int] = {}
        self._pending: dict[str, int] = {}  # counted, not yet in the store
        self._lock = threading.Lock()
        self.store = store
        self._flushing: asyncio.Task[None] | None = None

    async def count(self, client: str) -> int:
        if self.store is not None:
            try:
                await self._flush()
                return int(await self.store.command("HGET", f"{PREFIX}usage", client) or 0)
            except StoreDown:
                pass
        with self._lock:
            return self._counts.get(client, 0)

    async def add(self, client: str, characters: int) -> None:
        with self._lock:
            self._counts[client] = self._counts.get(client, 0) + characters
            if self.store is not None:
                self._pending[client] = self._pending.get(client, 0) + characters
        if self.store is not None and self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        """The pending counts written after FLUSH_S; while the store is down, retried each
        second."""
        try:
            while True:
                await asyncio.sleep(self.FLUSH_S)
                try:
                    await self._flush()
                    return
                except StoreDown:
                    await asyncio.sleep(1)
        finally:
            self._flushing = None

    async def close(self) -> None:
        """What is pending written now (at shutdown), if the store answers."""
        if self._flushing is not None:
            self._flushing.cancel()
        if self.store is not None:
            with contextlib.suppress(StoreDown):
                await self._flush()

    async def _flush(self) -> None:
        """The counts not yet in the store, added in one round trip (the store's pipeline of
        one event-loop turn)."""
        assert self.store is not None
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return
        added = await asyncio.gather(
            *(self.store.command("HINCRBY", f"{PREFIX}usage", client, characters)
              for client, characters in pending.items()), return_exceptions=True)
        failed = [(client, characters, outcome) for (client, characters), outcome
                  in zip(pending.items(), added, strict=True) if isinstance(outcome, Exception)]
        if failed:
            with self._lock:  # kept for the next try
                for client, characters, _ in failed:
                    self._pending[client] = self._pending.get(client, 0) + characters
            raise failed[0][2]
